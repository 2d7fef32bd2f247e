"""`speclab bench` end to end on the tiny target: every method, the report, the lossless check."""

import json

import pytest
from test_export import TINY_TARGET_CONFIG

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main

DRAFT = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = tiny_llama(seed=0)
    info = TargetInfo.of(target)
    draft = build_speculator("draft_lm", {**DRAFT, "draft_vocab_size": 100}, info)
    mlp = build_speculator("mlp", {"n_predict": 3, "inner_dim": 16}, info)
    draft.save(root / "draft", extra={"target_config": TINY_TARGET_CONFIG})
    mlp.save(root / "mlp", extra={"target_config": TINY_TARGET_CONFIG})
    build_speculator("suffix", {}, info).save(root / "suffix", extra={"target_config": TINY_TARGET_CONFIG})
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "def add(a, b):", "category": "code"}, {"prompt": "hello there", "category": "chat"},
        {"prompt": "Name three colours.", "category": "chat"}]))
    return root


def run_bench(checkpoints, tmp_path, *extra):
    out = tmp_path / "bench.json"
    argv = ["bench", "--speculator", str(checkpoints / "mlp"), "--assistant", str(checkpoints / "draft"),
            "--prompts", str(checkpoints / "prompts.jsonl"), "--max-new-tokens", "8", "--k", "3",
            "--resamples", "20", "--json", str(out), *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_bench_greedy_every_method_is_lossless(checkpoints, tmp_path, capsys):
    report = run_bench(checkpoints, tmp_path, "--tree", "dynamic", "--tree", "static")
    methods = report["overall"]
    assert set(methods) == {"plain", "hf_generate", "hf_prompt_lookup", "hf_assisted", "spec_mlp", "spec_draft_lm",
                            "tree_dynamic_mlp", "tree_static_mlp", "tree_dynamic_draft_lm", "tree_static_draft_lm"}
    for name, row in methods.items():
        assert {k: row["lossless"][k] for k in ("checked_prompts", "mismatches")} == {"checked_prompts": 3, "mismatches": 0}, name
        assert row["ci"]["tok_s"][0] <= row["ci"]["tok_s"][1] and row["ci"]["speedup_total"][0] > 0
        assert row["efficiency"] == pytest.approx(row["speedup_total"] / row["acceptance_length"])
    assert methods["plain"]["speedup_total"] == 1.0 and methods["plain"]["acceptance_length"] == 1.0
    assert methods["spec_mlp"]["timing"]["draft_ms_per_token"] > 0
    assert set(report["sets"]["prompts"]["categories"]) == {"code", "chat"}
    printed = capsys.readouterr().out
    assert "hf_assisted" in printed
    assert "set prompts, category code" in printed and "set prompts, category chat" in printed


def test_bench_methods_do_not_share_a_drafters_memory(checkpoints, tmp_path):
    # A union tree of suffix's one chain drafts what its chain of k does: equal acceptance,
    # unless one method drafted each prompt from the other's output of it (a shared history).
    out = tmp_path / "bench.json"
    assert main(["bench", "--speculator", str(checkpoints / "suffix"), "--prompts", str(checkpoints / "prompts.jsonl"),
                 "--max-new-tokens", "12", "--k", "3", "--tree", "union", "--resamples", "20", "--json", str(out)]) == 0
    methods = json.loads(out.read_text())["overall"]
    assert methods["spec_suffix"]["acceptance_length"] == methods["tree_union_suffix"]["acceptance_length"]


def test_bench_without_peers_runs_only_its_own_methods(checkpoints, tmp_path):
    methods = run_bench(checkpoints, tmp_path, "--no-peers", "--limit", "1")["overall"]
    assert set(methods) == {"plain", "hf_assisted", "spec_mlp", "spec_draft_lm"}


def test_bench_sampling_skips_the_exact_check(checkpoints, tmp_path):
    report = run_bench(checkpoints, tmp_path, "--temperature", "0.7", "--top-k", "20", "--seed", "3", "--limit", "1")
    assert report["config"]["sampling"]["temperature"] == 0.7
    assert report["config"]["runtime"] == tiny_llama(seed=0).runtime  # what decoded the checkpoints' target
    assert all(row["lossless"]["checked_prompts"] == 0 for row in report["overall"].values())


@pytest.mark.parametrize("argv, message", [
    (["bench"], "at least one --speculator"),
    (["bench", "--assistant", "nowhere"], "is not a directory"),
])
def test_bench_mistakes_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bench_marks_the_leader_and_repeats_its_scoring(checkpoints, tmp_path, capsys):
    report = run_bench(checkpoints, tmp_path, "--no-peers", "--limit", "2", "--repeat", "2", "--set", "math")
    assert report["config"]["sets"] == {"math": 2, "prompts": 2} and set(report["sets"]) == {"math", "prompts"}
    methods = report["overall"]
    contenders = [name for name in methods if name != "plain"]
    assert sum(methods[name]["leader"] for name in contenders) == 1 and not methods["plain"]["leader"]
    assert all(m["speedup_ci"] == m["ci"]["speedup_total"] for m in methods.values())
    assert set(report["repeats"]) == set(methods) and report["config"]["repeat"] == 2
    assert all(len(r["values"]) == 2 for r in report["repeats"].values())
    printed = capsys.readouterr().out
    assert "vs leader" in printed and "overall speedup over 2 scorings in this process" in printed


def test_a_second_run_of_a_family_is_named_apart_from_a_family_ending_in_a_digit():
    from speclab.sweeps.bench import _unique

    taken = {"dflash2": None, "dflash": None}
    assert _unique("dflash2", taken) == "dflash2_2" and _unique("dflash", taken) == "dflash_2"
    assert _unique("eagle3", taken) == "eagle3"
    assert _unique("dflash2", {**taken, "dflash2_2": None}) == "dflash2_3"
