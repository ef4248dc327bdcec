"""Writes the fuzzer's seed corpus (tests/fuzz/corpus): small valid files over
every dtype and shape kind, and the malformed shapes the reader must reject.
Packs bytes by hand so it needs nothing beyond the standard library. Rerun it
only to change the corpus: python3 tests/fuzz/make_seeds.py"""
import json
import pathlib
import struct

out = pathlib.Path(__file__).parent / "corpus"
out.mkdir(exist_ok=True)
for old in out.iterdir():
    old.unlink()


def pack(header, data=b"", length=None, pad=True):
    text = header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))
    raw = text.encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


sizes = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8,
         "I64": 8, "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
seeds = {}
for dtype, size in sizes.items():
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in (("scalar", []), ("empty", [0, 3]), ("matrix", [3, 2])):
        n = 1
        for d in shape:
            n *= d
        chunk = bytes((i * 37 + 11) & 0xFF for i in range(n * size))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(chunk)]}
        data += chunk
    seeds[f"valid_{dtype}"] = pack(header, data)
f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
entry = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
seeds["valid_unpadded"] = pack({"t": entry}, f32, pad=False)
seeds["valid_gpt2_names"] = pack({"wte.weight": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]},
                                  "wpe.weight": {"dtype": "F32", "shape": [2, 1], "data_offsets": [8, 16]}}, f32)
seeds["empty_object"] = pack("{}")
seeds["bad_header_length"] = pack({"t": entry}, f32, length=1 << 40)
seeds["bad_json"] = pack('{"t":{"dtype":"F32",', f32)
seeds["bad_not_object"] = pack("[1,2,3]")
seeds["bad_dtype"] = pack({"t": dict(entry, dtype="F48")}, f32)
seeds["bad_size"] = pack({"t": dict(entry, shape=[3, 2])}, f32)
seeds["bad_offsets"] = pack({"t": dict(entry, data_offsets=[8, 24])}, f32)
seeds["bad_overlap"] = pack('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                            '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', f32)
seeds["bad_hole"] = pack({"t": dict(entry, shape=[2], data_offsets=[8, 16])}, f32)
seeds["bad_duplicate"] = pack('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                              '"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', f32)
seeds["bad_metadata"] = pack({"__metadata__": {"k": 1}})
seeds["bad_truncated"] = pack({"t": entry}, f32)[:-3]
for name, data in seeds.items():
    (out / name).write_bytes(data)
print(f"wrote {len(seeds)} seeds to {out}")
