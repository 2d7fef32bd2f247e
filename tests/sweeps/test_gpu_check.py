"""The GPU check's plumbing, on the CPU: its kernel rows compare the Triton kernels (in
Triton's interpreter here) with their references and catch a wrong one; its decoding row
times the tiny target against the bandwidth bound; without CUDA it refuses in one line."""

from __future__ import annotations

import pytest
import torch

from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps import gpu_check

CPU = torch.device("cpu")


def test_the_kernels_agree_with_their_references():
    rows = gpu_check.verify_rows(CPU, 200) + [gpu_check.distill_row(CPU, 32, 16, 200)]
    assert [r["ok"] for r in rows] == [True, True, True]
    assert rows[0]["result"] == "0/8 rows differ" and rows[1]["result"] == "0/8 rows differ"


def test_a_wrong_kernel_is_caught(monkeypatch):
    import speclab.kernels.verify.triton as triton_verify

    real = triton_verify.verify_triton

    def off_by_one(*args, **kwargs):
        n, nxt = real(*args, **kwargs)
        return n, (nxt + 1) % 200

    monkeypatch.setattr(triton_verify, "verify_triton", off_by_one)
    rows = gpu_check.verify_rows(CPU, 200)
    assert [r["result"] for r in rows] == ["8/8 rows differ", "8/8 rows differ"] and not any(r["ok"] for r in rows)


def test_decoding_is_timed_against_the_weight_read_bound():
    (row,) = gpu_check.decode_rows(lambda compiled: tiny_llama(), CPU)[:1]
    ms, bound = row["ms"], row["bound_ms"]
    assert ms > 0 and bound > 0
    assert row["result"] == f"{ms:.2f} ms/token" and row["against"] == f"{ms / bound:.2f}x the bound {bound:.3f} ms"


def test_without_cuda_it_refuses_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]


@pytest.mark.slow
def test_a_tiny_run_end_to_end(tmp_path):
    row = gpu_check.train_row("tiny run", ["target=tiny", "speculator=mlp", *gpu_check.smoke_overrides("cpu")], tmp_path)
    assert row["ok"], row["note"]
    assert row["note"].startswith("lossless 3/3")
