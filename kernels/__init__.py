"""Every kernel: the Triton ones, each with a pure-torch reference beside it and a dispatch
between them, and the native CPU library.

- `verify/`: greedy and rejection-sampling verification of draft tokens (Triton on CUDA).
- `distill_loss/`: fused linear + forward-KL / cross-entropy distillation loss in vocabulary
  chunks, forward and backward (Triton on CUDA, chunked torch elsewhere).
- `forward_kl.py`: forward KL over given logits with both argmaxes, one native pass per row
  on the CPU (native/loss.c), torch elsewhere.
- `native/`: the native CPU library split by concern (decoder.c, loss.c, drafting.c; one
  header, lean.h), its loader and ctypes declarations (`__init__.py`), the dispatch between
  it and torch (`ops.py`), and the per-machine choices of its bf16 and wide GEMM paths.
- `util/`: atomic writes and cache locks, digests, timing probes, machine records.
- `bench.py`: `python -m speclab.kernels.bench`, fused against unfused, time and peak memory.

The Triton modules are imported lazily, only when a CUDA tensor reaches a dispatch, so the
CPU path never needs Triton's compiler; the native library needs a C compiler.
"""
