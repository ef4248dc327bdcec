"""The installed wheel carries what it needs: its extension depends only on the manylinux
policy's system libraries and on copies inside the wheel (posembed.libs/), and it runs with
the system's copies of the bundled libraries hidden from the loader.

The hiding: a private mount namespace (``unshare -m``, or ``unshare -r -m`` when not root)
where every shared-library file of the Debian packages that provide the bundled libraries
(libhwy1, libgomp1) is covered by a bind mount of /dev/null, so the loader cannot map them.
A forward and backward through the NumPy API then runs against a float64 reference.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import posembed

EXTENSION = pathlib.Path(posembed._C.__file__).resolve()
LIBS = EXTENSION.parents[1] / "posembed.libs"
# The manylinux policy's libraries that every Linux has (PEP 600, auditwheel's policy list),
# and the loader itself.
SYSTEM = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libpthread.so.0",
          "libdl.so.2", "librt.so.1", "linux-vdso.so.1", "ld-linux-x86-64.so.2"}


def ldd(path):
    """(name, resolved path or None) for each library the loader maps for `path`."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    deps = []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)(?: => (\S+|not found))?", line)
        name, target = m.group(1), m.group(2)
        deps.append((pathlib.Path(name).name, None if target in (None, "not found") else target))
    return deps


def test_the_extension_is_the_installed_wheels_with_its_libraries_inside():
    assert "site-packages" in EXTENSION.parts, EXTENSION  # not a build tree
    bundled = sorted(p.name for p in LIBS.iterdir())
    assert any(n.startswith("libhwy-") for n in bundled), bundled
    for name, target in ldd(EXTENSION):
        if name in SYSTEM:
            continue
        assert target is not None and pathlib.Path(target).resolve().parent == LIBS, \
            f"{EXTENSION.name} needs {name} from {target}: outside the wheel and the policy"


def system_copies_of_bundled_libraries():
    """{soname: Debian package} of the system's copies of the libraries the wheel bundles."""
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    found = {}
    for lib in LIBS.iterdir():
        stem = lib.name.split("-")[0]  # libhwy-019861ac.so.1.0.3 -> libhwy
        for m in re.finditer(rf"^\s*({re.escape(stem)}\.so\.\d+) .* => (\S+)$", cache, re.M):
            owner = subprocess.run(["dpkg", "-S", os.path.realpath(m.group(2))], capture_output=True, text=True)
            assert owner.returncode == 0, owner.stderr
            found[m.group(1)] = owner.stdout.split(":")[0]
    return found


CHECK = r"""
import ctypes, os, sys
import numpy as np
import posembed
from posembed import positions
for hidden in sys.argv[1:]:  # the system's copies cannot be loaded here
    try:
        ctypes.CDLL(hidden)
        raise SystemExit(f"{hidden} is still loadable")
    except OSError:
        pass
rng = np.random.default_rng(0)
tok = rng.standard_normal((50, 24)).astype(np.float32)
pos = rng.standard_normal((16, 24)).astype(np.float32)
ids = rng.integers(0, 50, (3, 16))
pids = positions.contiguous(ids)
posembed.set_num_threads(2)  # the bundled OpenMP runs the threads
out = posembed.forward(ids, pids, tok, pos)
assert np.array_equal(out, tok[ids] + pos[pids])
g = rng.standard_normal(out.shape).astype(np.float32)
gt, gp = np.zeros_like(tok), np.zeros_like(pos)
posembed.backward(g, ids, pids, grad_token_table=gt, grad_position_table=gp, vocab_size=50,
                  max_seq_len=16)
exact = np.zeros((50, 24))
np.add.at(exact, ids.reshape(-1), g.reshape(-1, 24).astype(np.float64))
assert np.abs(gt - exact).max() <= 1e-5 * np.abs(exact).max()
maps = open("/proc/self/maps").read()
libs = sorted({line.split()[-1] for line in maps.splitlines()
               if "libhwy" in line or "libgomp" in line})
print("loaded:", " ".join(libs))
"""


def test_runs_with_the_system_copies_of_the_bundled_libraries_hidden():
    copies = system_copies_of_bundled_libraries()
    assert {"libhwy.so.1", "libgomp.so.1"} <= copies.keys(), copies
    files = []
    for package in sorted(set(copies.values())):
        listing = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True,
                                 check=True).stdout.split()
        files += [f for f in listing if ".so" in f and os.path.isfile(f) and not os.path.islink(f)]
    mounts = " && ".join(f"mount --bind /dev/null {shlex.quote(f)}" for f in files)
    run = " ".join(shlex.quote(a) for a in [sys.executable, "-c", CHECK, *copies])
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    result = subprocess.run(unshare + ["sh", "-c", f"{mounts} && {run}"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    loaded = result.stdout.split("loaded:")[1].split()
    assert loaded and all(pathlib.Path(p).parent == LIBS for p in loaded), loaded
    assert any("libgomp" in p for p in loaded) and any("libhwy" in p for p in loaded), loaded
