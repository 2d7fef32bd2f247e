"""The bf16 GEMM path a machine takes: measured once among those it has, then remembered and
overridable."""

import pytest

from speclab.kernels import native
from speclab.kernels.native import pair_choice
from speclab.kernels.native.bf16 import bf16_paths
from speclab.kernels.native.ops import NativeOps
from speclab.kernels.util import machine_records


class FakeLib:
    """A build that says which bf16 products it has; nothing else is called."""

    def __init__(self, pairs: bool, amx: bool = False):
        self.pairs, self.amx = pairs, amx

    def lean_bf16_dot(self):
        return int(self.pairs)

    def lean_amx(self):
        return int(self.amx)

    def lean_pack_width(self):
        return 32


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    monkeypatch.delenv(pair_choice.OVERRIDE, raising=False)
    pair_choice.fastest_bf16_path.cache_clear()
    yield
    pair_choice.fastest_bf16_path.cache_clear()


def test_the_fastest_path_is_measured_once_and_remembered(fresh, monkeypatch):
    calls = []
    ms = {"widened": 2.0, "pairs": 1.5}
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: calls.append(1) or ms)
    assert pair_choice.fastest_bf16_path(FakeLib(True)) == "pairs"
    pair_choice.fastest_bf16_path.cache_clear()  # a new process: the record, not a new measurement
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: pytest.fail("measured twice"))
    assert pair_choice.fastest_bf16_path(FakeLib(True)) == "pairs" and calls == [1]
    record = machine_records.read(pair_choice.RECORDS, pair_choice.RECORD_KEY)
    assert record["probe_ms"] == ms


def test_amx_tiles_are_taken_by_the_override_only(fresh, monkeypatch):
    """Where a build has them, they are neither measured nor chosen unless asked for."""
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"widened": 2.0, "pairs": 3.0})
    assert pair_choice.fastest_bf16_path(FakeLib(True, amx=True)) == "widened"
    pair_choice.fastest_bf16_path.cache_clear()
    monkeypatch.setenv(pair_choice.OVERRIDE, "amx")
    assert pair_choice.fastest_bf16_path(FakeLib(True, amx=True)) == "amx"


def test_a_record_that_does_not_fit_this_build_is_measured_again(fresh, monkeypatch):
    """A corrupt record, and one made among other paths (a build without bf16 pairs), are
    measured again among the paths this build has."""
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"widened": 2.0, "pairs": 1.0})
    machine_records.write(pair_choice.RECORDS, pair_choice.RECORD_KEY, {"path": "yes"})
    assert pair_choice.fastest_bf16_path(FakeLib(True)) == "pairs"
    pair_choice.fastest_bf16_path.cache_clear()
    machine_records.write(pair_choice.RECORDS, pair_choice.RECORD_KEY, {"path": "widened", "probe_ms": {"widened": 2.0}})
    assert pair_choice.fastest_bf16_path(FakeLib(True)) == "pairs"


def test_a_cache_that_cannot_be_written_still_gives_the_choice(fresh, monkeypatch):
    def refuse(*args):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(machine_records, "write", refuse)
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"pairs": 1.0, "widened": 2.0})
    assert pair_choice.fastest_bf16_path(FakeLib(True)) == "pairs"


def test_one_path_no_measurement_and_the_override(fresh, monkeypatch):
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: pytest.fail("nothing to measure"))
    assert pair_choice.fastest_bf16_path(FakeLib(False)) == "widened"
    monkeypatch.setenv(pair_choice.OVERRIDE, "pairs")
    assert pair_choice.fastest_bf16_path(FakeLib(True, amx=True)) == "pairs"
    pair_choice.fastest_bf16_path.cache_clear()
    monkeypatch.setenv(pair_choice.OVERRIDE, "yes")
    with pytest.raises(ValueError, match="SPECLAB_BF16_PATH must be one of widened, pairs, amx"):
        pair_choice.fastest_bf16_path(FakeLib(True))


def test_a_path_asked_of_a_build_without_it_is_refused():
    with pytest.raises(ValueError, match="no 'pairs' bf16 path"):
        NativeOps(FakeLib(False), bf16_path="pairs")
    with pytest.raises(ValueError, match="no 'amx' bf16 path.*it has \\['widened', 'pairs'\\]"):
        NativeOps(FakeLib(True), bf16_path="amx")


@pytest.mark.skipif(native.load() is None, reason="no native kernels here")
def test_the_probe_times_every_real_path():
    lib = native.load()
    ms = pair_choice.time_paths(lib)
    assert set(ms) == set(bf16_paths(lib)) & set(pair_choice.CANDIDATES) and all(v > 0 for v in ms.values())


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_run(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("SPECLAB_CACHE", str(blocker))  # every record path lies under a file
    machine_records.remember("probe", ["k"], {"x": 1}, "the probe's answer")
    assert "could not remember the probe's answer" in caplog.text
    assert machine_records.read("probe", ["k"]) is None
