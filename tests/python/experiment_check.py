"""Smoke test of `posembed experiment all --quick`: the report and its plots are
produced and well-formed. No speed or verdict assertions (--quick trains tiny
models for a few steps; its verdicts mean nothing).

    experiment_check.py POSEMBED_EXE TEXT_DIR WORK_DIR

Checks: exit status 0; REPORT.md with the summary table and seven sections, each
with a claim, a measurement, a verdict word and its rule; every referenced PNG
exists, is small, and decodes (signature, chunk CRCs, IHDR, IDAT inflating to
exactly height * (1 + 3 * width) bytes with valid filter bytes, IEND); no PNG
is left unreferenced. Then the error paths: an unknown name (a usage error,
status 2) and a missing corpus (an error, status 1) exit with a message naming
the problem and write nothing. Last, one claim with `--format svg`: every plot the
report references is an SVG file that parses, with an <svg> root of positive size, and
no PNG is written.
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
import xml.etree.ElementTree as ET

MAX_PNG_BYTES = 300 * 1024  # the report is committed: plots must stay small


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check_png(path):
    data = open(path, "rb").read()
    if len(data) > MAX_PNG_BYTES:
        fail(f"{path}: {len(data)} bytes > {MAX_PNG_BYTES}")
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG signature")
    pos, chunks, idat = 8, [], b""
    width = height = None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            fail(f"{path}: bad CRC in chunk {kind!r}")
        chunks.append(kind)
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour != 2:
                fail(f"{path}: expected 8-bit RGB, got depth {depth} colour type {colour}")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    if chunks[0] != b"IHDR" or chunks[-1] != b"IEND" or b"IDAT" not in chunks:
        fail(f"{path}: chunk order {chunks}")
    raw = zlib.decompress(idat)
    if len(raw) != height * (1 + 3 * width):
        fail(f"{path}: {len(raw)} bytes of pixels for {width} x {height}")
    row = 1 + 3 * width
    if any(raw[y * row] > 4 for y in range(height)):
        fail(f"{path}: invalid filter byte")
    if not (200 <= width <= 2000 and 150 <= height <= 2000):
        fail(f"{path}: odd size {width} x {height}")
    # A plot is not blank: more than one distinct byte among the pixel rows.
    if len(set(raw[1:row * min(height, 400)])) < 3:
        fail(f"{path}: looks blank")


def main():
    exe, text_dir, work = sys.argv[1], sys.argv[2], sys.argv[3]
    out = os.path.join(work, "experiment_quick")
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([exe, "experiment", "all", "--quick", "--quiet", "--out", out,
                        "--data", text_dir], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        fail(f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    report = open(os.path.join(out, "REPORT.md")).read()
    verdicts = re.findall(r"\*\*Verdict: (holds|partly|does not hold)\.\*\*", report)
    if len(verdicts) != 7:
        fail(f"expected 7 verdicts, found {len(verdicts)}")
    for n in range(1, 8):
        if not re.search(rf"^## {n}\. ", report, re.M):
            fail(f"section {n} missing")
    if report.count("**Claim.**") != 7 or report.count("**Measured.**") != 7:
        fail("every section needs a claim and a measurement")
    if report.count("Rule: *holds*") != 7:
        fail("every verdict states its rule")
    rows = re.findall(r"^\| [1-7] \| \[", report, re.M)
    if len(rows) != 7:
        fail(f"summary table has {len(rows)} rows, expected 7")
    if "nan" in report.lower().replace("nans", ""):
        fail("a NaN reached the report")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    if len(images) < 6:
        fail(f"only {len(images)} plots referenced")
    for img in images:
        if "/" in img or not img.endswith(".png"):
            fail(f"image reference {img} is not a PNG next to the report")
        check_png(os.path.join(out, img))
    on_disk = {f for f in os.listdir(out) if f.endswith(".png")}
    if on_disk != set(images):
        fail(f"unreferenced or missing PNGs: {sorted(on_disk ^ set(images))}")
    # The stdout summary lists every claim.
    if len(re.findall(r"^\s+[1-7] \S+\s+(holds|partly|does not hold)", r.stdout, re.M)) != 7:
        fail(f"stdout summary incomplete:\n{r.stdout}")

    # Errors: the status, a message naming the problem, nothing written.
    bad = os.path.join(work, "experiment_bad")
    shutil.rmtree(bad, ignore_errors=True)
    for args, status, words in (
            (["no-such-claim"], 2, "unknown experiment 'no-such-claim'"),
            (["init-scale", "--data", os.path.join(work, "missing.txt")], 1, "not found")):
        r = subprocess.run([exe, "experiment", *args, "--quick", "--out", bad],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != status or words not in r.stderr:
            fail(f"{args}: exit {r.returncode}, stderr {r.stderr!r}, want status {status} and {words!r}")
        if os.path.exists(bad):
            fail(f"{args}: wrote {bad} before failing")
    # SVG plots, by --format, for one claim (the cheapest one that plots lines and spectra).
    svg_out = os.path.join(work, "experiment_svg")
    shutil.rmtree(svg_out, ignore_errors=True)
    r = subprocess.run([exe, "experiment", "dimensionality", "--quick", "--quiet", "--format", "svg",
                        "--out", svg_out, "--data", text_dir], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        fail(f"--format svg: exit {r.returncode}\nstderr:\n{r.stderr}")
    svgs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", open(os.path.join(svg_out, "REPORT.md")).read())
    if not svgs or any(not s.endswith(".svg") for s in svgs):
        fail(f"--format svg: report references {svgs}")
    for name in svgs:
        root = ET.parse(os.path.join(svg_out, name)).getroot()
        if root.tag != "{http://www.w3.org/2000/svg}svg":
            fail(f"{name}: root element {root.tag}")
        if not (float(re.sub(r"(px|pt)$", "", root.get("width", "0"))) > 0 and len(list(root.iter())) > 20):
            fail(f"{name}: empty drawing")
    if any(f.endswith(".png") for f in os.listdir(svg_out)):
        fail("--format svg wrote a PNG")
    r = subprocess.run([exe, "experiment", "dropout", "--quick", "--format", "jpg", "--out", bad],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 2 or "jpg" not in r.stderr or os.path.exists(bad):
        fail(f"--format jpg: exit {r.returncode}, stderr {r.stderr!r}")
    print(f"ok: {len(verdicts)} verdicts, {len(images)} PNG and {len(svgs)} SVG plots checked")


if __name__ == "__main__":
    main()
