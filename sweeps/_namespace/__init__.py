"""speclab: a speculator architecture experiment platform.

The installed package maps the repository's top-level folders under this namespace
(`speclab.speculator`, `speclab.kernels`, `speclab.training`, `speclab.eval`,
`speclab.sweeps`, `speclab.configs`); see pyproject.toml.
"""

import os as _os

__version__ = "0.1.0"


def _prefer_fast_small_gemm() -> None:
    """Pick MKL's AVX2 code branch on AVX2-only CPUs, before torch loads MKL.

    Speculative decoding lives on the cost of verifying k+1 tokens being close to the
    cost of one. On the AVX2-only development CPU (AMD EPYC, 2 cores) MKL's default
    dispatch runs a 2..9-row sgemm about 2x slower than the 1-row gemv, so a 5-token
    verification step of SmolLM2 cost 1.8x a 1-token step; with MKL_CBWR=AVX2 it costs
    1.29x (measured: 99 ms vs 129 ms), and 1-token decoding is unchanged. A user's own
    MKL_CBWR always wins.
    """
    if "MKL_CBWR" in _os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return
    if " avx2" in flags and " avx512f" not in flags:
        _os.environ["MKL_CBWR"] = "AVX2"


_prefer_fast_small_gemm()
