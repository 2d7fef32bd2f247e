"""The machine profile: measured in one step, recorded as data, read by constructors that time
nothing, shown by `speclab doctor`."""

import json

import pytest
import torch

from speclab.kernels.util import machine_records, timing
from speclab.speculator.target import dtype_choice
from speclab.kernels import native
from speclab.kernels.native import pair_choice, wide_gemm
from speclab.kernels.native.ops import NativeOps
from speclab.speculator.target import FrozenTarget, measure, profile
from speclab.speculator.target.profile import (Bf16Path, DtypeChoice, MachineProfile, ProfileError, TargetProfile,
                                               WideEngine, target_fingerprint)
from speclab.kernels.native.wide_gemm import WideChoice
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main

NATIVE = pytest.mark.skipif(native.load() is None, reason="no C compiler: no native kernels")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    for env in ("SPECLAB_BF16_PATH", "SPECLAB_WIDE_GEMM"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setattr(profile, "_measured", {})  # a new process


@pytest.fixture
def no_timing(monkeypatch):
    """Every timing the project does raises."""
    def timed(*args, **kwargs):
        raise AssertionError("a constructor timed the machine")

    for module, name in ((timing, "alternated_ms"), (pair_choice, "alternated_ms"), (wide_gemm, "alternated_ms"),
                         (pair_choice, "time_paths"), (wide_gemm, "time_paths"), (dtype_choice, "time_dtypes"),
                         (dtype_choice, "_step_ms"), (measure, "verification_cost")):
        monkeypatch.setattr(module, name, timed)


def sample(build: str = "b1") -> MachineProfile:
    """A profile with every kind of choice in it."""
    ms = {str(r): 1.0 for r in wide_gemm.PROBE_ROWS}
    return MachineProfile(
        "Some CPU", ("avx2", "avx512_bf16"), build, Bf16Path("pairs", {"widened": 2.0, "pairs": 1.25}),
        {"pairs": WideEngine("torch", 32, 64, {"native": ms, "torch": {**ms, "128": 0.5}})},
        {"abc": TargetProfile("tiny", {"lean/auto": DtypeChoice("bf16", {"fp32": 3.0, "bf16": 2.0})},
                              {profile.verify_cost_key(torch.bfloat16, "lean/native/pairs", [1, 2], 3, 128):
                               {1: 4.5, 2: 5.0}})})


def test_the_profile_round_trips_through_its_json():
    p = sample()
    assert MachineProfile.from_json(json.loads(json.dumps(p.to_json()))) == p


@pytest.mark.parametrize("change, names", [
    ({"schema": 0}, "schema"),
    ({"bf16": {"path": "__import__('os')"}}, "bf16.path"),
    ({"wide": {"pairs": {"engine": "torch", "head_rows": "all"}}}, "head_rows"),
    ({"targets": {"abc": {"name": "tiny", "dtype": {"lean/auto": {"fastest": "fp64"}}}}}, "fastest"),
    ({"targets": {"abc": {"name": "tiny", "verify_cost_ms": {"k": {"one": 1.0}}}}}, "token counts"),
])
def test_a_record_off_the_schema_is_refused_naming_the_field(change, names):
    with pytest.raises(ProfileError, match=names):
        MachineProfile.from_json({**sample().to_json(), **change})


def test_a_corrupt_or_stale_record_is_refused_in_one_line_then_measured_again(fresh, monkeypatch, caplog):
    lib = native.load()
    path = machine_records._path(profile.RECORDS, profile.record_key(lib))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert profile.recorded_profile(lib) is None
    machine_records.write(profile.RECORDS, profile.record_key(lib), {**sample(profile.build_of(lib)).to_json(),
                                                                     "schema": 0})
    assert profile.recorded_profile(lib) is None
    machine_records.write(profile.RECORDS, profile.record_key(lib), sample("another build").to_json())
    assert profile.recorded_profile(lib) is None
    refused = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(refused) == 3 and all("\n" not in r.getMessage() for r in refused)
    assert "unreadable" in refused[0].getMessage() and "schema" in refused[1].getMessage()
    assert "another build" in refused[2].getMessage()
    if lib is not None:  # the step measures it again and records it
        monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {p: 1.0 for p in pair_choice.candidates(lib)})
        monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: {
            e: {str(r): 1.0 for r in wide_gemm.PROBE_ROWS} for e in ("native", "torch", "amx")})
        measured = measure.measure_profile(lib)
        assert profile.recorded_profile(lib) == measured and measured.build == native.lib_build(lib)


@NATIVE
def test_constructors_take_the_profile_as_data_and_time_nothing(fresh, no_timing):
    lib = native.load()
    assert NativeOps(lib).bf16_path == "widened"  # the path every build has
    ms = {str(r): 1.0 for r in wide_gemm.PROBE_ROWS}
    given = MachineProfile("m", (), native.lib_build(lib), Bf16Path("widened"),
                           {"widened": WideEngine("torch", 16, 32, {"native": ms, "torch": ms, "amx": ms})})
    target = tiny_llama(dtype="bf16", lean_backend="native")  # no record: the choices needing no measurement
    assert target.lean.ops.bf16_path == "widened" and target.lean.wide == WideChoice()
    handed = FrozenTarget(target.model, target.tokenizer, target.name, lean_backend="native", profile=given)
    assert handed.lean.ops.bf16_path == "widened" and handed.lean.wide == WideChoice(16, 32, "torch")
    profile.remember(given, lib)
    recorded = tiny_llama(dtype="bf16", lean_backend="native")  # the recorded profile, read
    assert recorded.lean.ops.bf16_path == "widened" and recorded.lean.wide == WideChoice(16, 32, "torch")
    assert tiny_llama(dtype="auto").dtype == torch.float32  # no measured dtype for it: fp32, said in one line


def test_the_setup_step_measures_dtype_auto_once_and_the_builder_reads_it(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(dtype_choice, "time_dtypes", lambda *a: calls.append(1) or {"fp32": 2.0, "bf16": 1.0})
    monkeypatch.setattr(pair_choice, "time_paths", lambda lib: {p: 1.0 for p in pair_choice.candidates(lib)})
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: {
        e: {str(r): 1.0 for r in wide_gemm.PROBE_ROWS} for e in ("native", "torch", "amx")})
    measured = measure.prepare_for(tiny_llama, {"dtype": "auto"})
    assert calls == [1]
    monkeypatch.setattr(dtype_choice, "time_dtypes", lambda *a: pytest.fail("measured twice"))
    assert measure.prepare_for(tiny_llama, {"dtype": "auto"}) == measured  # a later run: the record
    target = tiny_llama(dtype="auto")
    assert target.dtype == torch.bfloat16 and target.dtype_choice["source"] == "machine profile"
    entry = measured.target(target_fingerprint(target.model, target.name, "cpu"))
    assert entry.dtype["lean/auto"] == DtypeChoice("bf16", {"fp32": 2.0, "bf16": 1.0})
    assert measure.prepare_for(tiny_llama, {"dtype": "fp32"}) is None  # an fp32 target reads no choice


def test_doctor_prints_every_choice_with_its_probe_timings(fresh, capsys):
    recorded = sample(profile.build_of(None))
    profile.remember(recorded)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for line in ("machine        Some CPU", "cpu flags      avx2 avx512_bf16", f"kernel build   {recorded.build}",
                 "bf16 path      pairs  probe ms widened: 2, pairs: 1.25",
                 "wide engine    torch against pairs: head from 32, layers from 64 rows",
                 "  probe ms     torch: 16: 1, 32: 1, 64: 1, 128: 0.5",
                 "target         tiny (abc)", "  dtype auto   lean/auto: bf16  decode step ms fp32: 3, bf16: 2",
                 "  verify cost  bfloat16 lean/native/pairs: 1: 4.5, 2: 5 ms"):
        assert line in out.splitlines(), line
    assert main(["doctor", "--json"]) == 0
    assert MachineProfile.from_json(json.loads(capsys.readouterr().out)) == recorded


def test_doctor_names_an_override_and_refuses_a_target_it_does_not_measure(fresh, capsys, monkeypatch):
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "0")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "override       SPECLAB_WIDE_GEMM=0" in out and "not measured yet" in out
    assert main(["doctor", "--target", "tiny"]) == 2
    assert "--measure" in capsys.readouterr().err
