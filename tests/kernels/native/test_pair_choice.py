"""The bf16 GEMM path a machine takes: measured once among those it has by the machine
profile's measuring step, then remembered and overridable."""

import pytest

from speclab.kernels import native
from speclab.kernels.native import pair_choice, wide_gemm
from speclab.kernels.native.bf16 import bf16_paths
from speclab.kernels.native.ops import NativeOps
from speclab.kernels.util import machine_records
from speclab.speculator.target import profile
from speclab.speculator.target.measure import measure_profile


class FakeLib:
    """A build that says which bf16 products it has; nothing else is called."""

    speclab_build = "fake-build"  # what the profile's record is keyed by (native.lib_build)

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
    monkeypatch.delenv("SPECLAB_WIDE_GEMM", raising=False)
    monkeypatch.setattr(profile, "_measured", {})  # a new process
    # The step measures the wide engines after the path: on a stand-in build, never faster.
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: {
        name: {str(r): 1.0 for r in wide_gemm.PROBE_ROWS} for name in ("native", "torch", "amx")})


def fastest_bf16_path(lib) -> str:
    """The measuring step (each call a new process: the record, or a measurement), then the
    path a decoder built on `lib` reads from the profile it recorded."""
    measure_profile(lib)
    return profile.kernel_choices(lib).bf16_path


def test_the_fastest_path_is_measured_once_and_remembered(fresh, monkeypatch):
    calls = []
    ms = {"widened": 2.0, "pairs": 1.5}
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: calls.append(1) or ms)
    assert fastest_bf16_path(FakeLib(True)) == "pairs"
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: pytest.fail("measured twice"))
    assert fastest_bf16_path(FakeLib(True)) == "pairs" and calls == [1]
    record = machine_records.read(profile.RECORDS, profile.record_key(FakeLib(True)))
    assert record["bf16"]["probe_ms"] == ms


def test_amx_tiles_are_taken_by_the_override_only(fresh, monkeypatch):
    """Where a build has them, they are neither measured nor chosen unless asked for."""
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"widened": 2.0, "pairs": 3.0})
    assert fastest_bf16_path(FakeLib(True, amx=True)) == "widened"
    monkeypatch.setenv(pair_choice.OVERRIDE, "amx")
    assert fastest_bf16_path(FakeLib(True, amx=True)) == "amx"


def test_a_record_that_does_not_fit_this_build_is_measured_again(fresh, monkeypatch):
    """A corrupt record, and one made among other paths (a build without bf16 pairs), are
    measured again among the paths this build has."""
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"widened": 2.0, "pairs": 1.0})
    lib = FakeLib(True)
    recorded = profile.empty_profile(lib).to_json()
    machine_records.write(profile.RECORDS, profile.record_key(lib), {**recorded, "bf16": {"path": "yes"}})
    assert fastest_bf16_path(lib) == "pairs"
    machine_records.write(profile.RECORDS, profile.record_key(lib),
                          {**recorded, "bf16": {"path": "widened", "probe_ms": {"widened": 2.0}}})
    assert fastest_bf16_path(lib) == "pairs"


def test_a_cache_that_cannot_be_written_still_gives_the_choice(fresh, monkeypatch):
    def refuse(*args):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(machine_records, "write", refuse)
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {"pairs": 1.0, "widened": 2.0})
    assert fastest_bf16_path(FakeLib(True)) == "pairs"


def test_one_path_no_measurement_and_the_override(fresh, monkeypatch):
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: pytest.fail("nothing to measure"))
    assert fastest_bf16_path(FakeLib(False)) == "widened"
    monkeypatch.setenv(pair_choice.OVERRIDE, "pairs")
    assert fastest_bf16_path(FakeLib(True, amx=True)) == "pairs"
    monkeypatch.setenv(pair_choice.OVERRIDE, "yes")
    with pytest.raises(ValueError, match="SPECLAB_BF16_PATH must be one of widened, pairs, amx"):
        fastest_bf16_path(FakeLib(True))


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
