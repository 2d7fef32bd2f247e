"""Wide passes on torch's bf16 GEMM: the per-machine choice, and the decoder taking it only
where its caller allows (never for a batch-invariant pass).

The wide path's rows differ from the native kernels' by bf16 rounding of each linear's
input and output (relative 2^-9 each). The tests' tiny bf16 target has init_std 0.02 (the
default 0.5 makes a random 2-layer model amplify any rounding by 10-30x): on it the largest
logit difference measured 0.35-0.53% of the largest logit over five inputs, the layer-1
state 0.22-0.41%. WIDE_REL = 2% passes that and fails on a real defect (a skipped residual,
a wrong weight or layer order moves them by O(1)). Greedy tokens are not compared: a random
model's logits are near ties, and 0-2.5% of its argmaxes moved.
"""

import pytest
import torch

from speclab.kernels import native
from speclab.kernels.native import wide_gemm
from speclab.kernels.native.wide_gemm import WideChoice, WideLinear
from speclab.kernels.util import machine_records
from speclab.speculator.target import profile
from speclab.speculator.target.measure import measure_profile
from speclab.speculator.target.builders import tiny_llama

WIDE_REL = 0.02
pytestmark = pytest.mark.skipif(native.load() is None, reason="no C compiler: no native kernels to choose against")


class FakeOps:
    name = "native"
    lib = "fake-lib"
    bf16_path = "amx"


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECLAB_WIDE_GEMM", raising=False)
    monkeypatch.setattr(profile, "_measured", {})  # a new process


def wide_choice(ops) -> WideChoice:
    """The measuring step for the ops' build and bf16 path (each call a new process: the
    record, or a measurement), then the choice a decoder built on them reads."""
    measure_profile(ops.lib, bf16_path=ops.bf16_path)
    return profile.kernel_choices(ops.lib, bf16_path=ops.bf16_path).wide


def write_record(lib, path: str, wide: dict) -> None:
    """A profile record for `lib` holding `wide` as its choice against bf16 path `path`."""
    record = {**profile.empty_profile(lib).to_json(), "wide": {path: wide}}
    machine_records.write(profile.RECORDS, profile.record_key(lib), record)


def probe(ratios: dict[int, float]) -> dict:
    """time_paths' answer where torch takes `ratio` of the native time at each width."""
    return {"native": {str(r): 1.0 for r in wide_gemm.PROBE_ROWS},
            "torch": {str(r): ratios.get(r, 1.2) for r in wide_gemm.PROBE_ROWS}}


def test_each_part_starts_at_the_first_width_that_clearly_pays(fresh, monkeypatch):
    # The head needs torch under 0.8x native, the layers under 0.6x (the wide path's Python cost).
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: probe({16: 0.9, 32: 0.7, 64: 0.5, 128: 0.3}))
    assert wide_choice(FakeOps()) == WideChoice(head_rows=32, layer_rows=64)


def test_a_machine_where_torch_never_pays_keeps_the_native_gemm(fresh, monkeypatch):
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: probe({}))
    choice = wide_choice(FakeOps())
    assert choice == WideChoice() and not choice.used


def test_the_choice_is_measured_once_and_remembered(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: calls.append(1) or probe({16: 0.5}))
    assert wide_choice(FakeOps()) == WideChoice(16, 16)
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: pytest.fail("measured twice"))
    assert wide_choice(FakeOps()) == WideChoice(16, 16) and calls == [1]


def test_a_record_that_never_probed_this_builds_amx_engine_is_measured_again(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: calls.append(1) or probe({16: 0.5}))
    assert wide_choice(FakeOps()).engine == "torch"  # a build (or process) without the tiles
    monkeypatch.setattr(wide_gemm, "_has_amx", lambda lib: True)  # the same machine's next process has them
    with_amx = probe({16: 0.5})
    with_amx["amx"] = {"16": 0.3, "32": 0.2, "64": 0.2, "128": 0.1}
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: calls.append(2) or with_amx)
    assert wide_choice(FakeOps()) == WideChoice(16, 16, "amx") and calls == [1, 2]
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: pytest.fail("measured a third time"))
    assert wide_choice(FakeOps()).engine == "amx"


def test_a_record_answers_only_for_the_library_it_measured(fresh, monkeypatch):
    """A test's haswell build once wrote this machine's record without the AMX engine."""
    haswell = type("HaswellOps", (FakeOps,), {"lib": "haswell-lib"})()
    calls = []
    monkeypatch.setattr(wide_gemm, "time_paths",
                        lambda lib, path: calls.append(lib) or probe({16: 0.5} if lib == FakeOps.lib else {}))
    assert wide_choice(haswell) == WideChoice()
    assert wide_choice(FakeOps()) == WideChoice(16, 16) and calls == ["haswell-lib", FakeOps.lib]


@pytest.mark.skipif(native.load() is None or native.load("haswell") is None or native.MARCH == "haswell",
                    reason="needs two native builds (SPECLAB_NATIVE_MARCH=haswell makes the default the haswell one)")
def test_each_native_build_names_itself():
    assert native.lib_build(native.load()) == native.build_id()
    assert native.lib_build(native.load("haswell")) == native.build_id("haswell") != native.build_id()


def test_the_amx_engine_is_taken_where_faster_and_its_layers_need_no_python_margin(fresh, monkeypatch):
    """Its layers are one native call, like the head: both start where it is under 0.8x the
    decoding path. torch faster at the widest probe takes it back, with its own margins."""
    ms = probe({16: 0.9, 32: 0.7, 64: 0.5, 128: 0.3})
    ms["amx"] = {"16": 0.9, "32": 0.7, "64": 0.4, "128": 0.2}
    assert wide_gemm.choose(ms) == WideChoice(32, 32, "amx")
    ms["amx"]["128"] = 0.35
    assert wide_gemm.choose(ms) == WideChoice(32, 64, "torch")


def test_a_record_of_the_amx_engine_on_a_machine_without_it_is_measured_again(fresh, monkeypatch):
    write_record(FakeOps.lib, "amx", {"engine": "amx", "head_rows": 16, "layer_rows": 16})
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: probe({128: 0.5}))
    assert wide_choice(FakeOps()) == WideChoice(128, 128, "torch")


def test_the_choice_is_remembered_per_native_path(fresh, monkeypatch):
    """Torch's GEMM is measured against the native path in use: a choice made against AMX
    tiles must not be read back for vdpbf16ps (SPECLAB_BF16_PATH=pairs), nor the reverse."""
    measured = []
    monkeypatch.setattr(wide_gemm, "time_paths",
                        lambda lib, path: measured.append(path) or probe({16: 0.5} if path == "pairs" else {}))
    pairs = FakeOps()
    pairs.bf16_path = "pairs"
    assert wide_choice(FakeOps()) == WideChoice()
    assert wide_choice(pairs) == WideChoice(16, 16)
    assert measured == ["amx", "pairs"]


def test_a_corrupt_record_is_measured_again(fresh, monkeypatch):
    write_record(FakeOps.lib, "amx", {"head_rows": "all", "layer_rows": -3})
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: probe({128: 0.5}))
    assert wide_choice(FakeOps()) == WideChoice(128, 128)


def test_the_override_and_its_errors(fresh, monkeypatch):
    monkeypatch.setattr(wide_gemm, "time_paths", lambda lib, path: pytest.fail("an override measures nothing"))
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "0")
    assert wide_choice(FakeOps()) == WideChoice()
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "24")
    assert wide_choice(FakeOps()) == WideChoice(24, 24)
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "yes")
    with pytest.raises(ValueError, match="SPECLAB_WIDE_GEMM"):
        wide_choice(FakeOps())


def test_the_torch_backend_never_takes_it(fresh, monkeypatch):
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "1")
    assert tiny_llama(dtype="bf16", lean_backend="torch").lean.wide == WideChoice()
    assert tiny_llama(dtype="fp32").lean.wide == WideChoice()  # fp32 weights would be rounded to bf16


def test_wide_linear_adds_its_bias_and_accumulates_in_place():
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(5, 8, generator=g), torch.randn(5, generator=g), torch.randn(3, 8, generator=g)
    linear = WideLinear(w, b)
    want = x.bfloat16().float() @ w.bfloat16().float().T + b
    assert torch.allclose(linear(x), want, rtol=1e-2, atol=1e-2)
    residual = torch.ones(3, 5)
    assert linear(x, out=residual) is residual and torch.allclose(residual, want + 1, rtol=1e-2, atol=1e-2)


AMX = native.load() is not None and bool(native.load().lean_amx())


@pytest.fixture(params=["torch", pytest.param("amx", marks=pytest.mark.skipif(not AMX, reason="no AMX tiles here"))])
def decoders(request, monkeypatch):
    """The tiny bf16 target twice: wide passes forced from 1 row (on each engine), and never."""
    monkeypatch.setattr(wide_gemm, "_has_amx", lambda lib: request.param == "amx")
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "1")
    wide = tiny_llama(dtype="bf16", lean_backend="native", init_std=0.02).lean
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "0")
    narrow = tiny_llama(dtype="bf16", lean_backend="native", init_std=0.02).lean
    assert wide.wide == WideChoice(1, 1, request.param) and narrow.wide == WideChoice()
    return wide, narrow


def run(decoder, ids, invariant, rows=1):
    cache = decoder.new_cache(rows=rows, max_len=ids.shape[1])
    return decoder.forward(ids, cache, layer_ids=(1,), logits_for="all", invariant=invariant)


def test_an_invariant_pass_never_takes_the_wide_gemm(decoders):
    wide, narrow = decoders
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    a, b = run(wide, ids, invariant=True, rows=2), run(narrow, ids, invariant=True, rows=2)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.layers[1], b.layers[1])


def test_a_wide_pass_computes_the_same_model_to_bf16_rounding(decoders):
    wide, narrow = decoders
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(2))
    a, b = run(wide, ids, invariant=False, rows=2), run(narrow, ids, invariant=False, rows=2)
    assert not torch.equal(a.logits, b.logits)  # it did take the other GEMM
    assert (a.logits - b.logits).abs().max() <= WIDE_REL * b.logits.abs().max()
    assert (a.layers[1] - b.layers[1]).abs().max() <= WIDE_REL * b.layers[1].abs().max()
