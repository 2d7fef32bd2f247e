"""The benchmark's measuring step, and an ahead-of-time compile of every Triton kernel for a
GPU target: on a CPU-only machine this is the only check that the GPU leg builds at all
(the interpreter accepts code the compiler rejects, e.g. loop-carried type changes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from speclab.kernels.bench import Measurement, measure_child, print_table


def test_bench_measures_time_and_memory_in_process(capsys):
    rows = [measure_child("distill", v, [64, 16, 300], "cpu") for v in ("reference", "naive")]
    rows.append(measure_child("verify", "reference", [2, 3, 300], "cpu"))
    assert all(r.time_s > 0 and r.peak_mb >= 0 for r in rows)
    print_table(rows + [Measurement("distill", "naive", "N=1 D=1 V=1", "cpu", None, None, "skipped")])
    out = capsys.readouterr().out
    assert "reference / naive" in out and "skipped" in out


COMPILE = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from speclab.kernels.verify.triton import _verify_kernel
    from speclab.kernels.distill_loss.triton import _distill_fwd, _distill_bwd

    def build(fn, sig, consts):
        sig = {**sig, **{k: "constexpr" for k in consts}}
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))

    for mode in (0, 1):
        build(_verify_kernel, {"draft_ptr": "*i64", "q_ptr": "*fp32", "logit_ptr": "*bf16", "u_ptr": "*fp32",
              "n_ptr": "*i64", "next_ptr": "*i64", "K": "i32", "V": "i32"}, {"MODE": mode, "BLOCK_V": 1024})
    ptrs = {"hd_ptr": "*bf16", "wd_ptr": "*bf16", "ht_ptr": "*bf16", "wt_ptr": "*bf16"}
    sizes = {"N": "i32", "V": "i32", "D": "i32", "H": "i32"}
    for kind in (0, 1):
        consts = {"KIND": kind, "BLOCK_N": 64, "BLOCK_V": 128, "BLOCK_D": 64, "UPCAST": False,
                  "PREC_D": None, "PREC_T": None}
        build(_distill_fwd, {**ptrs, "loss_ptr": "*fp32", "lse_z_ptr": "*fp32", "lse_t_ptr": "*fp32",
              "arg_z_ptr": "*i32", "arg_t_ptr": "*i32", **sizes}, consts)
        build(_distill_bwd, {**ptrs, "gamma_ptr": "*fp32", "lse_z_ptr": "*fp32", "lse_t_ptr": "*fp32",
              "arg_t_ptr": "*i32", "grad_h_ptr": "*fp32", "grad_w_ptr": "*fp32", **sizes}, consts)
    print("compiled")
''')


def test_kernels_compile_for_a_gpu_target():
    pytest.importorskip("triton.backends.nvidia")
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # a fresh process: real JIT functions, not interpreted
    proc = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
