"""`posembed train` stopped by SIGINT (Ctrl-C) exits with status 130 after
saving a checkpoint at the step it reached, and says so.

    interrupt_check.py POSEMBED_EXE TEXT_DIR WORK_DIR

A tiny model with a step count it cannot finish; SIGINT goes a second after the
"training:" line, when the handler is installed (before it, the signal would
end the program with the default action instead).
"""
import os
import shutil
import signal
import subprocess
import sys
import time


def main():
    exe, text_dir, work = sys.argv[1:4]
    out = os.path.join(work, "interrupted_run")
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.Popen([exe, "train", "--data", text_dir, "--out", out, "--steps", "100000000",
                          "--n-layer", "1", "--n-head", "1", "--embed-dim", "16",
                          "--max-seq-len", "16", "--batch-size", "2", "--micro-batch", "1", "--eval-every", "100000000",
                          "--checkpoint-every", "100000000", "--threads", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    head = []
    for line in p.stdout:
        head.append(line)
        if line.startswith("training:"):
            break
    # The handler is installed right after the "training:" line; the first
    # progress line would come only after steps / 20 steps.
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    try:
        rest, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        rest, _ = p.communicate()
    text = "".join(head) + rest
    if p.returncode != 130:
        sys.exit(f"FAIL: exit status {p.returncode}, want 130\n{text}")
    if "interrupted at step" not in text or not os.path.exists(os.path.join(out, "ckpt.safetensors")):
        sys.exit(f"FAIL: no 'interrupted at step' message or no checkpoint in {out}\n{text}")
    print("ok: status 130, checkpoint saved")


if __name__ == "__main__":
    main()
