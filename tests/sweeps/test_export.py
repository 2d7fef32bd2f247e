import json

import pytest
import torch
from test_run_rows import make_run

from speclab.speculator.base import Features, TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps import export as export_module
from speclab.sweeps.export import export_best
from speclab.sweeps.export_formats import load_checkpoint
from speclab.sweeps.run_rows import NoEligibleRunError, load_rows
from speclab.sweeps.results import weights_sha256

TINY_TARGET_CONFIG = {"_target_": "speclab.speculator.target.builders.tiny_llama", "seed": 0}
SMALL_SPECULATORS = {
    "mlp": {"n_predict": 2, "inner_dim": 16},
    "draft_lm": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32},
    "hydra": {"n_predict": 2, "hidden_size": 16},
    "dflash2": {"block_size": 3, "num_heads": 2, "num_kv_heads": 1, "head_dim": 8, "intermediate_size": 32,
                "selector_rank": 4, "selector_top_k": 3},
}


@pytest.fixture(scope="module")
def tiny_target():
    return tiny_llama(seed=0)


def make_speculator_run(runs_dir, name, target, *, family="mlp", seed=0, **figures):
    """A fake run whose checkpoint is a real saved speculator, as the experiment runner writes it."""
    torch.manual_seed(seed)
    speculator = build_speculator(family, SMALL_SPECULATORS[family], TargetInfo.of(target))
    speculator.save(runs_dir / name / "checkpoints" / "speculator", extra={"target_config": TINY_TARGET_CONFIG})
    make_run(runs_dir, name, family=family, params=speculator.num_params(), checkpoint="checkpoints/speculator",
             weights_sha256=weights_sha256(speculator.state_dict()), **figures)
    return speculator


@pytest.fixture
def runs(tmp_path, tiny_target):
    root = tmp_path / "runs"
    make_speculator_run(root, "slow", tiny_target, seed=1, speedup=1.1, acceptance_length=2.9)
    winner = make_speculator_run(root, "fast", tiny_target, seed=2, speedup=1.7, acceptance_length=2.2)
    make_run(root, "crashed", status="failed")
    return root, winner


def _same_logits(a, b, target) -> bool:
    """Same draft logits on the same teacher-forced features. The mlp export folds vLLM's norm
    into its weights, so the reloaded tensors differ in their last bits: fp32 logits of size
    ~1 through sums of <= 64 terms round to ~1e-6, and 1e-5 still fails any real difference."""
    g = torch.Generator().manual_seed(0)
    feats = Features(torch.randint(0, target.vocab_size, (2, 12), generator=g),
                     torch.randn(2, 12, target.hidden_size, generator=g), torch.ones(2, 12, dtype=torch.bool))
    with torch.no_grad():
        return torch.allclose(a.draft_logits(feats), b.draft_logits(feats), rtol=0, atol=1e-5)


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_export_copies_the_best_runs_speculator_result_and_card(tmp_path, runs, tiny_target):
    root, winner = runs
    out = export_best(root, tmp_path / "best", "speedup")
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "config.json", "export.json", "model.safetensors", "result.json", "speclab.json"]
    assert _same_logits(load_checkpoint(out), winner, tiny_target)
    assert (out / "result.json").read_bytes() == (root / "fast" / "result.json").read_bytes()
    card = (out / "README.md").read_text()
    assert "`fast`" in card and "1.70x" in card and "0.60/0.40" in card and "tiny_llama" in card
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["run_id"] == "fast" and manifest["metric"] == "speedup" and manifest["value"] == 1.7
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in out.iterdir())  # a serving user can read it


def test_export_by_acceptance_length_picks_another_run(tmp_path, runs):
    root, _ = runs
    out = export_best(root, tmp_path / "best", "acceptance_length")
    assert json.loads((out / "export.json").read_text())["run_id"] == "slow"


def test_a_tied_weights_speculator_verifies_too(tmp_path, tiny_target):
    root = tmp_path / "runs"
    drafter = make_speculator_run(root, "drafter", tiny_target, family="draft_lm", speedup=1.5)
    out = export_best(root, tmp_path / "best")
    assert _same_weights(load_checkpoint(out), drafter)


def test_an_earlier_export_is_replaced_only_after_success(tmp_path, runs, tiny_target, monkeypatch):
    root, _ = runs
    out = export_best(root, tmp_path / "best")
    make_speculator_run(root, "faster", tiny_target, seed=3, speedup=2.0)

    def broken_card(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_module, "model_card", broken_card)
    with pytest.raises(RuntimeError, match="disk full"):
        export_best(root, out)
    assert json.loads((out / "export.json").read_text())["run_id"] == "fast"  # old export intact
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    monkeypatch.undo()
    export_best(root, out)
    assert json.loads((out / "export.json").read_text())["run_id"] == "faster"


def test_export_refuses_to_overwrite_an_unrelated_directory(tmp_path, runs):
    root, _ = runs
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an earlier export"):
        export_best(root, precious)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_export_refuses_weights_other_than_the_measured_ones(tmp_path, runs, tiny_target):
    root, _ = runs
    # Overwrite the winner's checkpoint with different weights after it was measured.
    torch.manual_seed(99)
    other = build_speculator("mlp", SMALL_SPECULATORS["mlp"], TargetInfo.of(tiny_target))
    other.save(root / "fast" / "checkpoints" / "speculator", extra={"target_config": TINY_TARGET_CONFIG})
    with pytest.raises(ValueError, match="checkpoint was changed"):
        export_best(root, tmp_path / "best")
    assert not (tmp_path / "best").exists()


def test_export_needs_an_eligible_run_and_its_checkpoint(tmp_path, tiny_target):
    root = tmp_path / "runs"
    make_run(root, "lossy", mismatches=1)
    with pytest.raises(NoEligibleRunError):
        export_best(root, tmp_path / "best")
    make_run(root, "no-checkpoint")
    with pytest.raises(FileNotFoundError, match="records no checkpoint"):
        export_best(root, tmp_path / "best")


def test_the_export_does_not_count_as_a_run(runs):
    root, _ = runs
    export_best(root, root / "best")
    assert "best" not in {r["run_dir"] for r in load_rows(root)}


def test_export_among_tied_runs_takes_the_servable_then_the_smaller(tmp_path, tiny_target, capsys):
    from speclab.sweeps.cli import main

    root = tmp_path / "runs"
    close = dict(per_prompt=[1.9, 1.5, 2.1, 1.7, 1.8, 1.9])
    make_run(root, "suffix_corpus", family="suffix", params=0, speedup=1.80, **close)  # no engine serves it
    make_speculator_run(root, "mlp", tiny_target, speedup=1.78, per_prompt=[1.85, 1.55, 2.0, 1.75, 1.75, 1.85])
    make_speculator_run(root, "slower", tiny_target, family="draft_lm", speedup=1.2,
                        per_prompt=[1.3, 1.1, 1.3, 1.2, 1.2, 1.3])  # servable but separated: not in the tie
    assert main(["export", "--best", "--runs", str(root), "--out", str(tmp_path / "best")]) == 0
    manifest = json.loads((tmp_path / "best" / "export.json").read_text())
    assert manifest["run_id"] == "mlp"
    assert manifest["tie"]["leader"] == "suffix_corpus" and manifest["tie"]["tied"] == ["mlp", "suffix_corpus"]
    assert manifest["tie"]["order"] == export_module.TIE_ORDER
    out = capsys.readouterr().out
    assert "A tie: mlp, suffix_corpus" in out and "mlp was chosen" in out
    assert "A tie:" in (tmp_path / "best" / "README.md").read_text()


def test_a_best_run_no_engine_serves_is_exported_beside_the_best_servable_one(tmp_path, tiny_target, capsys):
    from speclab.sweeps.cli import main

    root = tmp_path / "runs"
    make_speculator_run(root, "hydra", tiny_target, family="hydra", speedup=1.9)  # speclab's layout only
    servable = make_speculator_run(root, "mlp", tiny_target, speedup=1.2)
    assert main(["export", "--best", "--runs", str(root), "--out", str(tmp_path / "best")]) == 0
    manifest = json.loads((tmp_path / "best" / "export.json").read_text())
    assert manifest["run_id"] == "mlp" and manifest["role"]["best_overall"]["run_id"] == "hydra"
    assert _same_logits(load_checkpoint(tmp_path / "best"), servable, tiny_target)
    beside = json.loads((tmp_path / "best-best-overall" / "export.json").read_text())
    assert beside["run_id"] == "hydra" and "no serving engine loads a hydra" in beside["role"]["reason"]
    assert beside["role"]["servable_export"] == str(tmp_path / "best")
    out = capsys.readouterr().out
    assert "The best run overall, hydra (hydra), is not servable" in out


def test_a_best_dflash2_is_written_in_speculators_format_beside_the_servable_one(tmp_path, tiny_target):
    """speculators loads a dflash2 export, but no engine is known to serve one: beside, in its format."""
    root = tmp_path / "runs"
    make_speculator_run(root, "dflash2", tiny_target, family="dflash2", speedup=1.9)
    make_speculator_run(root, "mlp", tiny_target, speedup=1.2)
    export_best(root, tmp_path / "best")
    assert json.loads((tmp_path / "best" / "export.json").read_text())["run_id"] == "mlp"
    beside = tmp_path / "best-best-overall"
    assert json.loads((beside / "export.json").read_text())["layout"] == "speculators_dflash2"
    assert json.loads((beside / "config.json").read_text())["speculators_model_type"] == "dflash2"


def test_a_servable_best_run_is_exported_alone(tmp_path, runs):
    root, _ = runs
    out = export_best(root, tmp_path / "best")
    assert json.loads((out / "export.json").read_text())["role"] is None
    assert not (tmp_path / "best-best-overall").exists()


def test_export_without_a_tie_records_none(tmp_path, runs):
    root, _ = runs
    out = export_best(root, tmp_path / "best")
    assert json.loads((out / "export.json").read_text())["tie"] is None
