"""What a careless or hostile user tried on the CLI (issue 41), one case per
numbered item of that issue, each run as its own CTest test:

    guard_check.py POSEMBED_EXE TEXT_DIR WORK_DIR CASE

Each case checks the exit status and the message, and that no file is lost or
left behind. Standard library only: any python3.
"""
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time

EXE = TEXT = WORK = ""
# A tiny model: a step takes milliseconds.
TINY = ["--n-layer", "1", "--n-head", "1", "--embed-dim", "16", "--max-seq-len", "16",
        "--batch-size", "2", "--micro-batch", "1", "--threads", "1"]


def fail(why, out=""):
    sys.exit(f"FAIL: {why}\n{out}")


def run(*args, cwd=None, timeout=120):
    """Runs posembed; returns (status, stdout + stderr). A hang fails the test."""
    try:
        p = subprocess.run([EXE, *args], cwd=cwd or WORK, capture_output=True, text=True, errors="replace",
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"posembed {' '.join(args)} still running after {timeout} s (blocked?)")
    return p.returncode, p.stdout + p.stderr


def expect(status, pattern, *args, cwd=None):
    rc, out = run(*args, cwd=cwd)
    if rc != status or pattern not in out:
        fail(f"posembed {' '.join(args)}: status {rc}, want {status} and '{pattern}'", out)
    print(f"ok: {' '.join(args)[:70]} -> {status}: "
          f"{next((l for l in out.splitlines() if pattern in l), '')[:160]}")
    return out


def train(out, *extra, cwd=None):
    expect(0, "checkpoint", "train", "--data", TEXT, "--out", out, *TINY, *extra, cwd=cwd)
    return os.path.join(WORK if cwd is None else cwd, out, "ckpt.safetensors")


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def poison(src, dst, tensor):
    """A copy of checkpoint src with a NaN as the first value of `tensor`."""
    n, h = header(src)
    data = bytearray(open(src, "rb").read())
    begin = 8 + n + h[tensor]["data_offsets"][0]
    data[begin:begin + 4] = struct.pack("<f", float("nan"))
    open(dst, "wb").write(bytes(data))


def with_metadata(src, dst, **meta):
    n, h = header(src)
    h["__metadata__"].update(meta)
    text = json.dumps(h).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    data = open(src, "rb").read()[8 + n:]
    open(dst, "wb").write(struct.pack("<Q", len(text)) + text + data)


def case_1():
    """Two runs in one folder: the second fails at once naming the first's pid;
    a dead run's temporary files go when the folder is next locked."""
    out = os.path.join(WORK, "locked")
    p = subprocess.Popen([EXE, "train", "--data", TEXT, "--out", out, *TINY, "--steps",
                          "100000000", "--eval-every", "100000000", "--checkpoint-every", "50"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in p.stdout:
            if line.startswith("training:"):
                break
        time.sleep(1)  # a checkpoint or two written
        for extra in ([], ["--overwrite"]):
            expect(1, f"locked is in use by another run (pid {p.pid})", "train", "--data", TEXT,
                   "--out", out, *TINY, *extra)
        expect(1, f"in use by another run (pid {p.pid})", "train", "--resume",
               os.path.join(out, "ckpt.safetensors"), "--threads", "1")
    finally:
        p.kill()  # as SIGKILL in the middle of a checkpoint would leave them:
        p.wait()
    stale = [os.path.join(out, ".ckpt.safetensors.tmp-Ab12Cd"), os.path.join(out, "log.csv.tmp")]
    for f in stale:
        open(f, "w").close()
    expect(0, "stopped at step", "train", "--resume", os.path.join(out, "ckpt.safetensors"),
           "--threads", "1", "--stop-after", str(int(read_step(out)) + 1))
    left = [f for f in stale if os.path.exists(f)]
    if left:
        fail(f"stale temporary files left: {left}")
    print("ok: a dead run's temporary files deleted")


def read_step(out):
    return header(os.path.join(out, "ckpt.safetensors"))[1]["__metadata__"]["train.step"]


def case_3():
    """Divergence stops with status 1 and the last finite checkpoint intact;
    non-finite weights are refused on every load unless --allow-non-finite."""
    out = os.path.join(WORK, "diverged")
    shutil.rmtree(out, ignore_errors=True)
    expect(1, "step 2: training diverged (loss", "train", "--data", TEXT, "--out", out, *TINY,
           "--lr", "1e30", "--steps", "10", "--checkpoint-every", "1")
    ckpt = os.path.join(out, "ckpt.safetensors")
    if read_step(out) != "1":
        fail(f"the checkpoint is at step {read_step(out)}, want the last finite one, 1")
    expect(0, "validation split", "eval", ckpt)  # finite, loadable
    expect(1, "training diverged", "train", "--data", TEXT, "--out", out + "2", *TINY,
           "--position-init", "normal:1e40", "--steps", "3")
    expect(1, "eps = 1e-50 lies outside float's normal range", "train", "--data", TEXT,
           "--out", out + "3", *TINY, "--eps", "1e-50")
    good = train("finite", "--steps", "4")
    bad = os.path.join(WORK, "nan.safetensors")
    poison(good, bad, "wpe.weight")
    want = "tensor 'wpe.weight' holds 1 non-finite values"
    expect(1, want, "eval", bad)
    expect(1, want, "sample", bad, "--tokens", "2")
    expect(1, want, "resize", bad, "-o", os.path.join(WORK, "never.safetensors"),
           "--max-seq-len", "32")
    expect(1, want, "train", "--resume", bad, "--steps", "8", "--out",
           os.path.join(WORK, "from_nan"), "--threads", "1")
    expect(1, want, "train", "--init-from", bad, "--data", TEXT, "--out",
           os.path.join(WORK, "from_nan"), *TINY)
    expect(0, "", "sample", bad, "--tokens", "2", "--allow-non-finite")
    if os.path.exists(os.path.join(WORK, "never.safetensors")):
        fail("resize wrote a file from a refused checkpoint")


def case_4():
    """Numbers are read exactly in their type: no wrap, no clamp."""
    ckpt = train("numbers", "--steps", "2")
    expect(2, "--seed: -1 is not a whole number in [0, 18446744073709551615]", "sample", ckpt,
           "--seed", "-1")
    expect(2, "--seed: 18446744073709551616 is out of range", "sample", ckpt, "--seed",
           "18446744073709551616")
    expect(2, "--tokens: 99999999999999999999 is out of range", "sample", ckpt, "--tokens",
           "99999999999999999999")
    expect(2, "--seed: -1 is not a whole number", "train", "--seed", "-1", "--out",
           os.path.join(WORK, "never"))
    expect(2, "--lr: 1e999 is beyond a double's range", "train", "--lr", "1e999")
    # Decimal, not octal: 010 bytes are ten.
    rc, out = run("sample", ckpt, "--tokens", "010", "--prompt", "x", "--temperature", "0")
    if rc != 0 or len(out) != 1 + 10 + 1:
        fail(f"--tokens 010: status {rc}, {len(out)} bytes of output, want 12", out)
    print("ok: --tokens 010 generates 10 bytes")


def case_5():
    """Documented value rules enforced; --resume names the flags it ignores."""
    for v in ("0", "-5"):
        expect(1, f"--stop-after {v} must be >= 1", "train", "--stop-after", v, "--out",
               os.path.join(WORK, "never"))
    expect(1, "--micro-batch 0 must be >= 1", "plan", "--micro-batch", "0")
    expect(1, "--shape bogus is neither a shape's name", "bench", "--shape", "bogus")
    ckpt = train("ignored", "--steps", "4", "--stop-after", "2")
    expect(0, "note: --resume keeps the checkpoint's settings; ignored: --max-seq-len (kept: 16), "
           "--steps (kept: 4), --lr (kept: 0.003)", "train", "--resume", ckpt, "--steps", "9",
           "--lr", "1", "--max-seq-len", "64", "--threads", "1")


def case_6():
    """Sizes from flags, metadata and files are checked before allocating."""
    expect(1, "steps 1000000000000 keeps a loss for each of the 1000000000000 steps left: "
           "8000000000000 bytes, but only", "train", "--data", TEXT, "--out",
           os.path.join(WORK, "never"), *TINY, "--steps", "1000000000000")
    ckpt = train("huge_steps", "--steps", "2")
    huge = os.path.join(WORK, "huge_steps.safetensors")
    with_metadata(ckpt, huge, **{"train.steps": str(2**63 - 1)})
    expect(1, f"steps {2**63 - 1} keeps a loss for each of the {2**63 - 3} steps left: "
           f"{2**64 - 1} bytes, but only", "train", "--resume", huge, "--out",
           os.path.join(WORK, "never"), "--threads", "1")
    lying = os.path.join(WORK, "lying.safetensors")  # metadata: a model of 3.2e12 bytes
    with_metadata(ckpt, lying, **{"model.embed_dim": "65536", "model.n_layer": "1024",
                                  "model.n_head": "1"})
    for args in (["eval", lying], ["sample", lying], ["train", "--resume", lying, "--out",
                                                      os.path.join(WORK, "never")]):
        expect(1, "the metadata describes a model whose parameters take", *args)
    with_metadata(ckpt, lying, **{"train.step": "-5"})
    expect(1, "metadata train.step is -5, but a run's steps done are >= 0", "train", "--resume",
           lying, "--out", os.path.join(WORK, "never"))
    expect(1, "training data /dev/zero is neither a regular file nor a directory", "train",
           "--data", "/dev/zero", "--out", os.path.join(WORK, "never"), *TINY)
    # A sparse file holding a 2^28 x 16 table: 16 GiB on paper, nothing on disk.
    sparse = os.path.join(WORK, "sparse.safetensors")
    rows, cols = 2**28, 16
    h = json.dumps({"wpe.weight": {"dtype": "F32", "shape": [rows, cols],
                                   "data_offsets": [0, rows * cols * 4]}}).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(sparse, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + rows * cols * 4)
    expect(1, f"analyzing 'wpe.weight' ({rows} x {cols}) needs about {28 * rows * cols} bytes",
           "analyze", sparse, "--no-plots")
    expect(1, f"a table of {2**28 * 64} x 16 needs", "resize", sparse, "-o",
           os.path.join(WORK, "never.safetensors"), "--max-seq-len", str(2**28 * 64),
           "--method", "interpolate")
    os.remove(sparse)
    if os.path.exists(os.path.join(WORK, "never")):
        fail("a refused run left its folder")
    # A write past the file-size limit (ulimit -f): an error naming it, no temporary file left
    # (the limit's signal, SIGXFSZ, would have killed the process with its temporary file).
    limited = os.path.join(WORK, "limited")
    shutil.rmtree(limited, ignore_errors=True)
    os.makedirs(limited)
    source = train("fsize_source", "--steps", "1")
    p = subprocess.run([EXE, "resize", source, "--max-seq-len", "4096", "--method", "tile", "-o",
                        os.path.join(limited, "big.safetensors")], capture_output=True, text=True,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10)))
    if p.returncode != 1 or "File too large" not in p.stderr or os.listdir(limited):
        fail(f"resize past the file-size limit: status {p.returncode}, left {os.listdir(limited)}",
             p.stderr)
    # Output redirected into a file that the limit cuts short: an error, not success.
    with open(os.path.join(WORK, "cut.json"), "w") as out:
        p = subprocess.run([EXE, "inspect", source, "--json"], stdout=out, stderr=subprocess.PIPE,
                           text=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                            (1024, 1024)))
    if p.returncode != 1 or "writing the output failed: File too large" not in p.stderr:
        fail(f"inspect --json into a file past the size limit: status {p.returncode}", p.stderr)


def case_7():
    """A FIFO never blocks a command: refused before any read."""
    fifo = os.path.join(WORK, "fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    never = os.path.join(WORK, "never")
    want = "fifo is not a regular file (a FIFO, a device or a folder)"
    expect(1, "training data " + fifo + " is neither a regular file nor a directory", "train",
           "--data", fifo, "--out", never, *TINY)
    expect(1, want, "train", "--resume", fifo, "--out", never)
    expect(1, want, "train", "--init-from", fifo, "--out", never, "--data", TEXT)
    expect(1, want, "eval", fifo)
    expect(1, want, "sample", fifo)
    expect(1, want, "resize", fifo, "-o", never, "--max-seq-len", "8")
    expect(1, want, "analyze", fifo)
    expect(1, want, "inspect", fifo)


def case_8():
    expect(1, "--threads 100000 exceeds", "train", "--data", TEXT, "--out",
           os.path.join(WORK, "never"), "--threads", "100000")
    if os.path.exists(os.path.join(WORK, "never")):
        fail("a refused run left its folder")


def case_9():
    """A run that ended before its first checkpoint: the fix offered exists."""
    out = os.path.join(WORK, "no_checkpoint")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "log.csv"), "w") as f:
        f.write("step,lr,train_loss,val_loss,grad_norm,tokens_per_s,elapsed_s\n")
    text = expect(1, "holds the log.csv of a run that ended before its first checkpoint, so "
                  "there is nothing to resume; start afresh there with --overwrite", "train",
                  "--data", TEXT, "--out", out, *TINY)
    if "--resume" in text:
        fail("the message still suggests --resume", text)
    expect(0, "checkpoint", "train", "--data", TEXT, "--out", out, *TINY, "--steps", "2",
           "--overwrite")


def case_10():
    """--data is stored absolute: resume and eval work from any folder."""
    sub = os.path.join(WORK, "elsewhere")
    os.makedirs(sub, exist_ok=True)
    shutil.rmtree(os.path.join(sub, "text"), ignore_errors=True)
    shutil.copytree(TEXT, os.path.join(sub, "text"))
    shutil.rmtree(os.path.join(WORK, "relative"), ignore_errors=True)
    out = expect(0, "stopped at step 2", "train", "--data", "text", "--out", "../relative", *TINY,
                 "--steps", "4", "--stop-after", "2", cwd=sub)
    if "data: text," not in out:
        fail("the typed path is not what the run shows", out)
    expect(0, "checkpoint", "train", "--resume", "relative/ckpt.safetensors", "--threads", "1")
    expect(0, os.path.join(sub, "text") + ", validation split", "eval",
           "relative/ckpt.safetensors")


def case_11():
    """Too little text for the validation split: the message says which split."""
    text = os.path.join(WORK, "short.txt")
    with open(text, "w") as f:
        f.write(("the position table " * 2000)[:35149])
    expect(1, "has 35149 bytes, of which its validation split holds 0 (chunks of 4 KiB, "
           "--val-fraction 0.1 of them", "train", "--data", text, "--out",
           os.path.join(WORK, "never"), *TINY)


def case_12():
    expect(2, "error: 'bogus' is not a command; the commands are: config demo train", "bogus")
    expect(2, "A subcommand is required", )  # no word at all: CLI11's own message


def main():
    global EXE, TEXT, WORK
    EXE, TEXT, WORK, case = sys.argv[1:5]
    WORK = os.path.join(WORK, "guard_" + case)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    globals()["case_" + case]()


if __name__ == "__main__":
    main()
