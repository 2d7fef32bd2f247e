"""The native CPU library: build it with the machine's own compiler, load it, declare its functions.

One shared library from three sources by concern: decoder.c (the lean decoder's kernels:
GEMM over packed weights, attention, norms, RoPE), loss.c (the fused forward KL of training)
and drafting.c (the mlp speculator's greedy chain), with one header, lean.h, holding every
exported prototype. SIGNATURES below declares each function's ctypes types once;
tests/kernels/native/test_signatures.py checks them against lean.h's prototypes.

The library is compiled once per machine (its flags come from `-march=native`, so an AVX2
machine and an AVX-512 one each get their own build) into the speclab cache, keyed by the
sources, the flags and the compiler, and written atomically so concurrent runs never load a
half-written file. A C compiler is a requirement (`make install` checks for one); where none
is found, or SPECLAB_NATIVE=0, `load()` returns None, one line says so, and callers run their
pure-torch path (ops.py TorchOps), which computes the same maths more slowly.

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

from ..util.cache_lock import cache_root

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = tuple(HERE / name for name in ("decoder.c", "loss.c", "drafting.c"))
HEADER = HERE / "lean.h"
FLAGS = ("-O3", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")
# The instruction set: the machine's own, or SPECLAB_NATIVE_MARCH (e.g. haswell for the AVX2
# code path on an AVX-512 machine, skylake-avx512 for AVX-512 without its bf16 pair
# products, as the tests build them).
MARCH = os.environ.get("SPECLAB_NATIVE_MARCH", "native")
_VOID, _I64, _INT, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
# Every exported function of lean.h: (return type, ((argument, type), ...)), in the
# prototype's order. Pointers of any kind are c_void_p.
SIGNATURES = {
    "lean_vector_len": (_INT, ()),
    "lean_pack_width": (_INT, ()),
    "lean_bf16_dot": (_INT, ()),
    "lean_amx": (_INT, ()),
    "lean_gemm": (None, (("x", _VOID), ("ldx", _I64), ("w", _VOID), ("weights", _INT), ("y", _VOID), ("ldy", _I64),
                         ("M", _INT), ("K", _INT), ("N", _INT), ("accumulate", _INT))),
    "lean_rmsnorm": (None, (("x", _VOID), ("weight", _VOID), ("y", _VOID), ("M", _INT), ("D", _INT),
                            ("eps", _FLOAT))),
    "lean_silu_mul": (None, (("gu", _VOID), ("out", _VOID), ("M", _INT), ("I", _INT))),
    "lean_attention": (None, (
        ("qkv", _VOID), ("pos", _VOID), ("cos_t", _VOID), ("sin_t", _VOID),
        ("kc", _VOID), ("vc", _VOID), ("row", _VOID), ("len", _VOID),
        ("mask", _VOID), ("out", _VOID), ("B", _INT), ("T", _INT), ("H", _INT), ("KV", _INT), ("hd", _INT),
        ("S", _INT), ("scale", _FLOAT), ("kv_bf16", _INT))),
    "lean_layers": (None, (
        ("layers", _VOID), ("l0", _INT), ("l1", _INT), ("weights", _INT),  # the stack, which layers, their format
        ("x", _VOID), ("B", _INT), ("T", _INT), ("D", _INT), ("Nqkv", _INT), ("I", _INT), ("eps", _FLOAT),  # the rows
        ("kc", _VOID), ("vc", _VOID), ("layer_stride", _I64), ("kv_bf16", _INT),  # the KV cache
        ("pos", _VOID), ("cos_t", _VOID), ("sin_t", _VOID), ("row", _VOID), ("len", _VOID), ("mask", _VOID),
        ("H", _INT), ("KV", _INT), ("hd", _INT), ("S", _INT), ("scale", _FLOAT),  # attention's shape
        ("scratch", _VOID))),
    "lean_forward_kl": (None, (("d", _VOID), ("d_bf16", _INT), ("t", _VOID), ("t_rows", _VOID), ("N", _INT),
                               ("V", _INT), ("loss", _VOID), ("grad", _VOID), ("d_arg", _VOID), ("t_arg", _VOID))),
    "lean_mlp_chain": (None, (("stages", _VOID), ("k", _INT), ("hidden", _VOID), ("token", _I64), ("H", _INT),
                              ("D", _INT), ("N", _INT), ("vocab_ids", _VOID), ("state_weight", _FLOAT),
                              ("emb_weight", _FLOAT), ("work", _VOID), ("drafts", _VOID), ("states", _VOID))),
}
_said_unavailable = False


def _unavailable(reason: str) -> None:
    """Say once per process that the torch path runs instead, and why."""
    global _said_unavailable
    if not _said_unavailable:
        _said_unavailable = True
        log.warning("the native CPU kernels are unavailable (%s): speclab runs the slower torch path", reason)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _build_key(cc: str, march: str) -> str:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    # -march=native resolves to this CPU's features: ask the compiler what it enables.
    native = subprocess.run([cc, f"-march={march}", "-Q", "--help=target"], capture_output=True, text=True).stdout
    h = hashlib.sha256()
    for part in (*(p.read_bytes() for p in (*SOURCES, HEADER)), " ".join(FLAGS).encode(), version.encode(),
                 native.encode()):
        h.update(part)
    return h.hexdigest()[:16]


def _compile(cc: str, out: Path, march: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, f"-march={march}", *map(str, SOURCES), "-o", tmp, "-lm"], check=True,
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
        _unavailable("SPECLAB_NATIVE=0")
        return None
    cc = _compiler()
    if cc is None:
        _unavailable("no C compiler found; install one, e.g. apt-get install gcc")
        return None
    try:
        out = cache_root() / "native" / f"lean-{_build_key(cc, march)}.so"
        if not out.is_file():
            _compile(cc, out, march)
        lib = ctypes.CDLL(str(out))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        _unavailable(f"building them failed: {' '.join(detail.split())[:500]}")
        return None
    for name, (restype, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [t for _, t in args], restype
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


# The CPU flags that pick a kernel path: the ones a record of a figure names its machine by.
PATH_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def machine_label(model: str, cores: int | None) -> str:
    """A machine as the records of figures name it: its CPU model and core count."""
    return f"{model or 'unknown CPU'} ({cores} cores)"


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
