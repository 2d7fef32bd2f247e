"""Each run scored with its best drafting method, as a serving engine would deploy it.

A speculator's speedup depends on how it drafts: a chain of k tokens, or a tree of several
candidates per position verified in one pass. Which wins depends on the target's cost of
verifying n tokens at once, which depends on the machine (a GPU verifies 32 tokens for
little more than one; a CPU pays nearly per token).

1. The verification-cost curve: ms for the target to verify n tokens after a prompt, for
   each n of `cost_lengths`, through the target's public call (a tree mask that is a chain,
   so tree verification's own path is timed), median of `cost_repeats`. It is a property of
   the target and the machine, not of the speculator: part of the machine profile
   (speculator/target/profile.py), measured once per target, dtype, runtime and machine by
   its measuring step and reused by every later run (`cost_cache: false` measures it every
   run); result.json says which.
2. The tree's size from the curve: its budget is the largest n verified within
   `cost_slack` x the cost of one token (beyond that, every extra node costs more than it is
   likely to earn), depth and top_k from the config, depth capped at the budget. A
   speculator offering several candidate chains (the hybrid) also gets a union tree of that
   budget (at least the longest of `chain_k` + 2), its chains as long as the longest of `chain_k`,
   and a compact union: chains as deep as the sized tree, two nodes more than that depth.
3. A pilot: every candidate (chains at each k of `chain_k`, the sized tree) decodes the
   first `pilot_prompts` prompts of the pilot split (`pilot_set`, eval/task_sets.py: prompts
   no scored set holds, so the choice is not made on the prompts it is then scored on) for
   `pilot_tokens` tokens, in two rounds (the candidates
   in order, then in reverse, so drift in the host's speed favours none), drafting exactly
   as the score then drafts, timed by tokens per second of decoding (drafting +
   verification; the prefill, the same for every candidate, is left out). Plain decoding
   is the same for all candidates, so tokens/s ranks speedups.
4. The choice: each candidate's speed is its faster round (other tenants only ever slow a
   round: one burst cost a demo's union tree 19% of one round, and the pilot took a smaller
   tree it had timed slower in the other); of the candidates within `tie` of the fastest,
   the one that accepts the most tokens a step. Why not simply the fastest: on 2 prompts
   the pilot's two rounds of one candidate disagree by 1-6% on a quiet 2-core host, more
   than chains of 4, 6 and 8 differ, so its fastest was a coin toss among them; their
   acceptance is measured without that noise (greedy decoding is deterministic), and scored
   on 16 prompts the longer chain won (`suffix_corpus`: 1.94x / 2.01x / 2.03x at k = 4 / 6
   / 8, docs/archive/results-history.md).

The chosen method is then scored on every prompt as usual (benchmark.score). The
speculator's request memory (`Speculator.reset`) is cleared before each pilot and the
final score, so no candidate is scored on what another one decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from speclab.speculator.base import Speculator
from speclab.speculator.fast_linear import native_drafting
from speclab.speculator.target import FrozenTarget
from speclab.speculator.target.measure import recorded_verify_cost, verification_cost, verify_cost

from .engine import effective_draft_len, generate_speculative
from .tree import TreeConfig, generate_tree

WARMUP_TOKENS = 4  # an untimed run per candidate: first calls of a shape are slower
COST_CONTEXT = 128  # cached tokens the remembered curve is measured after (the prompt's tokens, tiled)
METHOD_KEYS = ("kind", "k", "shape", "depth", "top_k", "budget")  # what names a drafting method


@dataclass
class MethodConfig:
    """How a run's drafting method is chosen (configs/eval: `method`)."""

    select: Literal["best", "fixed"] = "best"
    """best: pilot every candidate and score the fastest; fixed: score a chain of eval.k."""
    chain_k: list[int] = field(default_factory=lambda: [1, 2, 4, 6, 8])
    """Chain lengths tried (each capped at the speculator's longest chain). 8: where 9 tokens
    verify cheaply (AMX) the pilot takes it, acceptance 3.02 against 2.89 at the same speed
    (docs/archive/results-history.md)."""
    tree_depth: int = 4
    """Deepest path of the candidate tree (capped at the speculator's longest chain)."""
    tree_top_k: int = 4
    """Children per expanded node of the candidate tree."""
    cost_lengths: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    """Token counts n at which the verification cost is measured."""
    cost_repeats: int = 3
    """Timed verifications per n (the median is kept)."""
    cost_slack: float = 1.5
    """The tree's budget: the largest n verified within this many times one token's cost."""
    cost_cache: bool = True
    """Reuse the curve measured earlier for this target on this machine (false: measure every run)."""
    pilot_prompts: int = 2
    """Prompts the candidates decode in the pilot (the first of `pilot_set`)."""
    pilot_set: str = "pilot"
    """The built-in prompt set the pilot decodes (eval/task_sets.py): HumanEval's last tasks
    and one prompt of each built-in kind, held out of every scored set."""
    tuned_on: str = "humaneval[0:16]"
    """The prompts this config's knobs (chain_k, cost_slack, tie, pilot_tokens) were tuned on:
    the data-scaling study's 16 HumanEval prompts. A figure on those prompts is one the knobs
    were chosen for; the sweeps' `eval.heldout_set` is scored on prompts nothing was tuned on.
    Recorded in result.json's `method` block."""
    pilot_tokens: int = 64
    """New tokens per pilot prompt."""
    tie: float = 0.05
    """Candidates within this fraction of the fastest pilot tokens/s (each by its faster round)
    are tied; of those, the one accepting the most tokens a step is chosen (module docstring,
    step 4). 0: the fastest."""

    def __post_init__(self) -> None:
        if self.select not in ("best", "fixed"):
            raise ValueError(f"eval.method.select must be best or fixed, got {self.select!r}")
        if not self.chain_k or min(self.chain_k) < 1 or not self.cost_lengths or min(self.cost_lengths) < 1:
            raise ValueError("eval.method needs chain_k and cost_lengths of positive integers")
        if not 0 <= self.tie < 1:
            raise ValueError(f"eval.method.tie must be in [0, 1), got {self.tie!r}")


def cost_curve(target: FrozenTarget, prompt: torch.Tensor, cfg: MethodConfig) -> tuple[dict[int, float], str]:
    """(the verification-cost curve, where it came from): the machine profile's where
    cfg.cost_cache (measured by its step and recorded where it holds none), else measured
    after this prompt."""
    if not cfg.cost_cache:
        return verification_cost(target, prompt, cfg.cost_lengths, cfg.cost_repeats), "measured"
    recorded = recorded_verify_cost(target, cfg.cost_lengths, cfg.cost_repeats, COST_CONTEXT)
    if recorded is not None:
        return recorded, "measured earlier on this machine"
    context = prompt[:, -1:].new_tensor(prompt[0].tolist() * (COST_CONTEXT // prompt.shape[1] + 1))[None, :COST_CONTEXT]
    return verify_cost(target, context, cfg.cost_lengths, cfg.cost_repeats), "measured"


def tree_for(cost: dict[int, float], cfg: MethodConfig, speculator: Speculator) -> TreeConfig:
    """The dynamic tree the cost curve affords (module docstring, step 2)."""
    base = cost[min(cost)]
    budget = max([n for n, ms in cost.items() if ms <= cfg.cost_slack * base] or [min(cost)])
    budget = max(budget, 2)  # a one-node tree is a chain of 1, which the chains already cover
    depth = min(effective_draft_len(speculator, cfg.tree_depth), budget)
    return TreeConfig("dynamic", depth=depth, top_k=cfg.tree_top_k, budget=budget)


def candidates(speculator: Speculator, cfg: MethodConfig, tree: TreeConfig | None) -> list[dict]:
    """[{"kind": "chain", "k"} ...] + [{"kind": "tree", shape, depth, top_k, budget} ...]."""
    ks = sorted({effective_draft_len(speculator, k) for k in cfg.chain_k})
    methods = [{"kind": "chain", "k": k} for k in ks]
    trees = [] if tree is None else [tree]
    if tree is not None and speculator.offers_chains():
        # Room for the longest chain and a second chain's first two tokens, at least: a union
        # cut to the first chain is that chain, which the chains already cover.
        budget = max(tree.budget, max(ks) + 2)
        trees.append(TreeConfig("union", depth=max(ks), top_k=tree.top_k, budget=budget))
        # And a compact one, the sized tree's depth plus two: where verifying 8 tokens costs
        # 1.6x one (a CPU without bf16 pair products) the full union lost what it accepted
        # (16 HumanEval prompts, one process: depth 6 of 8 nodes 1.61x, depth 4 of 6 1.73x).
        compact = TreeConfig("union", depth=tree.depth, top_k=tree.top_k, budget=tree.depth + 2)
        if compact != trees[-1]:
            trees.append(compact)
    for t in trees:
        methods.append({"kind": "tree", "shape": t.shape, "depth": t.depth, "top_k": t.top_k, "budget": t.budget})
    return methods


def decode(target: FrozenTarget, speculator: Speculator, prompt: torch.Tensor, max_new: int, method: dict):
    if method["kind"] == "chain":
        return generate_speculative(target, speculator, prompt, max_new, method["k"])
    tree = TreeConfig(method["shape"], method["depth"], method["top_k"], method["budget"])
    return generate_tree(target, speculator, prompt, max_new, tree)


def pilot(target: FrozenTarget, speculator: Speculator, prompts: list[torch.Tensor], methods: list[dict],
          max_new: int) -> list[dict]:
    """Each method's tokens/s and acceptance length on the prompts (method dicts extended).
    The speculator drafts as benchmark.score will drive it (its linear layers on the native
    GEMM): piloted on torch's slower GEMV, drafting-heavy methods would lose a choice they
    win in the score."""
    with native_drafting(speculator, target.dtype):
        return _pilot(target, speculator, prompts, methods, max_new)


def _pilot(target: FrozenTarget, speculator: Speculator, prompts: list[torch.Tensor], methods: list[dict],
           max_new: int) -> list[dict]:
    gens: dict[int, list] = {}  # method index -> its generations, both rounds
    errors: dict[int, str] = {}
    for i, method in enumerate(methods):
        speculator.reset()
        try:
            decode(target, speculator, prompts[0], WARMUP_TOKENS, method)
            gens[i] = []
        except NotImplementedError as exc:  # a family without tree drafting: its chains still compete
            errors[i] = str(exc)
    # Two rounds, the candidates in order and then in reverse: a host whose speed drifts
    # during the pilot (other tenants, clocks) favours no candidate for being tried first,
    # where one round had picked a tree over a chain on a 2% lead its score then lost.
    # Greedy decoding is deterministic, so each round decodes the same tokens.
    for order in (list(gens), list(gens)[::-1]):
        for i in order:
            speculator.reset()
            gens[i].append([decode(target, speculator, p, max_new, methods[i]) for p in prompts])
    speculator.reset()
    out = []
    for i, method in enumerate(methods):
        if i in errors:
            out.append({**method, "tok_s": None, "error": errors[i]})
            continue
        both = [g for round_ in gens[i] for g in round_]
        steps = [n for g in both for n in g.accepted]
        out.append({**method, **_decoding_rate(both), "tok_s_rounds": [_decoding_rate(r)["tok_s"] for r in gens[i]],
                    "acceptance_length": 1 + sum(steps) / len(steps) if steps else None})
    return out


def _decoding_rate(generations: list) -> dict:
    """{tok_s, new_tokens, seconds} of decoding alone (drafting + verification): every
    candidate pays the same prefill, which on a short pilot would dilute the differences the
    choice is made on."""
    tokens, seconds = sum(g.new_tokens for g in generations), sum(g.draft_seconds + g.verify_seconds for g in generations)
    return {"tok_s": tokens / max(seconds, 1e-9), "new_tokens": tokens, "seconds": seconds}


def choose(target: FrozenTarget, speculator: Speculator, prompts: list[torch.Tensor], cfg: MethodConfig,
           max_new_tokens: int | None = None) -> dict:
    """result.json's `method` block: the cost curve, every candidate's pilot figures, the
    choice. `prompts` are the pilot split's (the caller encodes `cfg.pilot_set`, never the
    scored prompts); the pilot decodes at most max_new_tokens (the eval's own budget) per prompt."""
    cost, source = cost_curve(target, prompts[0], cfg)
    methods = candidates(speculator, cfg, tree_for(cost, cfg, speculator))
    tokens = min(cfg.pilot_tokens, max_new_tokens or cfg.pilot_tokens)
    tried = pilot(target, speculator, prompts[: cfg.pilot_prompts], methods, tokens)
    return {"verify_cost_ms": {str(n): ms for n, ms in cost.items()}, "verify_cost_source": source,
            "pilot": {"prompts": min(cfg.pilot_prompts, len(prompts)), "max_new_tokens": tokens, "tie": cfg.tie,
                      "set": cfg.pilot_set},
            "tuned_on": cfg.tuned_on,
            "candidates": tried,
            "fastest": method_of(max(_timed(tried), key=_speed)),
            "chosen": method_of(pick(tried, cfg.tie))}


def pick(tried: list[dict], tie: float) -> dict:
    """Of the piloted candidates within `tie` of the fastest (each by its faster round), the
    one accepting the most tokens a step (the faster of equals); module docstring, step 4."""
    timed = _timed(tried)
    floor = (1 - tie) * max(map(_speed, timed))
    return max((m for m in timed if _speed(m) >= floor), key=lambda m: (m["acceptance_length"] or 0, _speed(m)))


def _speed(candidate: dict) -> float:
    """A piloted candidate's tokens/s in its faster round (both rounds where none is recorded)."""
    return max(candidate.get("tok_s_rounds") or [candidate["tok_s"]])


def _timed(tried: list[dict]) -> list[dict]:
    return [m for m in tried if m["tok_s"] is not None]


def method_of(candidate: dict) -> dict:
    """The method a piloted candidate names (its pilot figures left out)."""
    return {key: candidate[key] for key in METHOD_KEYS if key in candidate}


def tree_of(chosen: dict) -> TreeConfig | None:
    """The TreeConfig of a chosen tree method (None for a chain)."""
    if chosen["kind"] != "tree":
        return None
    return TreeConfig(chosen["shape"], chosen["depth"], chosen["top_k"], chosen["budget"])
