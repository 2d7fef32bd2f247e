"""The step breakdown times a real batched step and its GEMMs at the step's shapes."""

import pytest

from speclab.eval.decode_steps import step_breakdown
from speclab.speculator.target.builders import tiny_llama


@pytest.mark.parametrize("rows", [1, 3])
def test_a_step_splits_into_gemms_and_the_rest(rows):
    lean = tiny_llama().lean
    r = step_breakdown(lean, rows, context=12, repeats=2)
    assert r["rows"] == rows and r["step_ms"] > 0 and r["layer_gemms_ms"] > 0 and r["head_ms"] > 0
    assert r["rest_ms"] == pytest.approx(r["step_ms"] - r["layer_gemms_ms"] - r["head_ms"])
    assert r["tok_s"] == pytest.approx(rows / r["step_ms"] * 1e3)
    c = lean.config
    layer_macs = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size
    layer_macs += 3 * c.hidden_size * c.intermediate_size
    macs = rows * (c.num_layers * layer_macs + c.hidden_size * lean.head.out_features)
    assert r["gemm_gmac_s"] == pytest.approx(macs / (r["layer_gemms_ms"] + r["head_ms"]) / 1e6)
