"""Self-distillation data from the target alone (Magpie-style), no download needed.

1. Prompts: the instruct target is fed its chat template up to the start of a user turn
   (after a system prompt that steers the topic) and samples the user's message until its
   end-of-turn token. Truncated, empty or malformed turns are dropped, duplicates removed.
2. Responses: the target answers each prompt greedily, so a speculator trained on them
   learns the target's greedy behaviour (what lossless greedy decoding verifies; exactly so
   for an fp32 target, at transformers' bf16 cache precision for a bf16 one, where near
   ties can go the other way).

Both phases generate in batches (the lean runtime's batched generation, or transformers'
`generate` with left padding on the hf runtime). On the lean runtime the responses phase
also keeps the target's hidden state at every token of prompt and answer: the feature
cache's rows, so self-distilled data needs no second, teacher-forced pass
(training/features.py).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

from speclab.kernels.verify import sample_inverse_cdf, warp_logits
from speclab.speculator.target.runtime.generate import Chooser, generate_batch, greedy
from speclab.speculator.target import FrozenTarget
from speclab.speculator.target.prompts import left_pad, pad_id

from .data_config import DataConfig
from .data_sources import normalise
from .data_tokenize import Encoded, encode_prompt_reply, prompt_ids, tokenize, user_turn_prefix

log = logging.getLogger(__name__)


@dataclass
class Generated:
    replies: list[list[int]]  # new tokens per prompt, through the first end-of-turn token
    finished: list[bool]  # the reply ended with an end-of-turn token
    new_tokens: int  # tokens generated, padding excluded
    seconds: float
    # Per prompt, the target's final hidden state at every token of prompt + reply
    # ([len, H] fp32), when asked for and the lean runtime generated; else None.
    hidden: list[torch.Tensor] | None = None


@dataclass
class SampledPrompts:
    prompts: list[str]  # distinct user turns, in sampling order
    samples: int  # user turns drawn, including the dropped ones
    new_tokens: int
    seconds: float


def _cut_at_end_of_turn(row: list[int], end_ids: set[int]) -> tuple[list[int], bool]:
    for i, tok in enumerate(row):
        if tok in end_ids:
            return row[: i + 1], True
    return row, False


def _continue(target: FrozenTarget, rows: list[list[int]], gen: GenerationConfig,
              hidden: list | None = None) -> list[list[int]]:
    """New tokens per prompt: the lean runtime's batched generation (rows at their own
    lengths, finished rows leave the batch; `hidden` receives each row's hidden states), else
    transformers' generate with left padding (`hidden` stays empty)."""
    if target.lean is not None:
        return generate_batch(target.lean, rows, gen.max_new_tokens, target.eos_token_ids, _chooser(gen), hidden)
    ids, mask = left_pad(rows, pad_id(target), target.device)
    out = target.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
    return out[:, ids.shape[1]:].tolist()  # [b, new]


# Rows per slice of a sampling step: a [16, V] slice's softmax and cumulative sum stay in the
# cache, where a [128, V] one does not (on a 2-core Xeon, 128 rows took 15 ms in slices of 16
# against 47 ms whole; torch.multinomial, which this replaced, took 120 ms).
SAMPLE_SLICE = 16


def _chooser(gen: GenerationConfig) -> Chooser:
    """Greedy, or a sample of the warped distribution (transformers' temperature, top-k and
    top-p warpers) by inverse CDF: one uniform per row from the global torch RNG (seed it to
    repeat), not one random number per vocabulary entry as torch.multinomial draws."""
    if not gen.do_sample:
        return greedy
    temperature, top_k = float(gen.temperature or 1.0), int(gen.top_k or 0)
    top_p = float(gen.top_p if gen.top_p is not None else 1.0)

    def sample(logits: torch.Tensor) -> torch.Tensor:
        u = torch.rand(logits.shape[0], device=logits.device)
        return torch.cat([sample_inverse_cdf(warp_logits(logits[i:i + SAMPLE_SLICE], temperature, top_k, top_p)
                                             .softmax(-1), u[i:i + SAMPLE_SLICE])
                          for i in range(0, logits.shape[0], SAMPLE_SLICE)])
    return sample


@torch.no_grad()
def generate_batched(target: FrozenTarget, prompts: list[list[int]], gen: GenerationConfig,
                     batch_size: int, desc: str = "generating", progress: bool = True,
                     keep_hidden: bool = False) -> Generated:
    """Continue every prompt, `batch_size` at a time (see `_continue`).

    Prompts are batched in length order (less padding) and returned in input order.
    `keep_hidden`: also the target's hidden states per prompt (`Generated.hidden`), where the
    runtime gives them for every token of every prompt + reply.
    """
    end_ids = target.eos_token_ids
    order = length_order(prompts)
    replies: list[list[int]] = [[] for _ in prompts]
    hidden: list[torch.Tensor | None] = [None] * len(prompts)
    finished = [False] * len(prompts)
    new_tokens, t0 = 0, time.perf_counter()
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not progress, leave=False):
        idx = order[start : start + batch_size]
        kept: list | None = [] if keep_hidden else None
        for n, (i, row) in enumerate(zip(idx, _continue(target, [prompts[i] for i in idx], gen, kept))):
            replies[i], finished[i] = _cut_at_end_of_turn(row, end_ids)
            new_tokens += len(replies[i])
            if kept and len(kept[n]) == len(prompts[i]) + len(replies[i]):
                hidden[i] = kept[n]
    whole = keep_hidden and all(h is not None for h in hidden)  # a row short of its last token: none kept
    return Generated(replies, finished, new_tokens, time.perf_counter() - t0, hidden if whole else None)


# Prompts per batched generation step where the config leaves it to the machine
# (data.gen_batch_size=0). Where the target's wide passes run its layers on torch's bf16 GEMM
# (AMX, wide_gemm.py) a step is compute-bound and wider steps pay: on an AMX Xeon, answering
# 128 mined prompts ran at 493 / 528 / 593 tok/s at 32 / 64 / 128 prompts per batch. On the
# native kernels alone 32 was best (an AVX2 Zen 3: 194 / 177 / 202 / 210 tok/s at 16 / 24 /
# 48 / 32; docs/archive/results-history.md).
WIDE_GEN_BATCH, NATIVE_GEN_BATCH = 128, 32


def generation_batch_size(target: FrozenTarget, cfg: DataConfig) -> int:
    """cfg.gen_batch_size, or this machine's choice where it is 0."""
    if cfg.gen_batch_size > 0:
        return cfg.gen_batch_size
    lean = target.lean
    return WIDE_GEN_BATCH if lean is not None and lean.wide.layer_rows is not None else NATIVE_GEN_BATCH


def _generation_config(target: FrozenTarget, max_new_tokens: int, **sampling) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=sorted(target.eos_token_ids),
                            pad_token_id=pad_id(target), **sampling)


def _user_turn_text(target: FrozenTarget, reply: list[int], finished: bool) -> str | None:
    """The sampled user message, or None if it is truncated, empty or malformed (holds a
    special token such as a new turn header before its end-of-turn token)."""
    if not finished:
        return None
    body = reply[:-1]
    if set(body) & set(target.tokenizer.all_special_ids):
        return None
    text = target.tokenizer.decode(body).strip()
    return text or None


# Draw this many x the user turns a round still misses, at the yield its earlier draws had.
# About 60% of SmolLM2's sampled turns are kept (the rest truncated, malformed or repeated),
# so a round of 112 drew whole batches of 128 twice: 256 turns, ~70 more than it needed.
DRAW_MARGIN = 1.15


def _draws_for(missing: int, kept: int, drawn: int, batch_size: int) -> int:
    """Turns to draw next: a whole batch first (no yield known yet), then the missing ones at
    the yield so far, with DRAW_MARGIN to spare (a short draw costs one more batch)."""
    if not kept:
        return batch_size
    return math.ceil(missing * drawn / kept * DRAW_MARGIN)


def sample_prompts(target: FrozenTarget, cfg: DataConfig, wanted: int, progress: bool = True) -> SampledPrompts:
    """Sample up to `wanted` distinct user turns from the target (seeded by cfg.seed)."""
    tok = target.tokenizer
    prefixes = [tokenize(tok, user_turn_prefix(tok, s)) for s in (cfg.system_prompts or [None])]
    gen = _generation_config(target, cfg.max_prompt_tokens, do_sample=True, top_k=0,
                             temperature=cfg.prompt_temperature, top_p=cfg.prompt_top_p)
    budget = math.ceil(wanted * cfg.prompt_sampling_budget)
    kept: list[str] = []
    seen: set[str] = set()
    drawn = new_tokens = 0
    seconds = 0.0
    batch_size = generation_batch_size(target, cfg)
    bar = tqdm(total=wanted, desc="sampling prompts", unit="prompt", disable=not progress, leave=False)
    with torch.random.fork_rng(devices=[target.device] if target.device.type == "cuda" else []):
        torch.manual_seed(cfg.seed)
        while len(kept) < wanted and drawn < budget:
            n = min(batch_size, budget - drawn, _draws_for(wanted - len(kept), len(kept), drawn, batch_size))
            batch = [prefixes[(drawn + j) % len(prefixes)] for j in range(n)]  # cycle system prompts
            out = generate_batched(target, batch, gen, batch_size=n, progress=False)
            drawn, new_tokens, seconds = drawn + n, new_tokens + out.new_tokens, seconds + out.seconds
            for reply, finished in zip(out.replies, out.finished):
                text = _user_turn_text(target, reply, finished)
                if text is not None and normalise(text) not in seen and len(kept) < wanted:
                    seen.add(normalise(text))
                    kept.append(text)
            bar.update(len(kept) - bar.n)
    bar.close()
    if len(kept) < wanted:
        log.warning("sampled %d user turns but only %d were distinct, complete and well formed "
                    "(%d wanted); raise data.prompt_sampling_budget or data.max_prompt_tokens",
                    drawn, len(kept), wanted)
    return SampledPrompts(kept, drawn, new_tokens, seconds)


def response_messages(cfg: DataConfig, prompt: str) -> list[dict]:
    """The conversation a prompt is answered (and later evaluated) in."""
    system = [{"role": "system", "content": cfg.response_system_prompt}] if cfg.response_system_prompt else []
    return system + [{"role": "user", "content": prompt}]


def distill_responses(target: FrozenTarget, cfg: DataConfig, prompts: list[str],
                      progress: bool = True) -> tuple[list[Encoded], Generated]:
    """Answer each prompt greedily with the target; one encoded example per prompt (and, on
    the lean runtime, `Generated.hidden`: each example's feature rows)."""
    contexts = response_contexts(target, cfg, prompts)
    out = answer(target, cfg, contexts, progress)
    return [encode_prompt_reply(c, r) for c, r in zip(contexts, out.replies)], out


def response_contexts(target: FrozenTarget, cfg: DataConfig, prompts: list[str]) -> list[list[int]]:
    """Each prompt's token ids up to where the assistant's answer starts."""
    return [prompt_ids(target.tokenizer, response_messages(cfg, p)) for p in prompts]


def answer(target: FrozenTarget, cfg: DataConfig, contexts: list[list[int]], progress: bool = True) -> Generated:
    """The target's greedy answers to `contexts`, with their hidden states where kept."""
    gen = _generation_config(target, cfg.max_response_tokens, do_sample=False)
    return generate_batched(target, contexts, gen, generation_batch_size(target, cfg), "self-distilling responses",
                            progress, keep_hidden=True)


def length_order(rows: list[list[int]]) -> list[int]:
    """The order `generate_batched` batches rows in: by length, ties in input order."""
    return sorted(range(len(rows)), key=lambda i: len(rows[i]))
