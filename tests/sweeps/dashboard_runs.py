"""A generated runs folder for the dashboard's tests: a grid sweep over several families
and knobs, the two training-free baselines, a failed run, a run still training, a
malformed record and an export, with every section the run page draws."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

from speclab.sweeps.results import failed_result, new_result, write_json_atomic, write_result

FAMILIES = ("mlp", "eagle3", "hydra")
WIDTHS = (256, 512, 1024)
TOKENS = (30_000, 100_000)
CATEGORIES = ("code", "chat")


def config(family: str, width: int, tokens: int, k: int = 4) -> dict:
    return {"speculator": {"family": family, "inner_dim": width, "n_predict": k},
            "data": {"source": "code_prompts", "max_tokens": tokens},
            "training": {"max_steps": 100, "optimizer": {"lr": 0.003}},
            "eval": {"k": k}, "run_name": f"{family}-{width}", "runs_dir": "runs", "seed": 0}


def learned(root: Path, name: str, family: str, width: int, tokens: int, rng: random.Random) -> Path:
    """A completed learned run whose figures grow with width and data, as a sweep's would."""
    quality = 0.25 + 0.1 * WIDTHS.index(width) + 0.1 * TOKENS.index(tokens) + 0.05 * FAMILIES.index(family)
    per_position = [round(quality * 0.7 ** i, 4) for i in range(4)]
    speedup = 1.0 + quality + rng.uniform(-0.05, 0.05)
    result = new_result(name, config(family, width, tokens))
    result["speculator"] = {"family": family, "params": width * 8192 * 2}
    result["acceptance"].update(k=4, acceptance_rate=sum(per_position) / 4, per_position=per_position,
                                mean_acceptance_length=1 + sum(per_position))
    result["throughput"] = {"baseline_tok_s": 90.0, "spec_tok_s": 90.0 * speedup, "speedup": speedup}
    result["ci"] = {"speedup_total": [speedup - 0.1, speedup + 0.1]}
    result["lossless"] = {"checked_prompts": 4, "mismatches": 0, "ties": 0}
    losses = [8.0 * math.exp(-s / 40) + 2 + rng.uniform(0, 0.3) for s in range(100)]
    result["train"].update(steps=100, tokens=tokens, final_loss=losses[-1], loss_history=losses, rollbacks=1,
                           rollback_log=[{"step": 33, "onset": 30, "target": 20, "reason": "loss spike"}],
                           attempts=[{"attempt": 0, "status": "failed", "reason": "killed"},
                                     {"attempt": 1, "resumed_from": 60, "status": "completed"}], restarts=1)
    result["timing"] = {"draft_ms_per_token": 0.1 + width / 2000}
    result["data"] = {"examples": 700, "assistant_tokens": tokens, "build_seconds": 150.0,
                      "cache": {"tokens": tokens, "bytes": tokens * 2309, "seconds": 12.0}}
    result["method"] = {"verify_cost_ms": {"1": 10.0, "2": 10.5, "4": 11.3, "8": 14.4, "16": 21.7, "32": 36.9},
                        "verify_cost_source": "measured earlier on this machine",
                        "candidates": [{"kind": "chain", "k": k, "tok_s": 100 + 10 * k, "acceptance_length": 1 + k / 4}
                                       for k in (1, 2, 4)]
                        + [{"kind": "tree", "shape": "union", "depth": 4, "top_k": 4, "budget": 6, "tok_s": 150.0,
                            "acceptance_length": 2.3}],
                        "chosen": {"kind": "tree", "shape": "union", "depth": 4, "top_k": 4, "budget": 6}}
    result["eval"] = {"per_prompt": [{"prompt_tokens": 100, "new_tokens": 128, "baseline_tok_s": 90.0,
                                      "spec_tok_s": 90.0 * (speedup + 0.1 * (i - 1.5)), "mean_acceptance_length": 2.0,
                                      "lossless": True, "category": CATEGORIES[i % 2]} for i in range(4)]}
    result["checkpoint"] = "checkpoints/speculator"
    result["wall_s"] = 120.0
    (root / name).mkdir(parents=True, exist_ok=True)
    write_result(root / name, result)
    return root / name


def baseline(root: Path, name: str, family: str, speedup: float) -> Path:
    result = new_result(name, {"speculator": {"family": family, "min_match": 2}, "eval": {"k": 4},
                               "data": {"source": "code_prompts", "max_tokens": 0}, "seed": 0})
    result["speculator"] = {"family": family, "params": 0}
    result["acceptance"].update(k=4, acceptance_rate=0.2, per_position=[0.4, 0.2, 0.1, 0.05], mean_acceptance_length=1.75)
    result["throughput"] = {"baseline_tok_s": 90.0, "spec_tok_s": 90.0 * speedup, "speedup": speedup}
    result["ci"] = {"speedup_total": [speedup - 0.08, speedup + 0.08]}
    result["lossless"] = {"checked_prompts": 4, "mismatches": 0}
    result["timing"] = {"draft_ms_per_token": 0.02 if family == "ngram" else 0.05}
    (root / name).mkdir(parents=True, exist_ok=True)
    write_result(root / name, result)
    return root / name


def generate(root: Path, runs: int = 12, seed: int = 0) -> dict[str, Path]:
    """`runs` learned runs in sweep-grid/ (the grid repeated with other seeds past 18), the
    baselines, one failed, one training, one malformed; returns the named special runs."""
    rng = random.Random(seed)
    sweep = root / "sweep-grid"
    grid = list(itertools.product(FAMILIES, WIDTHS, TOKENS))
    for i in range(runs):
        family, width, tokens = grid[i % len(grid)]
        run = learned(sweep, f"{i}-{family}-{width}-{tokens}", family, width, tokens, rng)
        (run / ".hydra").mkdir(exist_ok=True)
    special = {"ngram": baseline(sweep, "baseline-ngram", "ngram", 1.3),
               "suffix": baseline(sweep, "baseline-suffix", "suffix", 1.35)}
    failed = sweep / f"{runs}-eagle3-failed"
    failed.mkdir()
    write_result(failed, failed_result(failed.name, config("eagle3", 2048, 30_000), RuntimeError("out of memory at step 12"),
                                       partial={"speculator": {"family": "eagle3", "params": 10_000}}))
    (failed / ".hydra").mkdir()
    training = sweep / f"{runs + 1}-mlp-training"
    (training / ".hydra").mkdir(parents=True)
    (training / ".hydra" / "config.yaml").write_text(json.dumps(config("mlp", 512, 30_000)))  # JSON is YAML
    (training / "logs").mkdir()
    (training / "logs" / "metrics.csv").write_text(
        "epoch,step,train/loss\n" + "".join(f"0,{s},{6 - s * 0.1:.3f}\n" for s in range(0, 20, 5)))
    malformed = root / "broken"
    malformed.mkdir(parents=True)
    (malformed / "result.json").write_text(json.dumps({"run_id": "broken", "status": "completed", "acceptance": 3}))
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    params:\n      speculator: mlp,eagle3,hydra\n"
        f"      seed: {','.join(str(s) for s in range(math.ceil((runs + 6) / 18) + 1))}\n"
        "      speculator.inner_dim: 256,512,1024\n      data.max_tokens: 30000,100000\n")
    export = root / "exported" / "best"
    export.mkdir(parents=True)
    write_json_atomic(export / "export.json", {"run_id": "0", "source_run_dir": str(sweep / f"0-{'-'.join(map(str, grid[0]))}")})
    special.update(failed=failed, training=training, malformed=malformed, export=export)
    return special
