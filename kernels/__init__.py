"""Triton kernels, each with a pure-torch reference beside it and a dispatch between them.

- `verify/`: greedy and rejection-sampling verification of draft tokens (Triton on CUDA).
- `distill_loss/`: fused linear + forward-KL / cross-entropy distillation loss in vocabulary
  chunks, forward and backward (Triton on CUDA, chunked torch elsewhere).
- `forward_kl.py`: forward KL over given logits with both argmaxes, one native pass per row
  on the CPU (speculator/runtime/native.c), torch elsewhere.
- `bench.py`: `python -m speclab.kernels.bench`, fused against unfused, time and peak memory.

The Triton modules are imported lazily, only when a CUDA tensor reaches a dispatch, so the
CPU path never needs a compiler.
"""
