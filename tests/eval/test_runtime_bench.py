"""The runtime bench's prefill and layer-capture timings run on a real (tiny) target."""

from speclab.eval.runtime_bench import capture_ms, prefill_ms
from speclab.speculator.eagle3 import default_layer_ids
from speclab.speculator.target.builders import tiny_llama


def test_capture_timing_passes_the_feature_families_layers_at_every_width():
    target = tiny_llama()
    report = capture_ms(target, [1, 3])
    assert sorted(report) == [1, 3]
    for row in report.values():
        assert row["layer_ids"] == list(default_layer_ids(target.lean.config.num_layers))
        assert row["plain_ms"] > 0 and row["layers_ms"] > 0


def test_prefill_timing_covers_every_length():
    report = prefill_ms(tiny_llama(), [5, 9])
    assert sorted(report) == [5, 9] and all(ms > 0 for ms in report.values())
