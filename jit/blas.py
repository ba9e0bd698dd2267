"""Keep numpy's OpenBLAS to one thread while the CPU pool owns the cores.

With the JIT backend the pool's workers are the process's compute threads, sized to its CPU
budget. OpenBLAS would add its own N threads for the numpy matmuls that remain (attention), and
its threads busy-wait: on a loaded 2-core machine a 128-token prefill of the 1.2B MoE spent 2.7 s
of 3.9 s in attention with OpenBLAS threaded, 0.02 s with one thread. threadpoolctl is the usual
tool; this is the part of it we need: find the OpenBLAS numpy loaded and call its setter.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

# numpy's wheels bundle scipy-openblas with prefixed, ILP64-suffixed names; system builds do not.
_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def _loaded_openblas(maps: Path = Path("/proc/self/maps")) -> list[str]:
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    paths = {ln.split()[-1] for ln in lines if "openblas" in ln.lower() and ln.split()[-1].startswith("/")}
    return sorted(paths)


def _functions(names: tuple[str, ...]) -> list[ctypes._CFuncPtr]:
    """The first of `names` each loaded OpenBLAS exports."""
    import numpy  # noqa: F401  (loads its BLAS, if it has not been loaded yet)

    found = []
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = next((f for f in (getattr(lib, nm, None) for nm in names) if f is not None), None)
        if fn is not None:
            found.append(fn)
    return found


def limit_blas_threads(n: int) -> bool:
    """Set every loaded OpenBLAS to n threads; False when none was found (nothing to limit)."""
    setters = _functions(_SETTERS)
    for f in setters:
        f.argtypes, f.restype = [ctypes.c_int], None
        f(n)
    return bool(setters)


def blas_threads() -> int | None:
    """The thread count of the first loaded OpenBLAS, None without one."""
    getters = _functions(tuple(s.replace("set_", "get_") for s in _SETTERS))
    if not getters:
        return None
    getters[0].restype = ctypes.c_int
    return int(getters[0]())
