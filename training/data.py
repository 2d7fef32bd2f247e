"""The training data set: built once per fingerprint, shared by every run of a sweep.

    bundle = build_dataset(target, DataConfig(**cfg.data))
    bundle.train    # datasets.Dataset: input_ids, loss_mask (1 on assistant tokens)
    bundle.heldout  # [{"messages": [...], "category": "heldout"}]: prompts never trained on

Steps: records (self-distilled from the target, or read from a file / the hub) ->
dedup on the prompt -> seeded hash split into held-out / train -> token ids + loss mask
(responses generated greedily by the target for self_distill) -> cached bundle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import datasets

from speclab.speculator.target import FrozenTarget
from speclab.speculator.targets import cache_root

from .data_cache import data_fingerprint, new_work_dir, publish, read_bundle, write_bundle
from .data_config import SOURCES, DataConfig
from .data_sources import Record, datasets_progress, load_rows, normalise, to_records
from .data_tokenize import encode_chat, encode_text
from .self_distill import distill_responses, response_messages, sample_prompts

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
    stats: dict  # examples, tokens, assistant_tokens, generation seconds and tokens/s, ...
    from_cache: bool = False  # loaded from an earlier build, nothing generated


def build_dataset(target: FrozenTarget, cfg: DataConfig, cache_dir: Path | None = None,
                  progress: bool = True) -> DataBundle:
    """The data set for `target`, loaded from `<cache_dir>/<fingerprint>` if built before.

    cache_dir defaults to `$SPECLAB_CACHE/data` (SPECLAB_CACHE: ~/.cache/speclab).
    """
    if not isinstance(cfg, DataConfig):
        raise TypeError(f"build_dataset needs a DataConfig, got {type(cfg).__name__}")
    fingerprint = data_fingerprint(target, cfg)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "data"
    final = root / fingerprint
    cached = read_bundle(final, fingerprint)
    if cached is not None:
        train, heldout, meta = cached
        log.info("data %s loaded from cache %s", fingerprint, final)
        return DataBundle(train, heldout, fingerprint, final, meta["stats"], from_cache=True)
    shutil.rmtree(final, ignore_errors=True)  # incomplete or damaged: rebuild from scratch
    work = new_work_dir(root, fingerprint)
    try:
        with datasets_progress(progress):
            train, heldout, stats = _build(target, cfg, work, progress)
            write_bundle(work, fingerprint, train, heldout,
                         {"config": dataclasses.asdict(cfg), "target": target.name, "stats": stats})
        publish(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gone already unless the build failed
    log.info("data %s built: %s", fingerprint, stats)
    # Reload from the published bundle so the train set is memory-mapped from the cache.
    published = read_bundle(final, fingerprint)
    if published is None:
        raise RuntimeError(f"data bundle {final} is unreadable right after it was written")
    train, heldout, meta = published
    return DataBundle(train, heldout, fingerprint, final, meta["stats"])


def _build(target: FrozenTarget, cfg: DataConfig, work: Path,
           progress: bool) -> tuple[datasets.Dataset, list[dict], dict]:
    t0 = time.perf_counter()
    if cfg.source == "self_distill":
        examples, heldout, stats = _self_distilled(target, cfg, progress)
    else:
        examples, heldout, stats = _from_rows(target, cfg, work)
    examples = [e.truncated(cfg.max_seq_len) for e in examples]
    kept = [e for e in examples if any(e.loss_mask)]  # a prompt longer than max_seq_len trains nothing
    if not kept:
        raise ValueError("no training example has an assistant token within data.max_seq_len="
                         f"{cfg.max_seq_len}; raise it or check the data")
    train = datasets.Dataset.from_dict(
        {"input_ids": [e.input_ids for e in kept], "loss_mask": [e.loss_mask for e in kept]},
        features=TRAIN_FEATURES)
    stats.update(
        examples=len(kept), dropped_without_loss=len(examples) - len(kept),
        tokens=sum(len(e.input_ids) for e in kept), assistant_tokens=sum(sum(e.loss_mask) for e in kept),
        heldout=len(heldout), build_seconds=round(time.perf_counter() - t0, 3))
    heldout_rows = [{"messages": r.prompt_messages(), "category": "heldout"} for r in heldout]
    return train, heldout_rows, stats


def _self_distilled(target: FrozenTarget, cfg: DataConfig, progress: bool):
    sampled = sample_prompts(target, cfg, cfg.num_prompts + cfg.heldout_size, progress)
    if len(sampled.prompts) <= cfg.heldout_size:
        raise ValueError(
            f"the target ended only {len(sampled.prompts)} of {sampled.samples} sampled user turns "
            f"within data.max_prompt_tokens={cfg.max_prompt_tokens} (distinct, well formed): not enough "
            f"for data.heldout_size={cfg.heldout_size} plus a training set; raise data.max_prompt_tokens "
            "or data.prompt_sampling_budget")
    records = [Record(key=p, messages=response_messages(cfg, p)) for p in sampled.prompts]
    train, heldout, duplicates = split_records(records, cfg)
    examples, replies = distill_responses(target, cfg, [r.key for r in train], progress)
    generated = sampled.new_tokens + replies.new_tokens
    seconds = sampled.seconds + replies.seconds
    stats = {
        "prompts_sampled": sampled.samples, "prompts_kept": len(sampled.prompts),
        "duplicates_removed": duplicates,
        "prompt_gen_seconds": round(sampled.seconds, 3), "prompt_gen_tokens": sampled.new_tokens,
        "prompt_gen_tokens_per_s": _rate(sampled.new_tokens, sampled.seconds),
        "prompt_gen_prompts_per_s": _rate(len(sampled.prompts), sampled.seconds),
        "response_gen_seconds": round(replies.seconds, 3), "response_gen_tokens": replies.new_tokens,
        "response_gen_tokens_per_s": _rate(replies.new_tokens, replies.seconds),
        "response_gen_prompts_per_s": _rate(len(train), replies.seconds),
        "responses_truncated": replies.finished.count(False),
        "generation_seconds": round(seconds, 3), "generated_tokens": generated,
        "generated_tokens_per_s": _rate(generated, seconds),
    }
    return examples, heldout, stats


def _from_rows(target: FrozenTarget, cfg: DataConfig, work: Path):
    scratch = work / "rows"  # the parsed files; not part of the bundle
    records, skipped = to_records(cfg, load_rows(cfg, scratch))
    shutil.rmtree(scratch, ignore_errors=True)
    train, heldout, duplicates = split_records(records, cfg)
    tok, end_ids = target.tokenizer, target.eos_token_ids
    examples = [encode_chat(tok, r.messages, end_ids) if r.messages is not None else encode_text(tok, r.text)
                for r in train]
    stats = {"rows_skipped": skipped, "duplicates_removed": duplicates,
             "generation_seconds": 0.0, "generated_tokens": 0, "generated_tokens_per_s": 0.0}
    return examples, heldout, stats


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 2) if seconds > 0 else 0.0


def _split_rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}\n{normalise(key)}".encode()).hexdigest()


def split_records(records: list[Record], cfg: DataConfig) -> tuple[list[Record], list[Record], int]:
    """(train, heldout, duplicates removed). Records are deduplicated on their prompt and
    ranked by a seeded hash of it: the first `heldout_size` are held out, the next
    `num_prompts` (0: all) are trained on. A prompt's side depends on its text and the
    seed only, never on row order, so held-out prompts never leak into train."""
    unique: dict[str, Record] = {}
    for r in records:
        unique.setdefault(normalise(r.key), r)
    if len(unique) <= cfg.heldout_size:
        raise ValueError(f"only {len(unique)} distinct prompts: not enough for data.heldout_size="
                         f"{cfg.heldout_size} plus a training set")
    ranked = sorted(unique.values(), key=lambda r: _split_rank(cfg.seed, r.key))
    heldout, train = ranked[: cfg.heldout_size], ranked[cfg.heldout_size:]
    if cfg.num_prompts:
        train = train[: cfg.num_prompts]
    return train, heldout, len(records) - len(unique)
