"""Kernel tests run the Triton kernels on CPU through Triton's interpreter.

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function (triton 3.x:
`knobs.runtime.interpret`, checked in `triton.jit`), i.e. when a kernel module is first
imported. The dispatches import their kernel modules lazily, so setting the variable here,
before any test module imports them, is early enough. On a machine with CUDA it is left
unset and the same tests run the compiled kernels on the GPU with larger shapes.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE
