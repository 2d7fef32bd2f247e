"""`speclab serve` and `speclab bench --engine llama.cpp`: an export served, and measured, by
llama.cpp on this machine.

The fast tests check what is decided before the engine runs: a llama_cpp.json read as data, the
line `speclab export` ends with, llama.cpp's counters read as speclab's figures. The slow ones
decode with the built engine (skipped without it, a failure under SPECLAB_REQUIRE_LLAMA_CPP=1,
as in test_llama_cpp.py)."""

import json

import pytest
import torch
from test_export_layouts import SPECS, exported
from test_llama_cpp import K, decode_both, engine, smollm2_export  # noqa: F401 - `engine` is a fixture

from speclab.eval.engine import Generation
from speclab.eval.metrics import tokens_per_pass
from speclab.eval.peers import MethodRun
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main
from speclab.sweeps.engines import llama_cpp, llama_cpp_bench, serve


def llama_export_dir(tmp_path, **fields):
    root = tmp_path / "served"
    root.mkdir()
    (root / "draft.gguf").write_bytes(b"GGUF")
    (tmp_path / "target.gguf").write_bytes(b"GGUF")
    description = {"draft": "draft.gguf", "target_gguf": str(tmp_path / "target.gguf"), "spec_type": "draft-eagle3",
                   "k": 5, **fields}
    (root / llama_cpp.LLAMA_CPP_FILE).write_text(json.dumps(description))
    return root


def test_a_llama_cpp_export_is_read_field_by_field(tmp_path):
    found = serve.read_export(llama_export_dir(tmp_path))
    assert (found.k, found.spec_type, found.draft_gguf.name) == (5, "draft-eagle3", "draft.gguf")
    assert found.server_args()[-6:] == ["--spec-draft-n-max", "5", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]


@pytest.mark.parametrize("fields, message", [
    ({"spec_type": "draft-anything; rm -rf /"}, "spec_type"),
    ({"k": 0}, "k must be a positive integer"),
    ({"k": True}, "k must be a positive integer"),
    ({"draft": "../../elsewhere.gguf"}, "draft must name a file in the export"),
    ({"target_gguf": "/nowhere/target.gguf"}, "does not exist"),
])
def test_a_bad_llama_cpp_export_is_refused_in_one_line(tmp_path, fields, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        serve.read_export(llama_export_dir(tmp_path, **fields))


def test_a_file_that_is_no_description_says_how_to_make_one(tmp_path):
    root = llama_export_dir(tmp_path)
    (root / llama_cpp.LLAMA_CPP_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="export again with `speclab export --engine llama.cpp`"):
        serve.read_export(root)


def test_export_ends_with_how_to_serve_it_or_why_it_cannot(tmp_path, capsys):
    target = tiny_llama(seed=0, num_layers=4)
    _, out = exported(tmp_path / "a", target, "eagle3")
    assert serve.serve_hint(out).endswith(f"serve {out}")
    _, out = exported(tmp_path / "b", target, "eagle3", spec=dict(SPECS["eagle3"], num_layers=2))
    assert "llama.cpp cannot serve it as measured: llama.cpp's EAGLE-3 has one decoder layer" in serve.serve_hint(out)
    _, out = exported(tmp_path / "e", target, "eagle3", spec=dict(SPECS["eagle3"], norm_output=True))
    assert json.loads((out / "export.json").read_text())["layout"] == "speculators_eagle3"  # vLLM's: EAGLE-3.1
    assert "llama.cpp's EAGLE-3 carries the pre-norm state" in serve.serve_hint(out)
    _, out = exported(tmp_path / "c", target, "mlp")
    assert serve.serve_hint(out) is None  # llama.cpp has no layout for the family: nothing to say here
    assert main(["export", "--best", "--runs", str(tmp_path / "a" / "runs"), "--out", str(tmp_path / "d")]) == 0
    assert f"serve {tmp_path / 'd'}" in capsys.readouterr().out.splitlines()[-1]


def test_serving_a_family_llama_cpp_does_not_run_is_refused(tmp_path, monkeypatch, capsys):
    _, out = exported(tmp_path, tiny_llama(seed=0, num_layers=4), "mlp")
    monkeypatch.setattr(llama_cpp, "build", lambda **_: None)  # no engine needed to refuse
    assert main(["serve", str(out), "--dry-run"]) == 2
    assert "llama.cpp has no layout for the mlp family" in capsys.readouterr().err
    assert not out.with_name(out.name + serve.SERVED_SUFFIX).exists()


def test_llama_cpp_counters_become_passes_and_acceptance_length():
    """predicted_n 10 with 6 drafts accepted: 1 prefill + 3 decode passes, 9 tokens over 3 passes."""
    answer = {"tokens": list(range(10)), "timings": {"predicted_n": 10, "predicted_ms": 80.0, "prompt_ms": 20.0,
                                                     "draft_n": 12, "draft_n_accepted": 6}}
    gen = llama_cpp_bench.generation_of(answer)
    assert (gen.new_tokens, gen.steps, gen.drafted_tokens, gen.seconds) == (10, 4, 12, pytest.approx(0.1))
    assert tokens_per_pass(MethodRun([gen]).records()) == pytest.approx(3.0)
    plain = llama_cpp_bench.generation_of({"tokens": [1] * 10, "timings": {"predicted_n": 10, "predicted_ms": 90.0,
                                                                           "prompt_ms": 10.0}})
    assert plain.steps == 10 and tokens_per_pass(MethodRun([plain]).records()) == 1.0


def test_plain_tokens_agree_across_engines_up_to_the_end_token():
    assert llama_cpp_bench._same_text([5, 6, 7], [5, 6, 7, 2])  # speclab keeps the EOS it stopped at
    assert llama_cpp_bench._same_text([5, 6, 7], [5, 6, 7])
    assert not llama_cpp_bench._same_text([5, 6, 7], [5, 6, 8, 2])
    assert not llama_cpp_bench._same_text([5, 6], [5, 6, 7, 8])


def test_the_engine_report_judges_each_engine_against_its_own_plain_decoding():
    def run(tokens_seconds_steps):
        return MethodRun([Generation(list(range(n)), s, steps, n) for n, s, steps in tokens_seconds_steps])

    runs = {"speclab plain": run([(10, 1.0, 10), (10, 1.0, 10)]),
            "speclab eagle3 k=4": run([(10, 0.5, 5), (10, 0.5, 5)]),
            "llama.cpp plain": run([(10, 2.0, 10), (10, 2.0, 10)]),
            "llama.cpp draft-eagle3 k=4": run([(10, 0.5, 4), (10, 0.5, 4)])}
    report = llama_cpp_bench.engine_report(runs, "speclab eagle3 k=4", 4, resamples=50)
    rows = report["methods"]
    assert rows["speclab eagle3 k=4"]["speedup_total"] == pytest.approx(2.0)
    assert rows["llama.cpp draft-eagle3 k=4"]["speedup_total"] == pytest.approx(4.0)
    assert rows["llama.cpp draft-eagle3 k=4"]["acceptance_length"] == pytest.approx(3.0)  # 9 tokens, 3 passes
    assert rows["llama.cpp draft-eagle3 k=4"]["accepted"] == 12
    assert report["llama_plain_vs_speclab_plain"]["ratio"] == pytest.approx(0.5)
    assert report["plain_tokens_agree"] == 2


def test_the_llama_cpp_bench_takes_one_greedy_draft(tmp_path, capsys):
    assert main(["bench", "--engine", "llama.cpp", "--speculator", str(tmp_path), "--speculator", str(tmp_path)]) == 2
    assert "exactly one --speculator" in capsys.readouterr().err
    assert main(["bench", "--engine", "llama.cpp", "--speculator", str(tmp_path), "--temperature", "0.7"]) == 2
    assert "greedy chains" in capsys.readouterr().err


# --- with the engine ---------------------------------------------------------------------------


def gguf_tensors(engine, path) -> dict:
    """name -> raw bytes of each tensor, read by the engine's own gguf-py (metadata such as the
    model's name, taken from its folder, may differ)."""
    import sys

    sys.path.insert(0, str(engine.root / "src" / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    return {t.name: bytes(t.data.tobytes()) for t in GGUFReader(str(path)).tensors}


@pytest.mark.slow
def test_serve_turns_the_vllm_export_into_a_llama_cpp_one_that_decodes_losslessly(tmp_path, engine, capsys):
    """The demo's path: an eagle3 exported in vLLM's layout, served by `speclab serve`."""
    speculator, llama_out = smollm2_export(tmp_path)  # the reference: the llama.cpp layout written at export
    vllm_out = tmp_path / "vllm"
    assert main(["export", "--best", "--runs", str(tmp_path / "runs"), "--out", str(vllm_out)]) == 0
    assert main(["serve", str(vllm_out), "--dry-run", "--port", "18080"]) == 0
    printed = capsys.readouterr().out
    served = serve.read_export(vllm_out.with_name("vllm" + serve.SERVED_SUFFIX))
    assert f"--port 18080" in printed and str(served.draft_gguf) in printed
    assert gguf_tensors(engine, served.draft_gguf) == gguf_tensors(engine, llama_out / "draft.gguf")  # same weights
    plain, spec = decode_both(engine, served.target_gguf, served.server_args())
    assert [s["tokens"] for s in spec] == [p["tokens"] for p in plain]
    assert all(s["timings"]["draft_n"] > 0 for s in spec)


@pytest.mark.slow
def test_bench_measures_one_draft_in_both_engines(tmp_path, engine, capsys):
    _, out = smollm2_export(tmp_path)
    report_file = tmp_path / "bench.json"
    assert main(["bench", "--engine", "llama.cpp", "--speculator", str(out), "--limit", "2", "--max-new-tokens", "16",
                 "--k", str(K), "--json", str(report_file)]) == 0
    report = json.loads(report_file.read_text())
    rows = report["scorings"][0]["methods"]
    expected = {"speclab plain", "speclab eagle3 k=4", "llama.cpp plain", "llama.cpp draft-eagle3 k=4",
                *(f"llama.cpp {kind}" for kind in llama_cpp_bench.NGRAM_TYPES)}
    assert set(rows) == expected
    for name, row in rows.items():  # each engine's greedy decoding is its own plain decoding
        assert row["lossless"]["mismatches"] == 0 and row["lossless"]["checked_prompts"] == 2, name
    assert rows["llama.cpp draft-eagle3 k=4"]["drafted"] > 0  # llama.cpp's own counters: it drafted
    assert rows["llama.cpp plain"]["acceptance_length"] == 1.0
    assert "llama.cpp plain runs" in capsys.readouterr().out
