"""Build and load the lean decoder's CPU kernels (native.c) with the machine's own compiler.

The library is compiled once per machine (its flags come from `-march=native`, so an AVX2
machine and an AVX-512 one each get their own build) into the speclab cache, keyed by the
source, the flags and the compiler, and written atomically so concurrent runs never load a
half-written file. Without a C compiler `load()` returns None and the runtime falls back to
its pure-torch path (reference.py), which computes the same maths more slowly.

The library links OpenMP; `import torch` runs first, so the dynamic loader binds it to the
OpenMP runtime torch already loaded and both share one thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch  # noqa: F401  (loads torch's OpenMP runtime before the library; see above)

from ..cache_lock import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native.c")
FLAGS = ("-O3", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")
# The instruction set: the machine's own, or SPECLAB_NATIVE_MARCH (e.g. haswell for the AVX2
# code path on an AVX-512 machine, skylake-avx512 for AVX-512 without its bf16 pair
# products, as the tests build them).
MARCH = os.environ.get("SPECLAB_NATIVE_MARCH", "native")
_VOID, _I64, _INT, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
SIGNATURES = {
    # name: argument types (all return void; the int queries are typed in load)
    "lean_gemm": (_VOID, _I64, _VOID, _INT, _VOID, _I64, _INT, _INT, _INT, _INT),
    "lean_rmsnorm": (_VOID, _VOID, _VOID, _INT, _INT, _FLOAT),
    "lean_silu_mul": (_VOID, _VOID, _INT, _INT),
    "lean_attention": (_VOID, _VOID, _VOID, _VOID, _VOID, _VOID, _VOID, _VOID, _VOID, _VOID,
                       _INT, _INT, _INT, _INT, _INT, _INT, _FLOAT, _INT),
    "lean_layers": (_VOID, _INT, _INT, _INT, _VOID, _INT, _INT, _INT, _INT, _INT, _FLOAT, _VOID, _VOID, _I64, _INT,
                    _VOID, _VOID, _VOID, _VOID, _VOID, _VOID, _INT, _INT, _INT, _INT, _FLOAT, _VOID),
    "lean_forward_kl": (_VOID, _INT, _VOID, _VOID, _INT, _INT, _VOID, _VOID, _VOID, _VOID),
    "lean_mlp_chain": (_VOID, _INT, _VOID, _I64, _INT, _INT, _INT, _VOID, _FLOAT, _FLOAT, _VOID, _VOID, _VOID),
}


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _build_key(cc: str, march: str) -> str:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    # -march=native resolves to this CPU's features: ask the compiler what it enables.
    native = subprocess.run([cc, f"-march={march}", "-Q", "--help=target"], capture_output=True, text=True).stdout
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.encode(), native.encode()):
        h.update(part)
    return h.hexdigest()[:16]


def _compile(cc: str, out: Path, march: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, f"-march={march}", str(SOURCE), "-o", tmp, "-lm"], check=True,
                       capture_output=True, text=True)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@lru_cache(maxsize=None)
def load(march: str = MARCH) -> ctypes.CDLL | None:
    """The compiled kernels for an instruction set (default: this machine's), or None where
    they cannot be built (logged once)."""
    if os.environ.get("SPECLAB_NATIVE", "1") == "0":
        return None
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler found: the lean runtime uses its slower pure-torch path")
        return None
    try:
        out = cache_root() / "native" / f"lean-{_build_key(cc, march)}.so"
        if not out.is_file():
            _compile(cc, out, march)
        lib = ctypes.CDLL(str(out))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        log.warning("building the lean CPU kernels failed (%s): using the pure-torch path", detail.strip()[:500])
        return None
    for name, args in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    lib.lean_pack_width.restype = ctypes.c_int
    lib.lean_vector_len.restype = ctypes.c_int
    lib.lean_bf16_dot.restype = ctypes.c_int
    lib.lean_amx.restype = ctypes.c_int
    lib.speclab_build = _build_key(cc, march)  # what `lib_build` names it by
    return lib


def lib_build(lib) -> str:
    """The build a library from `load` was compiled as (march included): a timing measured on
    one build must not answer for another, as a test's haswell build once did for this
    machine's native one. Anything else (a test's stand-in) by its str."""
    return getattr(lib, "speclab_build", None) or str(lib)


@lru_cache(maxsize=None)
def build_id(march: str = MARCH) -> str:
    """What identifies the kernels this machine runs (source, flags, compiler, CPU features),
    or "none" where they are not built: part of the key of timings remembered per machine."""
    cc = _compiler()
    if cc is None or os.environ.get("SPECLAB_NATIVE", "1") == "0":
        return "none"
    return _build_key(cc, march)


def cpu_info() -> tuple[str, list[str]]:
    """This CPU's model name and feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "", []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return model, flags


def cpu_flags() -> set[str]:
    """This CPU's feature flags: which instruction sets a build for another -march may run here."""
    return set(cpu_info()[1])
