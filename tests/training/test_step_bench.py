"""The training-step bench runs every variant and reports each against fp32 with torch's KL."""

import re

from speclab.kernels import forward_kl
from speclab.training import step_bench


def test_the_step_bench_times_four_variants_and_restores_the_kl_path(capsys):
    step_bench.main(["--families", "mlp", "--length", "24", "--rounds", "2", "--threads", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("one training step, ms") and out[1].startswith("mlp")
    variants = re.findall(r"(\w+/\w+) +([\d.]+) \(([\d.]+)x\)", out[1])
    assert [v[0] for v in variants] == ["fp32/torch", "fp32/fused", "bf16/torch", "bf16/fused"]
    assert all(float(ms) > 0 for _, ms, _ in variants) and variants[0][2] == "1.00"
    assert forward_kl.NATIVE is True
