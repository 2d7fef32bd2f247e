"""Suite-wide settings. wandb is offline by default for users (configs/config.yaml
`wandb.mode`, which follows $WANDB_MODE); in tests its background service would add
seconds to every training run, so it is disabled unless a test turns it back on
(tests/sweeps/test_wandb.py checks the offline files)."""

import os

import torch

from speclab.speculator.target.cpu_gemm import prefer_fast_small_gemm

os.environ.setdefault("WANDB_MODE", "disabled")
# As a speclab process does where its work starts: before any test's first GEMM.
prefer_fast_small_gemm()
# Triton kernels run on CPU only through its interpreter, which triton reads when a kernel
# is decorated, i.e. when its module is first imported: set it before any test module can
# import one (tests/kernels/conftest.py explains; on CUDA the compiled kernels run).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
