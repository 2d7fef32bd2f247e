"""One round of a data build: the next examples a source gives, never the ones before.

A build is rounds 0, 1, 2, ...: round 0 also holds the held-out split; each later round
continues where the one before stopped (the next seeded prompts, the next files of the
seeded order), deduplicated against every prompt already taken, held-out ones included.
Round r depends on the config and r alone, so data built in one go equals data built in
several, and a bigger token budget appends rounds to a cache instead of rebuilding it.

Sources:
- self_distill: `num_prompts` Magpie-style user turns per round, answered greedily;
- code_prompts: the same, a share `mix` of them mined from Python source instead;
- code_corpus: `num_prompts` Python files per round, cut into `max_seq_len`-token chunks;
- file and hub sources: everything in round 0 (the budget then selects a prefix).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from speclab.speculator.target import FrozenTarget

from .code_source import PromptMiner, python_files, read_source, roots_of
from .data_config import DataConfig
from .data_shards import RoundShards
from .data_sources import Record, load_rows, normalise, to_records
from .data_tokenize import Encoded, encode_chat, encode_chunks, encode_text
from .self_distill import SampledPrompts, distill_responses, response_messages, sample_prompts

log = logging.getLogger(__name__)

HELDOUT_PROMPT_CHARS = 2000  # a held-out document is evaluated on its opening paragraph, cut here


@dataclass
class Growth:
    """Where a build stands; kept in the bundle's meta so that a later run can extend it."""

    rounds: int = 0
    keys: list[str] = field(default_factory=list)  # normalised prompts / document digests taken
    exhausted: bool = False  # the source has nothing more to give
    empty_rounds: int = 0  # rounds in a row that gave no new example (three: exhausted)


@dataclass
class Round:
    examples: list[Encoded]
    heldout: list[Record]  # round 0 only
    keys: list[str]
    stats: dict  # additive counts and seconds (rates are derived by `with_rates`)
    exhausted: bool
    # Per example, the target's hidden state at each of its tokens ([len, H] fp32), when the
    # round's generation computed them (self-distilled answers on the lean runtime).
    hidden: list | None = None


def round_seed(seed: int, r: int) -> int:
    """Round 0 keeps the configured seed (a one-round build is what it always was)."""
    return seed if r == 0 else int(hashlib.sha256(f"{seed}/round-{r}".encode()).hexdigest()[:8], 16)


def next_round(target: FrozenTarget, cfg: DataConfig, growth: Growth, work: Path, progress: bool,
               exclude: list[str], shards: RoundShards | None = None) -> Round:
    """`shards`: the round's shared entry where its answering is split across processes."""
    if cfg.source in ("self_distill", "code_prompts"):
        return _distilled_round(target, cfg, growth, progress, exclude, shards)
    if cfg.source == "code_corpus":
        return _corpus_round(target, cfg, growth)
    if growth.rounds > 0:  # a file or hub source gives everything in round 0
        return Round([], [], [], {}, exhausted=True)
    return _rows_round(target, cfg, work)


def _code_share(cfg: DataConfig, prompts: int) -> int:
    return round(cfg.mix * prompts) if cfg.source == "code_prompts" else 0


def _mined(cfg: DataConfig, r: int, exclude: list[str]) -> list[str]:
    """Round r's slice of the mined prompts: round 0 takes its share of num_prompts +
    heldout_size, every later round its share of num_prompts, in mined order."""
    first, later = _code_share(cfg, cfg.num_prompts + cfg.heldout_size), _code_share(cfg, cfg.num_prompts)
    count = first if r == 0 else later
    if count == 0:
        return []
    start = 0 if r == 0 else first + (r - 1) * later
    mined = PromptMiner.of(roots_of(cfg.path), cfg.seed, exclude).take(start, count)
    if len(mined) < count:
        log.warning("Python source ran out of prompts: round %d mined %d of %d", r, len(mined), count)
    return mined


def _chosen_prompts(target: FrozenTarget, cfg: DataConfig, r: int, progress: bool, exclude: list[str]) -> dict:
    """Round r's candidate prompts, mined and sampled (JSON-able: a sharded round shares it)."""
    wanted = cfg.num_prompts + (cfg.heldout_size if r == 0 else 0)
    t0 = time.perf_counter()
    code = _mined(cfg, r, exclude)
    mine_seconds = time.perf_counter() - t0
    chat_wanted = wanted - _code_share(cfg, wanted)
    sampled = (sample_prompts(target, dataclasses.replace(cfg, seed=round_seed(cfg.seed, r)), chat_wanted, progress)
               if chat_wanted else SampledPrompts([], 0, 0, 0.0))
    return {"code": code, "mine_seconds": mine_seconds, "sampled": dataclasses.asdict(sampled)}


def _distilled_round(target: FrozenTarget, cfg: DataConfig, growth: Growth, progress: bool,
                     exclude: list[str], shards: RoundShards | None) -> Round:
    r = growth.rounds

    def choose() -> dict:
        return _chosen_prompts(target, cfg, r, progress, exclude)
    chosen = shards.prompts(choose) if shards is not None else choose()
    code, mine_seconds, sampled = chosen["code"], chosen["mine_seconds"], SampledPrompts(**chosen["sampled"])
    records = [Record(key=p, messages=response_messages(cfg, p)) for p in code + sampled.prompts]
    if r == 0:
        if len(records) <= cfg.heldout_size:
            raise ValueError(
                f"only {len(records)} distinct, complete prompts ({len(code)} mined, {len(sampled.prompts)} of "
                f"{sampled.samples} sampled user turns within data.max_prompt_tokens={cfg.max_prompt_tokens}): not "
                f"enough for data.heldout_size={cfg.heldout_size} plus a training set; raise "
                "data.max_prompt_tokens or data.prompt_sampling_budget")
        train, heldout, duplicates = split_records(records, cfg)
    else:
        train, heldout = _new_only(records, growth), []
        duplicates = len(records) - len(train)
    keys = [rec.key for rec in train]
    examples, replies = (shards.distill(target, cfg, keys, progress) if shards is not None
                         else distill_responses(target, cfg, keys, progress))
    stats = {
        "prompts_sampled": sampled.samples, "prompts_kept": len(sampled.prompts), "prompts_mined": len(code),
        "prompt_mine_seconds": mine_seconds, "duplicates_removed": duplicates,
        "prompt_gen_seconds": sampled.seconds, "prompt_gen_tokens": sampled.new_tokens,
        "response_gen_seconds": replies.seconds, "response_gen_tokens": replies.new_tokens,
        "response_gen_prompts": len(train), "responses_truncated": replies.finished.count(False),
    }
    return Round(examples, heldout, [normalise(rec.key) for rec in heldout + train], stats, exhausted=not train,
                 hidden=replies.hidden)


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


def _new_only(records: list[Record], growth: Growth) -> list[Record]:
    seen, out = set(growth.keys), []
    for rec in records:
        key = normalise(rec.key)
        if key not in seen:
            seen.add(key)
            out.append(rec)
    return out


def _opening(text: str) -> str:
    """A held-out document's evaluation prompt: its first non-empty paragraph."""
    para = next((p for p in text.split("\n\n") if p.strip()), text)
    return para.strip()[:HELDOUT_PROMPT_CHARS]


@lru_cache(maxsize=4)
def _corpus_files(path: str | None, seed: int) -> tuple[Path, ...]:
    return tuple(p for p, _ in python_files(roots_of(path), seed))


def _corpus_round(target: FrozenTarget, cfg: DataConfig, growth: Growth) -> Round:
    files = _corpus_files(cfg.path, cfg.seed)
    per = cfg.num_prompts or len(files)
    r = growth.rounds
    lo = 0 if r == 0 else cfg.heldout_size + r * per
    hi = cfg.heldout_size + (r + 1) * per
    t0 = time.perf_counter()
    seen, docs = set(growth.keys), []
    for path in files[lo:hi]:
        text = read_source(path)
        digest = hashlib.sha256(text.encode()).hexdigest() if text and text.strip() else None
        if digest is not None and digest not in seen:  # vendored copies of a module count once
            seen.add(digest)
            docs.append((digest, text))
    heldout = docs[: cfg.heldout_size] if r == 0 else []
    train = docs[len(heldout):]
    examples = [c for _, text in train for c in encode_chunks(target.tokenizer, text, cfg.max_seq_len)]
    stats = {"files_read": len(docs), "tokenize_seconds": time.perf_counter() - t0}
    held = [Record(key=d, text=_opening(text)) for d, text in heldout]
    return Round(examples, held, [d for d, _ in docs], stats, exhausted=hi >= len(files))


def _rows_round(target: FrozenTarget, cfg: DataConfig, work: Path) -> Round:
    scratch = work / "rows"  # the parsed files; not part of the bundle
    records, skipped = to_records(cfg, load_rows(cfg, scratch))
    train, heldout, duplicates = split_records(records, cfg)
    tok, end_ids = target.tokenizer, target.eos_token_ids
    if cfg.source == "text" and cfg.text_split == "chunk":
        examples = [c for rec in train for c in encode_chunks(tok, rec.text, cfg.max_seq_len)]
        heldout = [Record(key=rec.key, text=_opening(rec.text)) for rec in heldout]
    else:
        examples = [encode_chat(tok, rec.messages, end_ids) if rec.messages is not None else encode_text(tok, rec.text)
                    for rec in train]
    stats = {"rows_skipped": skipped, "duplicates_removed": duplicates}
    return Round(examples, heldout, [normalise(rec.key) for rec in heldout + train], stats, exhausted=True)


# --- statistics over rounds ----------------------------------------------------------------

_RATES = {  # rate: (count, seconds)
    "prompt_gen_tokens_per_s": ("prompt_gen_tokens", "prompt_gen_seconds"),
    "prompt_gen_prompts_per_s": ("prompts_kept", "prompt_gen_seconds"),
    "response_gen_tokens_per_s": ("response_gen_tokens", "response_gen_seconds"),
    "response_gen_prompts_per_s": ("response_gen_prompts", "response_gen_seconds"),
    "generated_tokens_per_s": ("generated_tokens", "generation_seconds"),
}


def add_stats(total: dict, more: dict) -> dict:
    """Counts and seconds of two builds (or rounds) added up; rates are not additive and
    are left to `with_rates`."""
    out = {k: v for k, v in total.items() if k not in _RATES}
    for k, v in more.items():
        out[k] = out.get(k, 0) + v
    return out


def with_rates(stats: dict) -> dict:
    out = dict(stats)
    out["generated_tokens"] = out.get("prompt_gen_tokens", 0) + out.get("response_gen_tokens", 0)
    out["generation_seconds"] = round(out.get("prompt_gen_seconds", 0) + out.get("response_gen_seconds", 0), 3)
    for rate, (count, seconds) in _RATES.items():
        if count in out or seconds in out:
            s = out.get(seconds, 0)
            out[rate] = round(out.get(count, 0) / s, 2) if s > 0 else 0.0
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
