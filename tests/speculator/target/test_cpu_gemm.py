"""MKL's branch is chosen by an explicit call (a CLI's main, a target's construction)."""

import io

from speclab.speculator.target import cpu_gemm

AVX2_ONLY = "flags\t\t: fpu sse sse2 avx avx2 fma\n"
AVX512 = "flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw\n"


def _cpu(monkeypatch, flags):
    monkeypatch.setattr(cpu_gemm, "open", lambda *a, **k: io.StringIO(flags), raising=False)


def test_an_avx2_only_cpu_takes_mkls_avx2_branch(monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    _cpu(monkeypatch, AVX2_ONLY)
    cpu_gemm.prefer_fast_small_gemm()
    assert cpu_gemm.os.environ["MKL_CBWR"] == "AVX2"


def test_an_avx512_cpu_keeps_mkls_default(monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    _cpu(monkeypatch, AVX512)
    cpu_gemm.prefer_fast_small_gemm()
    assert "MKL_CBWR" not in cpu_gemm.os.environ


def test_a_users_choice_wins(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    _cpu(monkeypatch, AVX2_ONLY)
    cpu_gemm.prefer_fast_small_gemm()
    assert cpu_gemm.os.environ["MKL_CBWR"] == "COMPATIBLE"
