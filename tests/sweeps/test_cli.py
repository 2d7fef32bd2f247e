import json
import sys
import types

import pytest
from test_export import TINY_TARGET_CONFIG, make_speculator_run
from test_run_rows import make_run

from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main


@pytest.fixture(scope="module")
def tiny_target():
    return tiny_llama(seed=0)


@pytest.fixture
def runs(tmp_path, tiny_target):
    root = tmp_path / "runs"
    make_speculator_run(root, "good", tiny_target, speedup=1.4)
    make_run(root, "lossy", speedup=2.0, mismatches=3)
    make_run(root, "crashed", status="failed")
    return root


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_runs_prints_the_table_and_json(runs, capsys):
    assert main(["runs", "--runs", str(runs)]) == 0
    table = capsys.readouterr().out
    # Runs that count (completed, lossless, measured) first, by speedup: the lossy run's 2.0x
    # and the crashed run never rank above the good one.
    assert table.index("good") < table.index("lossy") and table.index("good") < table.index("crashed")
    assert main(["runs", "--runs", str(runs), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["run_id"]: r["status"] for r in rows} == {"good": "completed", "lossy": "completed",
                                                         "crashed": "failed"}
    assert next(r for r in rows if r["run_id"] == "good")["result"]["throughput"]["speedup"] == 1.4


@pytest.mark.parametrize("argv, message", [
    (["runs", "--runs", "{tmp}/missing"], "does not exist"),
    (["runs", "--runs", "{tmp}"], "no runs"),
    (["export", "--best", "--metric", "loss", "--out", "{tmp}/x", "--runs", "{tmp}"], "invalid choice"),
    (["export", "--best", "--out", "{tmp}/x", "--runs", "{tmp}/missing"], "does not exist"),
    (["runs", "--bogus"], "unrecognized arguments"),
    (["sweep", "tiny"], "unknown sweep 'tiny'; valid: arch"),
    (["sweep"], "usage: speclab sweep NAME"),
    (["dashboard", "--runs", "{tmp}/missing"], "does not exist"),
    ([], "required"),
])
def test_user_mistakes_exit_2_with_one_line(tmp_path, capsys, argv, message):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert message in _one_error_line(capsys)


def test_export_writes_the_best_lossless_run(tmp_path, runs, capsys):
    out = tmp_path / "best"
    assert main(["export", "--best", "--metric", "speedup", "--out", str(out), "--runs", str(runs)]) == 0
    assert json.loads((out / "export.json").read_text())["run_id"] == "good"  # not the faster lossy run
    assert str(out) in capsys.readouterr().out


def test_export_without_an_eligible_run_exits_2(tmp_path, capsys):
    make_run(tmp_path / "runs", "lossy", mismatches=1)
    argv = ["export", "--best", "--out", str(tmp_path / "best"), "--runs", str(tmp_path / "runs")]
    assert main(argv) == 2
    assert "no completed, lossless run" in _one_error_line(capsys)


def test_train_forwards_its_arguments_to_the_hydra_entry(monkeypatch):
    seen = []
    fake = types.ModuleType("speclab.sweeps.train")
    fake.main = lambda: seen.append(list(sys.argv[1:]))
    monkeypatch.setitem(sys.modules, "speclab.sweeps.train", fake)
    saved_argv = list(sys.argv)
    assert main(["train", "-m", "speculator=mlp", "training.max_steps=2"]) == 0
    assert seen == [["-m", "speculator=mlp", "training.max_steps=2"]]
    assert sys.argv == saved_argv


# --- eval ---------------------------------------------------------------------------------


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "def add(a, b):"}, {"messages": [{"role": "user", "content": "hello"}]},
             {"prompt": "never read: --limit 2"}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_eval_scores_a_run_directory_on_the_recorded_target(tmp_path, runs, prompts_file, capsys):
    out = tmp_path / "eval.json"
    argv = ["eval", str(runs / "good"), "--prompts", str(prompts_file), "--json", str(out),
            "--k", "2", "--max-new-tokens", "4", "--limit", "2"]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["num_prompts"] == 2 and report["target_config"] == TINY_TARGET_CONFIG
    assert {k: report["lossless"][k] for k in ("checked_prompts", "mismatches")} == {"checked_prompts": 2, "mismatches": 0}
    assert report["acceptance"]["k"] == 2 and report["throughput"]["spec_tok_s"] > 0
    assert "acceptance length" in capsys.readouterr().out


def test_eval_applies_target_overrides(tmp_path, runs, prompts_file, monkeypatch):
    seen = {}
    import speclab.eval.benchmark as benchmark

    def fake_score(target, speculator, prompts, max_new_tokens, k, progress=True, peer=False, tree=None, categories=None):
        seen.update(target=target.name, prompts=len(prompts), k=k)
        return {"acceptance": {}, "throughput": {}, "lossless": {}, "per_prompt": []}

    monkeypatch.setattr(benchmark, "score", fake_score)
    assert main(["eval", str(runs / "good"), "--prompts", str(prompts_file)]) == 0
    assert seen == {"target": "tiny-llama-seed0", "prompts": 3, "k": 2}  # recorded config and method (a chain of 2)
    assert main(["eval", str(runs / "good"), "--prompts", str(prompts_file), "target.seed=5", "--k", "3"]) == 0
    assert seen == {"target": "tiny-llama-seed5", "prompts": 3, "k": 3}


@pytest.fixture
def fake_score(monkeypatch):
    import speclab.eval.benchmark as benchmark

    calls = []

    def score(target, speculator, prompts, max_new_tokens, k, progress=True, peer=False, tree=None, categories=None):
        calls.append((k, tree))
        return {"acceptance": {}, "throughput": {}, "lossless": {}, "per_prompt": []}

    monkeypatch.setattr(benchmark, "score", score)
    return calls


def _record_method(run_dir, chosen):
    path = run_dir / "result.json"
    result = json.loads(path.read_text())
    result["method"] = {"chosen": chosen}
    path.write_text(json.dumps(result))
    return path


def test_eval_rescores_with_the_method_the_run_was_scored_with(runs, prompts_file, fake_score, capsys):
    from speclab.eval.tree import TreeConfig

    path = _record_method(runs / "good", {"kind": "tree", "shape": "union", "depth": 8, "top_k": 4, "budget": 10})
    assert main(["eval", str(runs / "good"), "--prompts", str(prompts_file)]) == 0
    assert fake_score[-1] == (8, TreeConfig("union", 8, 4, 10))
    assert f"method: tree union depth 8 top_k 4 budget 10 (as scored: {path})" in capsys.readouterr().out
    assert main(["eval", str(runs / "good"), "--prompts", str(prompts_file), "--k", "3"]) == 0
    assert fake_score[-1] == (3, None) and "method: chain k=3 (--k)" in capsys.readouterr().out


def test_an_exports_recorded_method_is_the_one_its_result_json_names(tmp_path, runs, prompts_file, fake_score, capsys):
    _record_method(runs / "good", {"kind": "chain", "k": 6})
    out = tmp_path / "best"
    assert main(["export", "--best", "--out", str(out), "--runs", str(runs)]) == 0
    assert main(["eval", str(out), "--prompts", str(prompts_file)]) == 0
    assert fake_score[-1] == (6, None) and f"(as scored: {out / 'result.json'})" in capsys.readouterr().out


@pytest.mark.parametrize("chosen", [{"kind": "tree", "shape": "union", "depth": "8", "top_k": 4, "budget": 10},
                                    {"kind": "tree", "shape": "spiral", "depth": 8, "top_k": 4, "budget": 10},
                                    {"kind": "tree", "depth": 8}, {"kind": "chain", "k": -1}])
def test_a_malformed_recorded_method_is_refused_in_one_line(runs, prompts_file, fake_score, capsys, chosen):
    _record_method(runs / "good", chosen)
    assert main(["eval", str(runs / "good"), "--prompts", str(prompts_file)]) == 2
    assert "its recorded method is malformed" in _one_error_line(capsys) and not fake_score


@pytest.mark.parametrize("target_config, message", [
    ({"_target_": "os.system", "command": "echo pwned"}, "refusing target _target_"),
    ({"_target_": "speclab.speculator.target.builders.shutil.rmtree", "path": "x"}, "refusing target _target_"),
    ({"_target_": "speclab.speculator.target.builders.convert_gguf", "gguf": "a", "out_dir": "b"},
     "refusing target _target_"),
    ({**TINY_TARGET_CONFIG, "dtype": {"_target_": "os.getcwd"}}, "refusing target config key"),
])
def test_eval_refuses_targets_that_are_not_target_builders(runs, prompts_file, capsys, target_config, message):
    config_file = runs / "good" / "checkpoints" / "speculator" / "config.json"
    meta = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**meta, "target_config": target_config}))
    assert main(["eval", str(runs / "good"), "--prompts", str(prompts_file)]) == 2
    assert message in _one_error_line(capsys)


@pytest.mark.parametrize("extra, message", [
    (["seed=3"], "target.KEY=VALUE"),
    (["--k", "0"], "--k must be at least 1"),
    (["--json", "no/such/dir/report.json"], "does not exist"),
])
def test_eval_argument_mistakes_exit_2(runs, prompts_file, capsys, extra, message):
    assert main(["eval", str(runs / "good"), "--prompts", str(prompts_file), *extra]) == 2
    assert message in _one_error_line(capsys)


def test_eval_of_a_directory_without_a_checkpoint_exits_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "no speculator checkpoint" in _one_error_line(capsys)


@pytest.mark.parametrize("lines, message", [
    (None, "does not exist"),
    (['{"prompt": "hi", "category": "chat"}', '{"prompt": "x",'], "bad.jsonl:2: not valid JSON"),
    (['{"category": "chat"}'], 'bad.jsonl:1: needs exactly one of "prompt" (str) or "messages" (list)'),
    (['{"prompt": "hi", "category": 3}'], 'bad.jsonl:1: "category" must be a string'),
])
def test_eval_prompts_file_mistakes_name_the_line(tmp_path, runs, capsys, lines, message):
    path = tmp_path / "bad.jsonl"
    if lines is not None:
        path.write_text("\n".join(lines) + "\n")
    assert main(["eval", str(runs / "good"), "--prompts", str(path)]) == 2
    assert message in _one_error_line(capsys)


def test_eval_by_category_and_repeated_scorings(tmp_path, runs, capsys):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "def add(a, b):", "category": "code"}\n{"prompt": "Say hi"}\n')
    out = tmp_path / "eval.json"
    argv = ["eval", str(runs / "good"), "--prompts", str(path), "--set", "math", "--limit", "1", "--k", "2",
            "--max-new-tokens", "4", "--repeat", "3", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    # a line without a category takes the file's name; --limit cuts each source
    assert [r["category"] for r in report["per_prompt"]] == ["code", "math"] and report["num_prompts"] == 2
    assert set(report["by_category"]) == {"code", "math"}
    repeats = report["repeats"]
    assert len(repeats["values"]) == 3 and repeats["interval"][0] <= repeats["median"] <= repeats["interval"][1]
    printed = capsys.readouterr().out
    assert "over 3 scorings in this process: median" in printed and "  math: 1 prompts, speedup" in printed
