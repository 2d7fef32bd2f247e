"""The bf16 GEMM path a machine takes: measured once, then remembered and overridable."""

import pytest

from speclab.speculator import machine_records
from speclab.speculator.runtime import native, pair_choice
from speclab.speculator.runtime.ops import NativeOps


class FakeLib:
    """A build that says whether it has bf16-pair products; nothing else is called."""

    def __init__(self, pairs: bool):
        self.pairs = pairs

    def lean_bf16_dot(self):
        return int(self.pairs)

    def lean_pack_width(self):
        return 32


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECLAB_BF16_PAIRS", raising=False)
    pair_choice.pairs_pay.cache_clear()
    yield
    pair_choice.pairs_pay.cache_clear()


def test_the_faster_path_is_measured_once_and_remembered(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: calls.append(1) or {"pairs": 1.0, "widened": 2.0})
    assert pair_choice.pairs_pay(FakeLib(True)) is True
    pair_choice.pairs_pay.cache_clear()  # a new process: the record, not a new measurement
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: pytest.fail("measured twice"))
    assert pair_choice.pairs_pay(FakeLib(True)) is True and calls == [1]
    record = machine_records.read(pair_choice.RECORDS, pair_choice.RECORD_KEY)
    assert record["probe_ms"] == {"pairs": 1.0, "widened": 2.0}


def test_a_corrupt_record_is_measured_again(fresh, monkeypatch):
    machine_records.write(pair_choice.RECORDS, pair_choice.RECORD_KEY, {"pairs": "yes"})
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"pairs": 3.0, "widened": 2.0})
    assert pair_choice.pairs_pay(FakeLib(True)) is False


def test_a_cache_that_cannot_be_written_still_gives_the_choice(fresh, monkeypatch):
    def refuse(*args):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(machine_records, "write", refuse)
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"pairs": 1.0, "widened": 2.0})
    assert pair_choice.pairs_pay(FakeLib(True)) is True


def test_no_pair_products_no_measurement_and_the_override(fresh, monkeypatch):
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: pytest.fail("nothing to measure"))
    assert pair_choice.pairs_pay(FakeLib(False)) is False
    monkeypatch.setenv("SPECLAB_BF16_PAIRS", "1")
    assert pair_choice.pairs_pay(FakeLib(True)) is True
    pair_choice.pairs_pay.cache_clear()
    monkeypatch.setenv("SPECLAB_BF16_PAIRS", "yes")
    with pytest.raises(ValueError, match="SPECLAB_BF16_PAIRS must be 0 or 1"):
        pair_choice.pairs_pay(FakeLib(True))


def test_pairs_asked_of_a_build_without_them_are_refused():
    with pytest.raises(ValueError, match="no bf16-pair products"):
        NativeOps(FakeLib(False), bf16_pairs=True)


@pytest.mark.skipif(native.load() is None or not native.load().lean_bf16_dot(), reason="no bf16-pair products here")
def test_the_probe_times_both_real_paths():
    ms = pair_choice.time_paths(native.load())
    assert set(ms) == {"pairs", "widened"} and all(v > 0 for v in ms.values())
