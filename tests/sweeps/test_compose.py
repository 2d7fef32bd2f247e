"""`speclab hybrid`: a learned run and a suffix_corpus run made one hybrid checkpoint, which
eval scores (losslessly) like a run's."""

import json

import pytest
import torch
from test_export import TINY_TARGET_CONFIG, make_speculator_run

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main
from speclab.sweeps.export_formats import load_checkpoint


@pytest.fixture(scope="module")
def tiny_target():
    return tiny_llama(seed=0)


def suffix_corpus_run(runs_dir, name, target, target_config=TINY_TARGET_CONFIG):
    suffix = build_speculator("suffix", {"corpus_tokens": 40}, TargetInfo.of(target))
    suffix.use_training_data([[5, 6, 7, 8, 9, 10], [11, 12, 13]])
    suffix.save(runs_dir / name / "checkpoints" / "speculator", extra={"target_config": target_config})
    return suffix


@pytest.fixture
def runs(tmp_path, tiny_target):
    root = tmp_path / "runs"
    learned = make_speculator_run(root, "mlp", tiny_target)
    suffix = suffix_corpus_run(root, "corpus", tiny_target)
    return root, learned, suffix


def test_hybrid_composes_two_runs_into_a_checkpoint_eval_scores_losslessly(tmp_path, runs, tiny_target, capsys):
    root, learned, suffix = runs
    out = tmp_path / "hybrid"
    assert main(["hybrid", "--learned", str(root / "mlp"), "--suffix", str(root / "corpus"), "--out", str(out),
                 "--min-match", "3"]) == 0
    assert "corpus of 2 answers, 9 tokens" in capsys.readouterr().out
    hybrid = load_checkpoint(out, TargetInfo.of(tiny_target))
    assert hybrid.family == "hybrid" and hybrid.config.min_match == 3
    assert all(torch.equal(a, b) for a, b in zip(hybrid.learned.state_dict().values(), learned.state_dict().values()))
    assert torch.equal(hybrid.suffix.corpus_ids, suffix.corpus_ids)
    meta = json.loads((out / "config.json").read_text())
    assert meta["target_config"] == TINY_TARGET_CONFIG and set(meta["composed_of"]) == {"learned", "suffix"}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    report = tmp_path / "eval.json"
    assert main(["eval", str(out), "--prompts", str(prompts), "--k", "3", "--max-new-tokens", "6",
                 "--json", str(report)]) == 0
    assert json.loads(report.read_text())["lossless"]["mismatches"] == 0


def test_a_hybrid_run_gives_its_parts_so_its_rule_changes_without_training(tmp_path, runs, tiny_target):
    root, learned, suffix = runs
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["hybrid", "--learned", str(root / "mlp"), "--suffix", str(root / "corpus"), "--out", str(first)]) == 0
    assert main(["hybrid", "--learned", str(first), "--suffix", str(first), "--out", str(second),
                 "--min-match", "2", "--learned-k", "3"]) == 0
    again = load_checkpoint(second, TargetInfo.of(tiny_target))
    assert (again.config.min_match, again.config.learned_k) == (2, 3)
    assert again.learned.family == "mlp"
    assert all(torch.equal(a, b) for a, b in zip(again.learned.state_dict().values(), learned.state_dict().values()))
    assert torch.equal(again.suffix.corpus_ids, suffix.corpus_ids)


@pytest.mark.parametrize("case, message", [
    ("suffix_is_learned", "must be a suffix drafter"),
    ("learned_is_suffix", "learned family"),
    ("out_exists", "exists: give a new directory"),
    ("other_target", "record different targets"),
    ("no_checkpoint", "holds no speculator checkpoint"),
])
def test_hybrid_mistakes_exit_2_with_one_line_and_write_nothing(tmp_path, runs, tiny_target, capsys, case, message):
    root, _, _ = runs
    learned, suffix, out = root / "mlp", root / "corpus", tmp_path / "hybrid"
    if case == "suffix_is_learned":
        suffix = learned
    elif case == "learned_is_suffix":
        learned = suffix
    elif case == "out_exists":
        out.mkdir()
    elif case == "other_target":
        suffix = root / "other"
        suffix_corpus_run(root, "other", tiny_target, {**TINY_TARGET_CONFIG, "seed": 1})
    else:
        learned = tmp_path
    assert main(["hybrid", "--learned", str(learned), "--suffix", str(suffix), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (out / "config.json").exists() and not out.with_name("hybrid.partial").exists()
