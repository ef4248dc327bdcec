"""Writes a safetensors file from numpy arrays with nothing but the standard
library and numpy. The reference scripts run under Debian's /usr/bin/python3,
which has torch but not the PyPI safetensors package."""
import json
import struct

import numpy as np

_DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int64"): "I64",
           np.dtype("int32"): "I32", np.dtype("uint8"): "U8"}


def save(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
