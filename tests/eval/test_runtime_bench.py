"""The runtime bench's layer-capture timing runs on a real (tiny) target."""

from speclab.eval.runtime_bench import capture_ms
from speclab.speculator.eagle3 import default_layer_ids
from speclab.speculator.target.builders import tiny_llama


def test_capture_timing_passes_the_feature_families_layers_at_every_width():
    target = tiny_llama()
    report = capture_ms(target, [1, 3])
    assert sorted(report) == [1, 3]
    for row in report.values():
        assert row["layer_ids"] == list(default_layer_ids(target.lean.config.num_layers))
        assert row["plain_ms"] > 0 and row["layers_ms"] > 0
