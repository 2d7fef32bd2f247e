"""run_experiment's parent process: what it holds while the supervised child trains."""

import gc
import json

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from speclab.speculator.target import FrozenTarget
from speclab.sweeps import experiment
from speclab.training.fault_matrix import tiny_config


def live_targets() -> int:
    gc.collect()
    return sum(isinstance(obj, FrozenTarget) for obj in gc.get_objects())


def test_the_parent_drops_its_target_while_the_child_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    cfg = OmegaConf.create(tiny_config("training.max_steps=2", "data.num_prompts=8", "data.max_response_tokens=16",
                                       "data.heldout_size=1", "eval.max_new_tokens=4", "eval.humaneval_prompts=1",
                                       "eval.heldout_prompts=1", f"runs_dir={tmp_path / 'runs'}"))
    during = []
    real = experiment.supervise

    def watched(*args, **kwargs):
        during.append(live_targets())
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "supervise", watched)
    run_dir = tmp_path / "runs" / "one"
    run_dir.mkdir(parents=True)  # Hydra makes it in a real run
    before = live_targets()
    result = experiment.run_experiment(cfg, run_dir)
    assert result["status"] == "completed" and result["lossless"]["mismatches"] == 0
    assert during == [before]  # no target of this run alive in the parent during training
    assert live_targets() == before  # nor after scoring
    # Trained on answers the target wrote: what it was scored on is measured against them.
    overlap = result["contamination"]
    assert overlap["answers"] > 0 and overlap["n"] == 13 and len(overlap["per_prompt"]) == 2
    assert {"prompt_ids", "outputs"}.isdisjoint(result)  # the texts themselves stay out of result.json


def test_an_eval_prompt_over_the_overlap_limit_fails_the_run_in_one_line(tmp_path, monkeypatch):
    """max_prompt_overlap=-1 makes any prompt a leak (its span, 0 or more, exceeds -1)."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    cfg = OmegaConf.create(tiny_config("training.max_steps=2", "data.num_prompts=8", "data.max_response_tokens=16",
                                       "data.heldout_size=1", "eval.max_new_tokens=4", "eval.humaneval_prompts=1",
                                       "eval.heldout_prompts=0", "eval.max_prompt_overlap=-1",
                                       f"runs_dir={tmp_path / 'runs'}"))
    run_dir = tmp_path / "runs" / "leaky"
    run_dir.mkdir(parents=True)
    with pytest.raises(ValueError, match="eval prompt 0 shares 0 consecutive tokens"):
        experiment.run_experiment(cfg, run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["error"].startswith("ValueError: eval prompt 0 shares")
    assert "\n" not in result["error"] and result["contamination"]["per_prompt"][0]["prompt"]["span"] == 0


@pytest.mark.parametrize("family", ["ngram", "suffix"])
def test_a_training_free_family_is_scored_without_training(tmp_path, monkeypatch, family):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    with initialize_config_module(config_module="speclab.configs", version_base=None):
        cfg = compose("config", overrides=[
            "target=tiny", "training=smoke", f"speculator={family}", "threads=1", "wandb.mode=disabled",
            "data.num_prompts=8", "data.max_response_tokens=16", "data.heldout_size=1", "eval.max_new_tokens=4",
            "eval.humaneval_prompts=1", "eval.heldout_prompts=1", "eval.method.select=fixed",
            f"runs_dir={tmp_path / 'runs'}"])

    def no_training(*args, **kwargs):
        raise AssertionError("a training-free family must not train")

    monkeypatch.setattr(experiment, "supervise", no_training)
    run_dir = tmp_path / "runs" / family
    run_dir.mkdir(parents=True)
    result = experiment.run_experiment(cfg, run_dir)
    assert result["status"] == "completed" and result["speculator"] == {"family": family, "params": 0}
    assert result["train"]["steps"] == 0
    assert result["lossless"]["checked_prompts"] == 2 and result["lossless"]["mismatches"] == 0
    assert (run_dir / result["checkpoint"] / "config.json").is_file()  # exportable like any run
    assert "contamination" not in result  # it saw no answers


def test_a_hybrid_run_also_scores_its_parts_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    with initialize_config_module(config_module="speclab.configs", version_base=None):
        cfg = compose("config", overrides=[
            "target=tiny", "training=smoke", "speculator=hybrid", "speculator.learned.inner_dim=32",
            "speculator.learned.draft_vocab_size=0", "threads=1", "wandb.mode=disabled", "training.max_steps=2",
            "training.supervisor.heartbeat_timeout_s=5", "data.num_prompts=8", "data.max_response_tokens=16",
            "data.heldout_size=1", "eval.max_new_tokens=6", "eval.humaneval_prompts=1", "eval.heldout_prompts=1",
            "eval.method.select=fixed", f"runs_dir={tmp_path / 'runs'}"])
    run_dir = tmp_path / "runs" / "hybrid"
    run_dir.mkdir(parents=True)
    result = experiment.run_experiment(cfg, run_dir)
    assert result["status"] == "completed" and result["speculator"]["family"] == "hybrid"
    parts = result["parts"]
    assert set(parts) == {"learned", "suffix"}
    for part in parts.values():  # each scored on the same prompts, lossless, with its own figures
        assert part["lossless_mismatches"] == 0 and part["speedup"] > 0 and part["mean_acceptance_length"] >= 1
        assert part["method"]["kind"] == "chain"
    # Its suffix part took the training answers as its corpus, and the saved checkpoint holds them.
    corpus = result["data"]["corpus"]
    assert corpus["answers"] == corpus["answers_in_data"] > 0 and corpus["tokens"] == result["data"]["assistant_tokens"]
    from speclab.speculator.families import load_speculator
    saved = load_speculator(run_dir / result["checkpoint"], experiment.TargetInfo.of(experiment.instantiate(cfg.target)))
    assert saved.suffix.corpus_report()["tokens"] == corpus["tokens"]


def _composed(tmp_path, *overrides):
    with initialize_config_module(config_module="speclab.configs", version_base=None):
        return compose("config", overrides=[
            "target=tiny", "training=smoke", "threads=1", "wandb.mode=disabled", "data.num_prompts=8",
            "data.max_response_tokens=16", "data.heldout_size=1", f"runs_dir={tmp_path / 'runs'}", *overrides])


def test_the_scored_prompts_leave_out_the_pilot_split(tmp_path):
    cfg = _composed(tmp_path, "eval.humaneval_prompts=-1", "eval.heldout_prompts=0", "eval.method.select=best",
                    "eval.method.pilot_prompts=2", "eval.sets=[math]")
    prompts = experiment.eval_prompts(cfg, [])
    ids = [p.get("id") for p in prompts]
    assert "HumanEval/163" not in ids and "HumanEval/162" not in ids and "HumanEval/161" in ids
    assert [p["id"] for p in experiment.pilot_items(cfg)] == ["HumanEval/163", "HumanEval/162"]
    assert {p["category"] for p in prompts} == {"humaneval", "math"}
    held = experiment.eval_prompts(_composed(tmp_path, "eval.humaneval_prompts=0", "eval.heldout_prompts=1"),
                                   [{"messages": [{"role": "user", "content": "hi"}]}])
    assert held[0]["category"] == "heldout"
    fixed = _composed(tmp_path, "eval.method.select=fixed")
    assert experiment.pilot_items(fixed) == []  # no pilot: nothing left out


def test_the_pilot_runs_on_its_split_and_the_heldout_set_is_scored_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    cfg = _composed(tmp_path, "speculator=ngram", "eval.max_new_tokens=4", "eval.humaneval_prompts=1",
                    "eval.heldout_prompts=0", "eval.sets=[chat]", "eval.heldout_set=tasks",
                    "eval.method.select=best", "eval.method.chain_k=[1,3]", "eval.method.cost_lengths=[1,2,4]",
                    "eval.method.cost_repeats=1", "eval.method.pilot_prompts=1", "eval.method.pilot_tokens=4",
                    "eval.method.cost_cache=false")
    piloted = []
    real = experiment.choose

    def watched(target, speculator, prompts, *args, **kwargs):
        piloted.extend(p[0].tolist() for p in prompts)
        return real(target, speculator, prompts, *args, **kwargs)

    monkeypatch.setattr(experiment, "choose", watched)
    run_dir = tmp_path / "runs" / "ngram"
    run_dir.mkdir(parents=True)
    result = experiment.run_experiment(cfg, run_dir)
    assert result["status"] == "completed"
    method = result["method"]
    assert method["pilot"]["set"] == "pilot" and method["tuned_on"] == "humaneval[0:16]"
    from speclab.eval.paired import prompt_key
    scored = {r["key"] for r in result["eval"]["per_prompt"]}
    assert len(piloted) == 1 and prompt_key(piloted[0]) not in scored  # chosen on other prompts
    assert set(result["by_category"]) == {"humaneval", "chat"} and result["by_category"]["chat"]["prompts"] == 3
    held = result["heldout_set"]
    assert held["name"] == "tasks" and held["prompts"] == 6 and held["method"] == method["chosen"]
    assert set(held["by_category"]) == {"long_context", "math", "chat"} and held["lossless"]["mismatches"] == 0
    assert not scored & {r["key"] for r in held["per_prompt"]}
