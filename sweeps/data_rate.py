"""Training tokens per second of each data source, from a cold cache: what data costs.

    python -m speclab.sweeps.data_rate [--sources self_distill code_prompts code_corpus]
        [--max-tokens 20000] [--json] [OVERRIDES, e.g. target=smollm2_135m target.dtype=fp32 threads=2]

Each source is built to the same budget of training tokens (tokens with a loss) in a fresh
temporary cache, then its target-feature cache; the table gives both rates. Generation
dominates the self-distilled sources, whose feature cache is a copy of the hidden states
their generation kept (on the lean runtime: `from_generation`); a teacher-forced corpus
costs tokenising and one target pass per token.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from omegaconf import OmegaConf

from speclab.eval.prompts import humaneval_prompts
from speclab.training.data import DataConfig, build_dataset
from speclab.training.features import build_feature_store, cache_report

from .doctor import prepare_machine

SOURCES = ("self_distill", "code_prompts", "code_corpus")


def measure(cfg, target, source: str, max_tokens: int, root: Path, exclude: list[str]) -> dict:
    """One source built cold to `max_tokens` training tokens: the data and feature caches' figures."""
    data_cfg = {**OmegaConf.to_container(cfg.data, resolve=True), "source": source, "max_tokens": max_tokens}
    if source == "code_corpus":
        data_cfg["num_prompts"] = 64  # source files per round, as the teacher_forced recipe reads them
    t0 = time.perf_counter()
    data = build_dataset(target, DataConfig(**data_cfg), root / source / "data", progress=False,
                         exclude=exclude if source == "code_prompts" else [])
    data_s = time.perf_counter() - t0
    store = build_feature_store(target, data.train, data.fingerprint, root / source / "features",
                                dtype=cfg.training.feature_dtype, batch_size=cfg.training.feature_batch_size,
                                progress=False, generated=data.hidden)
    features = cache_report(store)
    return {"source": source, "examples": data.stats["cache"]["examples"], "tokens": data.stats["cache"]["tokens"],
            "train_tokens": data.stats["cache"]["loss_tokens"], "data_s": round(data_s, 2),
            "data_train_tok_s": round(data.stats["cache"]["loss_tokens"] / data_s, 1),
            "feature_s": features["seconds"], "feature_tok_s": features["tok_s"],
            "from_generation": bool(features.get("from_generation"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES, help="data sources to measure")
    parser.add_argument("--max-tokens", type=int, default=20_000, help="training tokens each source is built to")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the experiment config (target, data, threads)")
    args = parser.parse_args(argv)
    with initialize_config_module(config_module="speclab.configs", version_base=None):
        cfg = compose("config", overrides=args.overrides)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    prepare_machine(OmegaConf.to_container(cfg.target, resolve=True))  # what the target's build reads
    target = instantiate(cfg.target)
    exclude = [p["prompt"] for p in humaneval_prompts()]  # as the experiment keeps mined prompts apart
    with tempfile.TemporaryDirectory(prefix="data-rate-") as tmp:
        rows = [measure(cfg, target, s, args.max_tokens, Path(tmp), exclude) for s in args.sources]
    head = list(rows[0])
    print(f"target {cfg.target.get('name_or_path', cfg.target._target_)}, {args.max_tokens} training tokens per source, "
          f"{torch.get_num_threads()} threads")
    print("  ".join(f"{h:>16}" for h in head))
    for r in rows:
        print("  ".join(f"{str(r[h]):>16}" for h in head))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
