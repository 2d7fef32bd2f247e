"""`training.precision`: fp32 or bf16 autocast, `auto` measured once per machine and remembered."""

import pytest
import torch

from speclab.kernels.util import machine_records
from speclab.training import precision
from speclab.training.precision import choose_precision

CPU = torch.device("cpu")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))


def test_an_explicit_precision_is_taken_without_measuring(fresh, monkeypatch):
    monkeypatch.setattr(precision, "probe_ms", lambda: pytest.fail("an explicit precision measures nothing"))
    for name in ("fp32", "bf16"):
        assert choose_precision(name, CPU) == (name, {"requested": name, "source": "config"})


def test_an_unknown_precision_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"training.precision 'fp16'.*'auto', 'fp32', 'bf16'"):
        choose_precision("fp16", CPU)


@pytest.mark.parametrize("ms, expected", [({"fp32": 2.0, "bf16": 1.0}, "bf16"),
                                          ({"fp32": 1.1, "bf16": 1.0}, "fp32"),  # under MIN_GAIN
                                          ({"fp32": 1.0, "bf16": 9.0}, "fp32")])  # emulated bf16 (AVX2)
def test_auto_takes_bf16_only_for_a_clear_gain_and_remembers(fresh, monkeypatch, ms, expected):
    monkeypatch.setattr(precision, "probe_ms", lambda: ms)
    chosen, record = choose_precision("auto", CPU)
    assert (chosen, record["source"], record["probe_ms"]) == (expected, "measured", ms)
    monkeypatch.setattr(precision, "probe_ms", lambda: pytest.fail("measured twice"))
    chosen, record = choose_precision("auto", CPU)
    assert (chosen, record["source"]) == (expected, "measured earlier on this machine")


def test_a_record_naming_no_precision_is_measured_again(fresh, monkeypatch):
    machine_records.write(precision.RECORDS, precision.RECORD_KEY, {"precision": "fp8"})
    monkeypatch.setattr(precision, "probe_ms", lambda: {"fp32": 3.0, "bf16": 1.0})
    assert choose_precision("auto", CPU)[0] == "bf16"


def test_auto_on_a_gpu_is_fp32_without_measuring(fresh, monkeypatch):
    monkeypatch.setattr(precision, "probe_ms", lambda: pytest.fail("a GPU's default measures nothing"))
    assert choose_precision("auto", torch.device("cuda"))[0] == "fp32"


def test_the_probe_times_both_precisions():
    ms = precision.probe_ms()
    assert set(ms) == {"fp32", "bf16"} and all(v > 0 for v in ms.values())
