"""The ctypes declarations of the native library (kernels/native/__init__.py SIGNATURES) agree
with the C prototypes in lean.h, argument by argument, so that a changed argument list
fails here instead of loading and passing garbage. (The compiler checks each definition in
decoder.c, loss.c and drafting.c against the same prototypes: every source includes lean.h.)"""

import ctypes
import re

import pytest

from speclab.kernels import native

C_TYPES = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}


def _prototypes(header: str) -> dict[str, tuple]:
    """name -> (return type, ((argument, ctypes type), ...)) for every lean_* prototype."""
    text = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    found = {}
    for ret, name, params in re.findall(r"\b(void|int)\s+(lean_\w+)\s*\(([^)]*)\)\s*;", text):
        args = []
        for param in params.split(","):
            param = " ".join(param.split())
            if param in ("void", ""):
                continue
            decl, arg = re.fullmatch(r"(.*?)[\s*]*(\w+)", param).groups()
            words = decl.replace("const", " ").split()
            # any pointer, whatever it points to, is passed as c_void_p
            kind = ctypes.c_void_p if "*" in param else C_TYPES[" ".join(words)]
            args.append((arg, kind))
        found[name] = (None if ret == "void" else C_TYPES[ret], tuple(args))
    return found


def test_every_declared_signature_matches_its_prototype():
    prototypes = _prototypes(native.HEADER.read_text())
    assert prototypes, "no lean_* prototype parsed from lean.h"
    assert sorted(native.SIGNATURES) == sorted(prototypes)
    for name, (restype, args) in native.SIGNATURES.items():
        want_ret, want_args = prototypes[name]
        assert restype is want_ret, f"{name} returns {want_ret} in lean.h, {restype} in SIGNATURES"
        assert len(args) == len(want_args), f"{name}: lean.h has {len(want_args)} arguments, SIGNATURES {len(args)}"
        for i, ((arg, kind), (want_arg, want_kind)) in enumerate(zip(args, want_args)):
            assert (arg, kind) == (want_arg, want_kind), f"{name} argument {i}: lean.h {want_arg} {want_kind}, " \
                                                         f"SIGNATURES {arg} {kind}"


def test_the_parser_reads_pointers_scalars_and_empty_lists():
    header = ("/* int lean_commented(int); */\nint lean_query(void);\n"
              "void lean_f(const float *x, int64_t n,\n  const lean_layer *layers, float eps, int k);")
    assert _prototypes(header) == {
        "lean_query": (ctypes.c_int, ()),
        "lean_f": (None, (("x", ctypes.c_void_p), ("n", ctypes.c_int64), ("layers", ctypes.c_void_p),
                          ("eps", ctypes.c_float), ("k", ctypes.c_int))),
    }


@pytest.mark.skipif(native.load() is None, reason="native kernels unavailable (no C compiler)")
def test_the_loaded_library_carries_the_declared_types():
    lib = native.load()
    for name, (restype, args) in native.SIGNATURES.items():
        fn = getattr(lib, name)
        assert fn.restype is restype and list(fn.argtypes) == [kind for _, kind in args]
