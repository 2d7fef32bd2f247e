"""One experiment, top to bottom: data -> features -> train -> eval -> result.json."""

from __future__ import annotations

import gc
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from speclab.eval.benchmark import score
from speclab.eval.contamination import contamination, first_over
from speclab.eval.method import MethodConfig, choose, tree_of
from speclab.eval.prompts import encode_prompt, humaneval_prompts, load_prompts
from speclab.eval.task_sets import builtin_set
from speclab.speculator.base import Speculator, TargetInfo
from speclab.speculator.families import build_config, build_speculator, speculator_class
from speclab.speculator.hybrid import HybridSpeculator
from speclab.speculator.lookup import TrainingFree
from speclab.speculator.target import FrozenTarget
from speclab.speculator.target.builders import cache_root
from speclab.training.data import DataBundle, DataConfig, build_dataset
from speclab.training.data_config import GENERATED_SOURCES
from speclab.training.features import (FeatureDataset, assistant_token_counts, build_feature_store, cache_report,
                                       training_answers)
from speclab.training.stages import stage_configs, stage_data
from speclab.training.checkpoint import complete_steps, final_weights
from speclab.training.shards import shard_plan
from speclab.training.supervisor import CHECKPOINTS, SupervisorConfig, supervise
from speclab.training.ranks import configured_world_size
from speclab.training.train import fit
from speclab.training.warm_start import begin_warm, recorded_start
from speclab.training.loggers import log_final

from .doctor import prepare_machine
from .results import (SPECULATOR_SUBDIR, find_speculator_checkpoint, new_result, one_line_error, weights_sha256,
                      write_result)

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    target: FrozenTarget
    dataset: list[FeatureDataset]  # one per training stage
    token_counts: torch.Tensor  # [V] assistant-token counts, for reduced draft vocabularies
    heldout: list[dict]
    data_stats: dict
    feature_bytes_per_token: float | None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_data(cfg: DictConfig, target: FrozenTarget, data_cfg: dict | None = None) -> DataBundle:
    """The run's data (or one stage's: `data_cfg`). Prompts mined from Python source are kept
    apart from every HumanEval prompt and entry point, whatever the eval set is this time."""
    data_cfg = DataConfig(**(data_cfg or OmegaConf.to_container(cfg.data, resolve=True)))
    exclude = [p["prompt"] for p in humaneval_prompts()] if data_cfg.source == "code_prompts" else []
    return build_dataset(target, data_cfg, exclude=exclude)


def prepare(cfg: DictConfig) -> Prepared:
    """Target, training data and target features per training stage: everything a sweep's runs share."""
    target: FrozenTarget = instantiate(cfg.target)
    base = OmegaConf.to_container(cfg.data, resolve=True)
    stages = [build_data(cfg, target, stage_data(base, s)) for s in stage_configs(cfg.training)]
    heldout = stages[-1].heldout  # the last stage's data is what the run is for
    stats = {**stages[-1].stats, "built_now": stages[-1].built_now}
    if len(stages) > 1:
        stats["stages"] = [s.stats for s in stages]
    if cfg.training.features == "offline":
        # The intermediate target layers the speculator reads (eagle3) are cached beside the hidden states.
        layer_ids = speculator_class(cfg.speculator.family).layer_ids_for(
            build_config(cfg.speculator.family, _params(cfg.speculator)), target.num_layers)
        stores = [build_feature_store(target, d.train, d.fingerprint, cache_root() / "features",
                                      dtype=cfg.training.feature_dtype, batch_size=cfg.training.feature_batch_size,
                                      layer_ids=layer_ids, generated=d.hidden,
                                      shards=shard_plan(base.get("shards", 1), base.get("shard"))) for d in stages]
        stats["feature_cache"] = [cache_report(s) for s in stores]
        log.info("feature caches (tokens, bytes, seconds, tok/s): %s", stats["feature_cache"])
        counts = sum(assistant_token_counts(s, target.vocab_size) for s in stores)
        return Prepared(target, [FeatureDataset(store=s, layer_ids=layer_ids) for s in stores], counts, heldout,
                        stats, stores[-1].bytes_per_token)
    counts = sum(assistant_token_counts(d.train, target.vocab_size) for d in stages)
    return Prepared(target, [FeatureDataset(examples=d.train) for d in stages], counts, heldout, stats, None)


def new_speculator(cfg: DictConfig, target: FrozenTarget, token_counts: torch.Tensor | None) -> Speculator:
    """The configured family, freshly initialised against `target` (counts: its reduced vocabulary)."""
    return build_speculator(cfg.speculator.family, _params(cfg.speculator),
                            TargetInfo.of(target).with_counts(token_counts))


def release_memory() -> None:
    """Return freed tensors' memory now: reference cycles collected, CUDA's cache emptied."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train_attempt(config: dict, run_dir: str) -> dict:
    """One training attempt, run by the supervisor in a child process (a device error can
    leave a process unusable): rebuilds its inputs from the run's resolved config (the data
    and feature caches make `prepare` cheap the second time) and resumes from the newest
    complete checkpoint."""
    cfg = OmegaConf.create(config)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    prep = prepare(cfg)
    speculator = new_speculator(cfg, prep.target, prep.token_counts)
    if cfg.training.get("init_from") and not complete_steps(Path(run_dir) / CHECKPOINTS):
        # a fresh run: its step 0 is these weights
        begin_warm(speculator, find_speculator_checkpoint(cfg.training.init_from), run_dir)
    seed_everything(cfg.seed)
    return fit(speculator, prep.target, prep.dataset, cfg.training, Path(run_dir), cfg.seed, faults=cfg.faults,
               config=config)


def eval_prompts(cfg: DictConfig, heldout: list[dict]) -> list[dict]:
    """The eval sets named in cfg.eval: HumanEval, the held-out split, built-in sets
    (eval/task_sets.py), a user JSONL; each item with a category (its own, else its source's).
    Prompts of the pilot split (eval.method.pilot_set: choices are made on them) and of the
    held-out set (eval.heldout_set: scored apart, for nothing else) are left out."""
    prompts: list[dict] = []
    if cfg.eval.humaneval_prompts:
        prompts += humaneval_prompts(None if cfg.eval.humaneval_prompts < 0 else cfg.eval.humaneval_prompts)
    prompts += [{"category": "heldout", **p} for p in heldout[: cfg.eval.heldout_prompts]]
    for name in cfg.eval.get("sets") or []:
        prompts += builtin_set(name)
    if cfg.eval.prompts_file:
        prompts += [{"category": Path(cfg.eval.prompts_file).stem, **p} for p in load_prompts(cfg.eval.prompts_file)]
    reserved = {_text(p) for p in pilot_items(cfg) + heldout_set_items(cfg)}
    kept = [p for p in prompts if _text(p) not in reserved]
    if len(kept) < len(prompts):
        log.info("%d eval prompt(s) left out: they are in the pilot split or the held-out set", len(prompts) - len(kept))
    if not kept:
        raise ValueError("no eval prompts: set eval.humaneval_prompts, eval.heldout_prompts, eval.sets or "
                         "eval.prompts_file")
    return kept


def pilot_items(cfg: DictConfig) -> list[dict]:
    """The pilot split's prompts the method choice decodes ([] when the method is fixed)."""
    method = cfg.eval.get("method")
    if method is None or method.select != "best":
        return []
    return builtin_set(method.get("pilot_set", "pilot"), method.pilot_prompts)


def heldout_set_items(cfg: DictConfig) -> list[dict]:
    """eval.heldout_set's prompts, the pilot's left out ([] when none is named)."""
    name = cfg.eval.get("heldout_set")
    if not name:
        return []
    pilot = {_text(p) for p in pilot_items(cfg)}
    return [p for p in builtin_set(name) if _text(p) not in pilot]


def _text(item: dict) -> str:
    return json.dumps(item.get("prompt", item.get("messages")), sort_keys=True)


def evaluate(cfg: DictConfig, target: FrozenTarget, speculator: Speculator, prompts: list[dict]) -> dict:
    """score() with the run's drafting method: a chain of eval.k, or the best of a pilot on
    the pilot split (eval/method.py). A hybrid also scores its two parts alone on the same
    prompts, each with its own best method (`parts`: where the hybrid beats both, and by how
    much). `eval.heldout_set` is then scored with the method chosen (`heldout_set`)."""
    def encode(items: list[dict]) -> list[torch.Tensor]:
        return [encode_prompt(target.tokenizer, p, chat_template=cfg.eval.chat_template) for p in items]

    encoded, pilot = encode(prompts), encode(pilot_items(cfg))
    categories = [p.get("category") or "uncategorized" for p in prompts]
    method = MethodConfig(**OmegaConf.to_container(cfg.eval.method, resolve=True)) \
        if "method" in cfg.eval else MethodConfig(select="fixed")
    scored = {**_score_with(cfg, target, speculator, encoded, method, pilot, categories),
              "prompt_ids": [e[0].tolist() for e in encoded]}
    if isinstance(speculator, HybridSpeculator) and cfg.eval.get("score_parts", True):
        scored["parts"] = {name: _part_summary(_score_with(cfg, target, part, encoded, method, pilot, categories))
                           for name, part in (("learned", speculator.learned), ("suffix", speculator.suffix))}
    if cfg.eval.get("heldout_set"):
        scored["heldout_set"] = score_heldout_set(cfg, target, speculator, scored)
    return scored


def score_heldout_set(cfg: DictConfig, target: FrozenTarget, speculator: Speculator, scored: dict) -> dict:
    """The held-out set (a built-in set, eval/task_sets.py) scored with the method the run
    chose: prompts no knob was tuned on, no pilot decoded and no other figure of the run used."""
    name, items = cfg.eval.heldout_set, heldout_set_items(cfg)
    encoded = [encode_prompt(target.tokenizer, p, chat_template=cfg.eval.chat_template) for p in items]  # each [1, T]
    chosen = scored.get("method", {}).get("chosen") or {"kind": "chain", "k": scored["acceptance"]["k"]}
    found = score(target, speculator.eval(), encoded, cfg.eval.max_new_tokens, chosen.get("k", cfg.eval.k),
                  tree=tree_of(chosen), categories=[p.get("category") or name for p in items])
    return {"name": name, "prompts": len(items), "method": chosen, "speedup": found["throughput"]["speedup"],
            "speedup_ci": found["ci"]["speedup_total"],
            "acceptance_length": found["acceptance"]["mean_acceptance_length"],
            "lossless": found["lossless"], "by_category": found["by_category"], "per_prompt": found["per_prompt"]}


def _score_with(cfg: DictConfig, target: FrozenTarget, speculator: Speculator, encoded: list, method: MethodConfig,
                pilot: list, categories: list[str]) -> dict:
    if method.select == "fixed":
        return score(target, speculator.eval(), encoded, cfg.eval.max_new_tokens, cfg.eval.k, categories=categories)
    chosen = choose(target, speculator.eval(), pilot, method, cfg.eval.max_new_tokens)
    scored = score(target, speculator, encoded, cfg.eval.max_new_tokens, chosen["chosen"].get("k", cfg.eval.k),
                   tree=tree_of(chosen["chosen"]), categories=categories)
    return {**scored, "method": chosen}


def _part_summary(scored: dict) -> dict:
    """What result.json keeps of a hybrid's part scored alone."""
    acceptance, throughput = scored["acceptance"], scored["throughput"]
    return {"speedup": throughput["speedup"], "spec_tok_s": throughput["spec_tok_s"],
            "baseline_tok_s": throughput["baseline_tok_s"],
            "mean_acceptance_length": acceptance["mean_acceptance_length"],
            "per_position": acceptance["per_position"], "lossless_mismatches": scored["lossless"]["mismatches"],
            "method": scored.get("method", {}).get("chosen", {"kind": "chain", "k": acceptance["k"]})}


def run_experiment(cfg: DictConfig, run_dir: Path) -> dict:
    """Runs one experiment and writes result.json (also when it fails, then re-raises)."""
    # Relative to runs_dir, so runs of different sweeps (both "0-mlp") stay apart in the table.
    run_id = os.path.relpath(run_dir, cfg.runs_dir) if _inside(run_dir, cfg.runs_dir) else run_dir.name
    result = new_result(run_id, OmegaConf.to_container(cfg, resolve=True))
    start = time.time()
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # The machine's choices the target's build reads (its kernels' paths, `dtype: auto`),
        # measured here where no record holds them: every later build, the training
        # children's included, reads the record.
        prepare_machine(OmegaConf.to_container(cfg.target, resolve=True))
        seed_everything(cfg.seed)
        if issubclass(speculator_class(cfg.speculator.family), TrainingFree):
            target, speculator, heldout, answers = untrained(cfg, run_dir, result)
        else:
            target, speculator, heldout, answers = trained(cfg, run_dir, result)
        scored = evaluate(cfg, target, speculator, eval_prompts(cfg, heldout))
        # What ran: the runtime (lean/native[/its bf16 path], lean/torch or hf) and how `dtype: auto` chose.
        result["target"] = {"name": target.name, "runtime": target.runtime,
                            "dtype": str(target.dtype).removeprefix("torch."),
                            "dtype_choice": getattr(target, "dtype_choice", None)}
        result.update({key: scored[key] for key in ("acceptance", "throughput", "lossless", "timing", "ci", "method",
                                                    "parts", "drafting", "by_category", "heldout_set") if key in scored})
        result["eval"] = {"per_prompt": scored.get("per_prompt"), "k": cfg.eval.k,
                          "max_new_tokens": cfg.eval.max_new_tokens}
        log_final(run_dir, cfg, result)  # measured acceptance + speedup into the wandb run (offline by default)
        if answers is not None:
            result["contamination"] = contamination(answers, scored["prompt_ids"], scored["outputs"])
            leak = first_over(result["contamination"], cfg.eval.max_prompt_overlap)
            if leak:
                raise ValueError(leak)
        mismatches = result["lossless"]["mismatches"]
        if mismatches:
            raise RuntimeError(f"lossless check failed: {mismatches} prompt(s) differ from plain greedy decoding "
                               "beyond a numerical tie (eval/lossless.py)")
        result["status"] = "completed"
    except BaseException as exc:
        result["status"], result["error"] = "failed", one_line_error(exc)
        raise
    finally:
        result["wall_s"] = time.time() - start
        write_result(run_dir, result)
    return result


def trained(cfg: DictConfig, run_dir: Path, result: dict) -> tuple[FrozenTarget, Speculator, list[dict], list | None]:
    """Train the speculator (supervised child processes), save it, and return it with a
    fresh target, the held-out prompts and the training answers it saw (answers_seen); fills
    result's speculator, data, train, checkpoint and weights fields."""
    prep = prepare(cfg)
    speculator = new_speculator(cfg, prep.target, prep.token_counts)
    result["speculator"] = {"family": speculator.family, "params": speculator.num_params()}
    result["data"] = {**prep.data_stats, "feature_bytes_per_token": prep.feature_bytes_per_token}
    heldout, token_counts = prep.heldout, prep.token_counts
    corpus = speculator.training_data_tokens() > 0
    answers = training_answers(prep.dataset[-1]) if corpus or answers_seen(cfg) else None
    # Each training attempt is a child process that loads its own target: the parent's
    # copy is dropped meanwhile (on a GPU it would take the memory training needs) and
    # loaded again for scoring (the conversion is cached; a seeded target rebuilds equal).
    del prep, speculator
    release_memory()
    seed_everything(cfg.seed)
    outcome = supervise(train_attempt, (result["config"], str(run_dir)), run_dir,
                        SupervisorConfig(**result["config"]["training"]["supervisor"]),
                        configured_world_size(cfg.training))
    start = recorded_start(run_dir) if cfg.training.get("init_from") else None
    result["train"] = {**outcome.train, "init_from": start} if start else outcome.train
    outcome.raise_if_failed()
    target: FrozenTarget = instantiate(cfg.target)
    speculator = new_speculator(cfg, target, token_counts)
    speculator.load_state_dict(final_weights(run_dir / CHECKPOINTS))
    if corpus:
        result["data"]["corpus"] = keep_answers(speculator, answers)
    speculator.save(run_dir / SPECULATOR_SUBDIR,
                    extra={"target_config": OmegaConf.to_container(cfg.target, resolve=True)})
    result["checkpoint"] = str(SPECULATOR_SUBDIR)
    result["final_weights_sha256"] = weights_sha256(speculator.state_dict())
    return target, speculator, heldout, answers


def answers_seen(cfg: DictConfig) -> bool:
    """Whether the run trains on answers the target wrote (its last stage's data is
    generated): what it is scored on may then have leaked into training (contamination)."""
    last = stage_data(OmegaConf.to_container(cfg.data, resolve=True), stage_configs(cfg.training)[-1])
    return last["source"] in GENERATED_SOURCES


def untrained(cfg: DictConfig, run_dir: Path, result: dict) -> tuple[FrozenTarget, Speculator, list[dict], list | None]:
    """A training-free family: nothing to train. The data (the last training stage's, as
    for a learned run) is still built, or read from the sweep's cache, when the eval set takes
    held-out prompts from it: the same prompts the learned runs are scored on."""
    target: FrozenTarget = instantiate(cfg.target)
    heldout, answers = [], None
    speculator = new_speculator(cfg, target, None)
    if cfg.eval.heldout_prompts or speculator.training_data_tokens():  # held-out prompts, or a corpus of answers
        last = stage_configs(cfg.training)[-1]
        data = build_data(cfg, target, stage_data(OmegaConf.to_container(cfg.data, resolve=True), last))
        heldout, result["data"] = data.heldout, {**data.stats, "feature_bytes_per_token": None}
        if speculator.training_data_tokens():
            answers = training_answers(FeatureDataset(examples=data.train))
            result["data"]["corpus"] = keep_answers(speculator, answers)
    result["speculator"] = {"family": speculator.family, "params": speculator.num_params()}
    result["train"] = {"steps": 0, "tokens": 0, "wall_s": 0.0, "final_loss": None, "restarts": 0, "rollbacks": 0}
    # Saved like a trained one (its config, no tensors), so the best run can be exported
    # whatever it is: a serving engine runs the drafting method with these settings.
    speculator.save(run_dir / SPECULATOR_SUBDIR, extra={"target_config": OmegaConf.to_container(cfg.target, resolve=True)})
    result["checkpoint"] = str(SPECULATOR_SUBDIR)
    result["final_weights_sha256"] = weights_sha256(speculator.state_dict())
    return target, speculator, heldout, answers


def keep_answers(speculator: Speculator, answers: list[list[int]]) -> dict:
    """Hand the training answers to the speculator (suffix's corpus tree, built here so that
    its seconds are counted once, in the run): result.json's `data.corpus`."""
    start = time.perf_counter()
    speculator.use_training_data(answers)
    report = {"answers_in_data": len(answers), **speculator.corpus_report(),
              "seconds": round(time.perf_counter() - start, 3)}
    log.info("corpus of training answers: %s", report)
    return report


def _inside(path: Path, root: str) -> bool:
    return Path(root).resolve() in path.resolve().parents


def _params(spec_cfg: DictConfig) -> dict:
    params = OmegaConf.to_container(spec_cfg, resolve=True)
    params.pop("family")
    return params
