"""The training data set: built once per fingerprint, shared by every run of a sweep.

    bundle = build_dataset(target, DataConfig(**cfg.data))
    bundle.train    # datasets.Dataset: input_ids, loss_mask (1 on assistant tokens)
    bundle.heldout  # [{"messages": [...], "category": "heldout"}]: prompts never trained on

Steps: records (self-distilled from the target, mined from Python source, or read from a
file / the hub) -> dedup on the prompt -> seeded hash split into held-out / train -> token
ids + loss mask (responses generated greedily by the target for self_distill and
code_prompts) -> cached bundle. The build runs in rounds (data_rounds.py) until
`data.max_tokens` training tokens are there; a later, bigger budget appends rounds to the
cached bundle, and a smaller one trains on a prefix of it.

Self-distilled bundles generated on the lean runtime also hold `hidden.npy`: the target's
hidden state at every token of every example ([tokens, H] fp32, the rows a feature cache
stores), kept while the answers were generated, so the feature cache is a copy of it
(`DataBundle.hidden`), not a second pass of the target over the data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from speclab.kernels.util.cache_lock import build_lock, work_dir_for
from speclab.speculator.target import FrozenTarget
from speclab.speculator.target.builders import cache_root

from .data_cache import (HIDDEN_FILE, META_FILE, bundle_bytes, data_fingerprint, publish, read_bundle,
                         replace_bundle, write_bundle)
from .data_config import SOURCES, DataConfig
from .data_rounds import Growth, Round, add_stats, next_round, split_records, with_rates
from .data_shards import RoundShards
from .shards import ShardPlan, drop_shards, shard_plan
from .data_sources import datasets_progress

log = logging.getLogger(__name__)

__all__ = ["DataBundle", "DataConfig", "SOURCES", "build_dataset", "split_records"]

TRAIN_FEATURES = datasets.Features({
    "input_ids": datasets.List(datasets.Value("int32")),
    "loss_mask": datasets.List(datasets.Value("int8")),
})


@dataclass
class DataBundle:
    train: datasets.Dataset  # columns input_ids: list[int], loss_mask: list[int]
    heldout: list[dict]  # {"messages": [turns before the reply], "category": "heldout"}
    fingerprint: str  # of everything the data depends on (config, tokenizer, model, files)
    path: Path  # the cache directory the bundle lives in
    stats: dict  # the trained prefix's examples, tokens, assistant_tokens; the build's generation
    # seconds and tokens/s; `cache`: the whole bundle's tokens, bytes, seconds, tok/s
    from_cache: bool = False  # loaded from an earlier build, nothing generated
    built_now: dict | None = None  # what this call built or appended: examples, tokens, seconds
    # The target's hidden states at every token of `train` ([tokens, H] fp32, read-only map of
    # the bundle's hidden.npy), where generation kept them; None otherwise.
    hidden: np.ndarray | None = None


def build_dataset(target: FrozenTarget, cfg: DataConfig, cache_dir: Path | None = None,
                  progress: bool = True, exclude: list[str] | tuple = ()) -> DataBundle:
    """The data set for `target`, loaded from `<cache_dir>/<fingerprint>` if built before
    (extended first when it holds fewer than `cfg.max_tokens` training tokens).

    cache_dir defaults to `$SPECLAB_CACHE/data` (SPECLAB_CACHE: ~/.cache/speclab).
    `exclude`: texts mined prompts must not overlap (the eval's prompts).
    """
    if not isinstance(cfg, DataConfig):
        raise TypeError(f"build_dataset needs a DataConfig, got {type(cfg).__name__}")
    exclude = list(exclude)
    fingerprint = data_fingerprint(target, cfg, exclude)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "data"
    final = root / fingerprint
    cached = read_bundle(final, fingerprint)
    if cached is not None and _covers(cached[2], cfg):
        bundle = _select(*cached, cfg, fingerprint, final, from_cache=True)
        log.info("data %s loaded from cache %s: %s", fingerprint, final, bundle.stats.get("cache"))
        return bundle
    plan = shard_plan(cfg.shards, cfg.shard)
    if plan.count > 1:
        return _build_in_shards(target, cfg, plan, final, progress, exclude)
    with build_lock(final):  # a second writer waits here, then reuses (or extends) the first one's bundle
        cached = read_bundle(final, fingerprint)
        if cached is not None and _covers(cached[2], cfg):
            return _select(*cached, cfg, fingerprint, final, from_cache=True)
        if cached is not None and "growth" not in cached[2]:
            cached = None  # built before bundles recorded how to extend them: rebuilt whole
        if cached is None:
            shutil.rmtree(final, ignore_errors=True)  # incomplete or damaged: rebuild from scratch
        extended, appended = cached is not None, None
        # Published after every round: a build stopped at any point (killed, out of disk, a
        # failed generation) keeps every finished round, and the next run extends from there.
        while cached is None or not _covers(cached[2], cfg):
            cached, appended = _publish_round(target, cfg, cached, final, appended, progress, exclude)
    bundle = _select(*cached, cfg, fingerprint, final)
    log.info("data %s %s: %s", fingerprint, "extended" if extended else "built", bundle.stats["cache"])
    return bundle


def _publish_round(target: FrozenTarget, cfg: DataConfig, cached, final: Path, appended: dict | None,
                   progress: bool, exclude: list[str], rnd: Round | None = None) -> tuple[tuple, dict]:
    """One more round on the bundle `cached` (None: none yet), published at `final` and read
    back (the train set memory-mapped from the cache). Returns it and what this call appended."""
    fingerprint = final.name
    work = work_dir_for(final)
    try:
        with datasets_progress(progress):
            train, heldout, meta = _grow(target, cfg, cached, work, progress, exclude,
                                         final if cached is not None else None, rnd)
            appended = meta["appended"] = _added(appended, meta["appended"])
            write_bundle(work, fingerprint, train, heldout,
                         {"config": dataclasses.asdict(cfg), "target": target.name, **meta})
        (replace_bundle if cached is not None else publish)(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gone already unless the round failed
    cached = read_bundle(final, fingerprint)
    if cached is None:
        raise RuntimeError(f"data bundle {final} is unreadable right after it was written")
    return cached, appended


def _build_in_shards(target: FrozenTarget, cfg: DataConfig, plan: ShardPlan, final: Path, progress: bool,
                     exclude: list[str]) -> DataBundle:
    """build_dataset with each round answered in shards (data_shards.py): the shards are built
    outside the bundle's lock, so that processes build theirs at once, and the first process
    to take the lock with every shard of the round at hand merges it; the others find the
    round merged and go on to the next."""
    fingerprint, appended, built = final.name, None, False
    rounds = final.parent / f"{fingerprint}.shards"
    while True:
        cached = read_bundle(final, fingerprint)
        if cached is not None and "growth" not in cached[2]:
            raise ValueError(f"data bundle {final} predates rounds and cannot be extended in shards: "
                             "rebuild it with data.shards=1")
        if cached is not None and _covers(cached[2], cfg):
            break
        r = cached[2]["growth"]["rounds"] if cached is not None else 0
        entry = rounds / f"round-{r}"
        shards = RoundShards(entry, plan, lambda: _rounds_in(final) > r)
        work, t0 = work_dir_for(final), time.perf_counter()
        try:
            rnd = next_round(target, cfg, Growth(**cached[2]["growth"]) if cached else Growth(), work, progress,
                             exclude, shards)
        except FileNotFoundError:
            if _rounds_in(final) > r:
                continue  # another process merged the round and dropped its shards as this one read them
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rnd.stats["build_seconds"] = time.perf_counter() - t0  # the round's wall time in this process
        with build_lock(final):
            if _rounds_in(final) == r:
                _, appended = _publish_round(target, cfg, cached, final, appended, progress, exclude, rnd)
                built = True
        drop_shards(entry)
    with contextlib.suppress(OSError):  # empty unless another process still looks (then it stays)
        rounds.rmdir()
    bundle = _select(*cached, cfg, fingerprint, final, from_cache=not built)
    log.info("data %s built in %d shards: %s", fingerprint, plan.count, bundle.stats["cache"])
    return bundle


def _rounds_in(final: Path) -> int:
    """Rounds the published bundle holds, from its meta alone (cheap; 0 without one)."""
    try:
        return json.loads((final / META_FILE).read_text())["growth"]["rounds"]
    except (OSError, ValueError, KeyError):
        return 0


def _added(before: dict | None, now: dict) -> dict:
    """What this call has appended so far: the rounds published before plus this one."""
    return now if before is None else {key: round(before[key] + now[key], 3) for key in now}


def _covers(meta: dict, cfg: DataConfig) -> bool:
    """Whether a cached bundle already holds what `cfg` asks for (round 0 at least)."""
    if cfg.max_tokens == 0:
        return True
    if "growth" not in meta:  # a bundle from before budgets: one round, never extended
        return meta["stats"]["assistant_tokens"] >= cfg.max_tokens
    return sum(meta["loss_tokens"]) >= cfg.max_tokens or meta["growth"]["exhausted"]


def _grow(target: FrozenTarget, cfg: DataConfig, start, work: Path, progress: bool,
          exclude: list[str], previous: Path | None = None, rnd: Round | None = None) -> tuple[datasets.Dataset, list[dict], dict]:
    """One more round on `start` (a cached bundle read from `previous`, or None; build_dataset
    loops until the budget is met); `rnd`: that round, where it was answered in shards. Returns the whole train set, the held-out rows and the meta the next
    round or extension continues from."""
    t0 = time.perf_counter()
    old, heldout, meta = start if start is not None else (None, [], {})
    growth = Growth(**meta["growth"]) if start is not None else Growth()
    stats = meta.get("stats", {}).get("build", {})
    lengths, loss_tokens = list(meta.get("lengths", [])), list(meta.get("loss_tokens", []))
    round_ends = list(meta.get("round_ends", []))  # examples in the bundle after each round
    if rnd is None:  # else built already, in shards
        rnd = next_round(target, cfg, growth, work, progress, exclude)
    examples = [e.truncated(cfg.max_seq_len) for e in rnd.examples]
    new = [e for e in examples if any(e.loss_mask)]  # a prompt longer than max_seq_len trains nothing
    if growth.rounds == 0:
        if not new:
            raise ValueError("no training example has an assistant token within data.max_seq_len="
                             f"{cfg.max_seq_len}; raise it or check the data")
        heldout = [{"messages": r.prompt_messages(), "category": "heldout"} for r in rnd.heldout]
    lengths += [len(e.input_ids) for e in new]
    loss_tokens += [sum(e.loss_mask) for e in new]
    round_ends.append(len(lengths))
    _write_hidden(work, previous, rnd, cfg.max_seq_len, sum(lengths[: len(lengths) - len(new)]))
    stats = add_stats(stats, {**rnd.stats, "dropped_without_loss": len(examples) - len(new)})
    growth.rounds, growth.keys, growth.exhausted = growth.rounds + 1, growth.keys + rnd.keys, rnd.exhausted
    growth.empty_rounds = 0 if new else growth.empty_rounds + 1
    if growth.empty_rounds == 3:  # dedup leaves nothing new: the source is spent
        log.warning("three rounds in a row gave no new training example; data.max_tokens=%d not reached",
                    cfg.max_tokens)
        growth.exhausted = True
    train = datasets.Dataset.from_dict(
        {"input_ids": [e.input_ids for e in new], "loss_mask": [e.loss_mask for e in new]}, features=TRAIN_FEATURES)
    if old is not None:
        train = datasets.concatenate_datasets([old, train])
    stats = add_stats(stats, {"build_seconds": time.perf_counter() - t0})
    return train, heldout, {"stats": {"build": stats}, "growth": dataclasses.asdict(growth),
                            "lengths": lengths, "loss_tokens": loss_tokens, "round_ends": round_ends,
                            "appended": {"examples": len(new), "tokens": sum(lengths[len(lengths) - len(new):]),
                                         "seconds": round(time.perf_counter() - t0, 3)}}


def _write_hidden(work: Path, previous: Path | None, rnd, max_seq_len: int, old_tokens: int) -> None:
    """The bundle's hidden.npy: the previous bundle's rows, then this round's (cut and
    filtered as its examples are). Written only when every round so far kept them."""
    if rnd.hidden is None:
        return
    old = _hidden_of(previous, old_tokens) if old_tokens else None
    if old_tokens and old is None:
        return  # an earlier round has none: a partial file would not line up with the examples
    rows = [h[:max_seq_len].numpy() for e, h in zip(rnd.examples, rnd.hidden) if any(e.loss_mask[:max_seq_len])]
    width = rows[0].shape[1] if rows else (old.shape[1] if old is not None else 0)
    total = old_tokens + sum(len(r) for r in rows)
    array = np.lib.format.open_memmap(work / HIDDEN_FILE, mode="w+", dtype=np.float32, shape=(total, width))
    if old is not None:
        array[:old_tokens] = old
    at = old_tokens
    for r in rows:
        array[at : at + len(r)] = r
        at += len(r)
    array.flush()


def _hidden_of(path: Path | None, tokens: int) -> np.ndarray | None:
    """The bundle's hidden.npy as a read-only map, if it exists and has one row per token."""
    if path is None or not (path / HIDDEN_FILE).is_file():
        return None
    try:
        hidden = np.load(path / HIDDEN_FILE, mmap_mode="r")
    except Exception as exc:  # the manifest matched, so this is a file of an unexpected layout
        log.warning("data cache %s: unreadable %s (%s); features will run the target", path, HIDDEN_FILE, exc)
        return None
    if hidden.ndim != 2 or hidden.shape[0] != tokens or hidden.dtype != np.float32:
        log.warning("data cache %s: %s has shape %s for %d tokens; features will run the target",
                    path, HIDDEN_FILE, hidden.shape, tokens)
        return None
    return hidden


def _select(train: datasets.Dataset, heldout: list[dict], meta: dict, cfg: DataConfig, fingerprint: str,
            path: Path, from_cache: bool = False) -> DataBundle:
    """The shortest prefix of the cached examples with `cfg.max_tokens` training tokens
    (round 0 without a budget, however far a budgeted run grew the cache), and the stats of it
    and of the whole cache."""
    if "growth" not in meta:  # a bundle from before budgets: its stats are already the run's
        return DataBundle(train, heldout, fingerprint, path, meta["stats"], from_cache)
    lengths, loss_tokens = meta["lengths"], meta["loss_tokens"]
    n, reached = (len(lengths) if cfg.max_tokens else meta.get("round_ends", [len(lengths)])[0]), 0
    if cfg.max_tokens:
        for i, count in enumerate(loss_tokens):
            reached += count
            if reached >= cfg.max_tokens:
                n = i + 1
                break
    build = with_rates(meta["stats"]["build"])
    seconds = build.get("build_seconds", 0.0)
    cache = {"examples": len(lengths), "tokens": sum(lengths), "loss_tokens": sum(loss_tokens),
             "bytes": bundle_bytes(path), "seconds": seconds, "tok_s": round(sum(lengths) / seconds, 2) if seconds else 0.0,
             "rounds": meta["growth"]["rounds"], "exhausted": meta["growth"]["exhausted"]}
    stats = {**build, "examples": n, "tokens": sum(lengths[:n]), "assistant_tokens": sum(loss_tokens[:n]),
             "heldout": len(heldout), "max_tokens": cfg.max_tokens, "cache": cache}
    if cfg.max_tokens and sum(loss_tokens[:n]) < cfg.max_tokens:
        log.warning("data source exhausted: %d training tokens of data.max_tokens=%d", sum(loss_tokens[:n]),
                    cfg.max_tokens)
    hidden = _hidden_of(path, sum(lengths))
    return DataBundle(train.select(range(n)) if n < len(train) else train, heldout, fingerprint, path, stats, from_cache,
                      None if from_cache else meta["appended"], None if hidden is None else hidden[: sum(lengths[:n])])
