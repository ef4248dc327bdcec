"""Reference numbers for `posembed analyze`, computed with NumPy (LAPACK SVD).

  write OUTDIR       writes analyze_table.f32 (raw little-endian float32, 200 x 48),
                     analyze_table.safetensors (the same table as `wpe.weight`) and
                     analyze_reference.json (spectrum, components, participation
                     ratio, norms, neighbour cosines) for tests/tools/analyze_test.cpp
  check CLI OUTDIR   runs `CLI analyze OUTDIR/analyze_table.safetensors --json` and
                     compares its output with the reference; checks the PNG files,
                     and the SVG files of --format svg

The table is a sum of sinusoids along the positions plus noise: a smooth table
with a spread-out spectrum, like a trained position table.
"""
import json
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np

ROWS, COLS = 200, 48


def make_table():
    rng = np.random.default_rng(20240601)
    p = np.arange(ROWS)[:, None]
    freq = rng.uniform(0.005, 0.2, size=COLS)[None, :]
    phase = rng.uniform(0, 2 * np.pi, size=COLS)[None, :]
    amp = rng.uniform(0.2, 1.0, size=COLS)[None, :]
    x = amp * np.sin(2 * np.pi * freq * p + phase) + 0.05 * rng.standard_normal((ROWS, COLS))
    return x.astype("<f4")


def components(ratio, level):
    return int(np.searchsorted(np.cumsum(ratio), level * (1 - 1e-12)) + 1)


def reference(x32):
    x = x32.astype(np.float64)
    s = np.linalg.svd(x - x.mean(axis=0), compute_uv=False)
    lam = s ** 2
    ratio = lam / lam.sum()
    norms = np.linalg.norm(x, axis=1)
    cos = np.sum(x[:-1] * x[1:], axis=1) / (norms[:-1] * norms[1:])
    return {
        "format": "posembed-analyze-reference", "version": 1, "numpy": np.__version__,
        "rows": ROWS, "cols": COLS,
        "singular_values": s.tolist(),
        "components": {str(int(100 * t)): components(ratio, t) for t in (0.90, 0.95, 0.99)},
        "participation_ratio": float(lam.sum() ** 2 / (lam ** 2).sum()),
        "row_norms": norms.tolist(),
        "neighbour_cosine": cos.tolist(),
    }


def write(outdir):
    x = make_table()
    x.tofile(f"{outdir}/analyze_table.f32")
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "wpe.weight": {"dtype": "F32", "shape": [ROWS, COLS],
                                        "data_offsets": [0, x.nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(f"{outdir}/analyze_table.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + x.tobytes())
    with open(f"{outdir}/analyze_reference.json", "w") as f:
        json.dump(reference(x), f)


def require(condition, message):
    """A check that stays on under python -O (a bare assert would not)."""
    if not condition:
        sys.exit(f"analyze_reference: {message}")


def max_error(name, got, want):
    """Largest |got - want| of two sequences that must have the same length (zip
    would stop at the shorter one); NaN compares as an infinite error."""
    require(len(got) == len(want), f"{name}: {len(got)} values, expected {len(want)}")
    errors = [abs(a - b) for a, b in zip(got, want)]
    return max((e if e == e else float("inf") for e in errors), default=0.0)


def check(cli, outdir):
    ref = reference(make_table())
    out = subprocess.run([cli, "analyze", f"{outdir}/analyze_table.safetensors", "--json",
                          "--out-dir", outdir, "--prefix", "analyze_cli"],
                         check=True, capture_output=True, text=True).stdout
    got = json.loads(out)
    require(got["format"] == "posembed-analyze", got["format"])
    require((got["rows"], got["cols"]) == (ROWS, COLS), (got["rows"], got["cols"]))
    require(got["components"] == ref["components"], (got["components"], ref["components"]))
    s_max = ref["singular_values"][0]
    require(len(ref["singular_values"]) == min(ROWS, COLS), len(ref["singular_values"]))
    # Two double-precision SVDs of one matrix agree to a few eps * n * s_max.
    err = max_error("singular_values", got["singular_values"], ref["singular_values"])
    require(err <= 1e-12 * s_max, f"singular values differ by {err}")
    err = abs(got["participation_ratio"] - ref["participation_ratio"])
    require(err <= 1e-10, f"participation ratio differs by {err}")
    # Norms and cosines of double rows, in another summation order: ~n eps relative.
    err = max_error("row_norms", got["row_norms"], ref["row_norms"])
    require(err <= 1e-13 * max(ref["row_norms"]), f"row norms differ by {err}")
    err = max_error("neighbour_cosine", got["neighbour_cosine"], ref["neighbour_cosine"])
    require(err <= 1e-13, f"neighbour cosines differ by {err}")
    sizes = {}
    for plot in ("heatmap", "spectrum"):
        with open(f"{outdir}/analyze_cli.{plot}.png", "rb") as f:
            head = f.read(24)
        require(head[:8] == b"\x89PNG\r\n\x1a\n", f"{plot} is not a PNG")
        sizes[plot] = struct.unpack(">II", head[16:24])
        require(min(sizes[plot]) >= 512, (plot, sizes[plot]))
    # --format svg: the same plots as well-formed SVG of the same size.
    subprocess.run([cli, "analyze", f"{outdir}/analyze_table.safetensors", "--format", "svg",
                    "--out-dir", outdir, "--prefix", "analyze_cli"], check=True, capture_output=True)
    for plot, drawn in (("heatmap", "image"), ("spectrum", "path")):
        root = ET.parse(f"{outdir}/analyze_cli.{plot}.svg").getroot()
        require(root.tag == "{http://www.w3.org/2000/svg}svg", root.tag)
        size = tuple(int(root.get(k).removesuffix("px")) for k in ("width", "height"))
        require(size == sizes[plot], (plot, size, sizes[plot]))
        require(root.find(f".//{{http://www.w3.org/2000/svg}}{drawn}") is not None, (plot, drawn))
    print("analyze CLI matches NumPy; PNG and SVG plots written")


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
