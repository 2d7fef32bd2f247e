"""The fault matrix: every fault kind at several steps on the tiny target, against a clean run.

    python -m speclab.training.fault_matrix [--steps 24] [--seeds 3] [--out DIR] [--world-size 2 --fault-rank 1]

For each (kind, step) it runs one supervised training (child processes, restarts,
rollbacks, as a real run has them) and compares it with an uninterrupted run of the same
config: the final weights' sha256 and the per-step losses (bitwise for hardware faults;
spike and nan_loss runs skip data, so they differ by design and count as recovered when they
complete). It also counts the watchdog's false trips over clean runs of several seeds.
With `--world-size 2` every run trains on two processes and each fault fires on one rank.

The data is synthetic (random token sequences through the tiny target, features cached
under the output directory), so the matrix needs no data generation and runs in minutes.
Tests reuse `tiny_config` and `tiny_attempt`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from speclab.kernels.util.digest import weights_sha256
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama

from .checkpoint import CheckpointConfig, CheckpointStore
from .features import FeatureDataset, assistant_token_counts, build_feature_store
from .stages import stage_configs, stage_data
from .ranks import configured_world_size
from .supervisor import CHECKPOINTS, Outcome, SupervisorConfig, supervise
from .train import fit

HARDWARE = ("exception", "sigkill", "hang", "corrupt_checkpoint")
NUMERIC = ("nan_loss", "spike")


def tiny_config(*overrides: str) -> dict:
    """The shipped configs composed for the tiny target and the smoke budget, plus overrides."""
    base = ["target=tiny", "training=smoke", "speculator.inner_dim=32", "speculator.draft_vocab_size=0", "threads=1",
            "training.supervisor.heartbeat_timeout_s=5", "data.num_prompts=32", "wandb.mode=disabled"]
    with initialize_config_module(config_module="speclab.configs", version_base=None):
        cfg = compose("config", overrides=base + list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def synthetic_examples(n: int, seed: int, vocab: int) -> list[dict]:
    """n random sequences of 12-32 tokens; the loss is on the second half of each."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(12, 33, (1,), generator=g))
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        out.append({"input_ids": ids, "loss_mask": [0] * (length // 2) + [1] * (length - length // 2)})
    return out


def tiny_attempt(config: dict, run_dir: str, cache_dir: str) -> dict:
    """One training attempt on the tiny target (a supervisor child): rebuilds everything from config."""
    cfg = OmegaConf.create(config)
    torch.set_num_threads(cfg.threads or 1)
    torch.manual_seed(cfg.seed)
    target = tiny_llama(**{k: v for k, v in cfg.target.items() if k != "_target_"})
    stores = []
    for stage in stage_configs(cfg.training):  # one synthetic data set per training stage
        data = stage_data(OmegaConf.to_container(cfg.data), stage)
        examples = synthetic_examples(data["num_prompts"], data["seed"], target.vocab_size)
        stores.append(build_feature_store(target, examples, f"synthetic-{data['num_prompts']}-{data['seed']}",
                                          Path(cache_dir), progress=False))
    params = {k: v for k, v in OmegaConf.to_container(cfg.speculator).items() if k != "family"}
    info = TargetInfo.of(target).with_counts(assistant_token_counts(stores[-1], target.vocab_size))
    speculator = build_speculator(cfg.speculator.family, params, info)
    return fit(speculator, target, [FeatureDataset(store=s) for s in stores], cfg.training, Path(run_dir), cfg.seed,
               faults=cfg.faults, config=config, progress=False)


def run_tiny(config: dict, run_dir: Path, cache_dir: Path) -> Outcome:
    """A supervised tiny run; the outcome's train block gains the final weights' sha256."""
    run_dir.mkdir(parents=True, exist_ok=True)
    outcome = supervise(tiny_attempt, (config, str(run_dir), str(cache_dir)), run_dir,
                        SupervisorConfig(**config["training"]["supervisor"]), configured_world_size(config["training"]))
    if outcome.status == "completed":
        final = CheckpointStore(run_dir / CHECKPOINTS, CheckpointConfig()).load_latest()
        outcome.train["final_weights_sha256"] = weights_sha256(final["model"])
    return outcome


COMMON = ["training.accumulate_grad_batches=2", "training.checkpoint_every_n_steps=4", "training.checkpoint_keep_last=2",
          "training.checkpoint_anchor_every_n_steps=8"]


def ranks_overrides(world_size: int, fault_rank: int) -> list[str]:
    """A data-parallel group of `world_size` CPU processes, each fault firing on `fault_rank`."""
    if world_size == 1:
        return []
    return ["training.strategy=ddp", f"training.devices={world_size}", f"faults.rank={fault_rank}",
            "training.supervisor.collective_timeout_s=10"]


def matrix(root: Path, steps: int, points: dict[str, list[tuple[int, int]]], seeds: int, clean_steps: int,
           parallel: list[str] = ()):
    """Rows of the fault matrix, the false trips per clean seed, and the clean run (each run
    with the `parallel` overrides: ranks_overrides)."""
    cache = root / "cache"
    common = [f"training.max_steps={steps}", *COMMON, *parallel]
    clean = run_tiny(tiny_config(*common), root / "clean", cache)
    rows = []
    for kind, at in points.items():
        for step, micro in at:
            t0 = time.time()
            out = run_tiny(tiny_config(*common, f"faults='{kind}'", f"faults.at_step={step}",
                                       f"faults.at_micro_batch={micro}"), root / f"{kind}-{step}-{micro}", cache)
            t = out.train
            equal = out.status == "completed" and t["final_weights_sha256"] == clean.train["final_weights_sha256"] \
                and t["loss_history"] == clean.train["loss_history"]
            recovered = [a["fault_to_resumed_s"] for a in t["attempts"] if a.get("fault_to_resumed_s") is not None]
            recovered += [r["resume_s"] for r in t.get("rollback_log", []) if r.get("resume_s") is not None]
            recomputed = sum(a.get("steps_recomputed") or 0 for a in t["attempts"])
            recomputed += sum(r["step"] - r["target"] for r in t.get("rollback_log", []))
            rows.append({"fault": kind, "step.micro": f"{step}.{micro}", "injected": len(t.get("faults", [])),
                         "completed": out.status == "completed", "bitwise_equal": equal,
                         "restarts": t["restarts"], "rollbacks": t["rollbacks"], "steps_recomputed": recomputed,
                         "fault_to_resume_s": max(recovered) if recovered else None, "wall_s": time.time() - t0,
                         "error": out.reason})
    false_trips = []
    for seed in range(seeds):
        out = run_tiny(tiny_config(f"training.max_steps={clean_steps}", *COMMON, *parallel, f"seed={seed}",
                                   f"data.seed={seed}"),
                       root / f"clean-seed{seed}", cache)
        false_trips.append(out.train["rollbacks"])
    return rows, false_trips, clean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="optimiser steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="clean runs counted for false trips")
    parser.add_argument("--clean-steps", type=int, default=100, help="optimiser steps of each false-trip run")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp dir, removed)")
    parser.add_argument("--world-size", type=int, default=1, help="ranks per run: >1 trains data-parallel (ddp, gloo)")
    parser.add_argument("--fault-rank", type=int, default=1, help="with --world-size: the rank each fault fires on")
    args = parser.parse_args(argv)
    root = args.out or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    # step.micro: mid-epoch, right after the save at 8, inside gradient accumulation
    points = {k: [(6, 0), (9, 0), (14, 1)] for k in HARDWARE} | {k: [(13, 0), (18, 0)] for k in NUMERIC}
    try:
        rows, false_trips, clean = matrix(root, args.steps, points, args.seeds, args.clean_steps,
                                          ranks_overrides(args.world_size, args.fault_rank))
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)
    head = ("fault", "step.micro", "injected", "completed", "bitwise_equal", "restarts", "rollbacks", "steps_recomputed",
            "fault_to_resume_s", "wall_s")
    cfg = tiny_config()["training"]
    where = f"{args.world_size} ranks, faults on rank {args.fault_rank}" if args.world_size > 1 else "one process"
    print(f"tiny target, {where}, {args.steps} steps of 2 micro-batches, checkpoint every 4; budget: max_restarts="
          f"{cfg['supervisor']['max_restarts']}, max_rollbacks={cfg['watchdog']['max_rollbacks']}; "
          f"clean run {clean.train['wall_s']:.1f}s")
    print("  ".join(f"{h:>16}" for h in head))
    for r in rows:
        cells = [r[h] if not isinstance(r[h], float) else f"{r[h]:.2f}" for h in head]
        print("  ".join(f"{str(c):>16}" for c in cells) + (f"  error: {r['error']}" if r["error"] else ""))
    judged = args.seeds * (args.clean_steps - cfg["watchdog"]["min_window"])
    print(f"false trips over {args.seeds} clean seeds x {args.clean_steps} steps ({judged} steps judged by the spike "
          f"rule): {sum(false_trips)} (per seed: {false_trips})")
    if args.json:
        print(json.dumps({"rows": rows, "false_trips": false_trips}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
