"""cffi builder for dqoes_cg._native (API, out-of-line mode).

Every C unit in csrc/ is a triple: X.h (declarations, included by the generated module),
X.c (implementation) and X.cdef (the subset of X.h that Python sees, in cffi's C dialect).
Adding a unit means adding the three files; this script picks them up. Paths are relative
to the project root, where setup.py runs (setuptools wants relative sources).
"""

import os
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
UNITS = sorted(p.stem for p in (ROOT / "csrc").glob("*.cdef"))

ffibuilder = FFI()
ffibuilder.cdef("\n".join((ROOT / "csrc" / f"{u}.cdef").read_text() for u in UNITS))
ffibuilder.set_source(
    "dqoes_cg._native",
    "\n".join(f'#include "{u}.h"' for u in UNITS),
    sources=[f"csrc/{u}.c" for u in UNITS if (ROOT / "csrc" / f"{u}.c").exists()],
    include_dirs=["csrc"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror"],
)

if __name__ == "__main__":
    os.chdir(ROOT)
    ffibuilder.compile(tmpdir="build/cffi", verbose=True)
