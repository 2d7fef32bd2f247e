"""Tree drafting: several candidates per position, verified in one target pass (SpecInfer,
Medusa, EAGLE-2).

Each step drafts a tree rooted at the pending token with `Speculator.extend` (one call per
depth, all the paths of that depth batched), then the target reads every node at once: node i
sits at position past + depth(i) and attends to the cached prefix and to its own ancestors
(a 4-D tree mask), so its logits are exactly those of the chain ending at it.

Shapes of tree:
- static: a fixed set of nodes named by their ranks among their siblings, e.g. (0, 1) = the
  second most likely child of the most likely first token; of all rank paths up to `depth`
  with ranks < top_k, the `budget` with the smallest rank sum (then the shallowest) are kept.
- dynamic (EAGLE-2): at each depth the top_k children of each of the top_k most confident
  frontier nodes are drafted, confidence being the product of the draft's probabilities
  along the path; of all drafted nodes the `budget` most confident are verified.
- union: the trie of the candidate chains the speculator offers (`propose_chains`, each at
  most `depth` long): the hybrid's suffix chain and its learned chain verified in one pass,
  a shared prefix once; chains are added in the order offered while the budget lasts.
  Drafting costs what the chains cost, no per-depth expansion.
All are ancestor-closed: a node's parent always comes before it.

Acceptance walks down from the root. Greedy: move to the child whose token is the target's
argmax, else stop and commit that argmax: the committed tokens equal plain greedy decoding's.
Sampling: the children are deterministic candidates (one-hot draft distributions), tried in
order with the rejection rule: accept child c with probability p(c) / sum(p), else zero p(c)
(the residual max(0, p - onehot(c)), normalised) and try the next; if all are rejected, sample
the residual. The committed token is then distributed exactly as p (SpecInfer's multi-step
speculative sampling with point-mass drafts).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch

from speclab.kernels.verify import greedy_tokens, sample_inverse_cdf
from speclab.speculator.base import Speculator
from speclab.speculator.target import FrozenTarget

from .engine import Generation, _check_prompt, _lap, _stop_ids, finish, prefill_speculative, speculator_features
from .metrics import AcceptanceStats
from .sampling import SamplingConfig, TokenChooser


@dataclass
class TreeConfig:
    """The draft tree drafted and verified at every step."""

    shape: Literal["static", "dynamic", "union"] = "dynamic"
    """static: a fixed set of sibling-rank paths; dynamic: EAGLE-2's confidence-driven
    expansion; union: the trie of the speculator's candidate chains."""
    depth: int = 4
    """Longest path below the pending token (capped at the speculator's max_draft_len)."""
    top_k: int = 4
    """Children drafted per expanded node (dynamic: also the frontier nodes expanded per depth)."""
    budget: int = 8
    """Draft tokens verified per step (the target reads budget + 1 with the pending token)."""

    def __post_init__(self) -> None:
        if self.shape not in ("static", "dynamic", "union"):
            raise ValueError(f"tree shape must be static, dynamic or union, got {self.shape!r}")
        if self.depth < 1 or self.top_k < 1 or self.budget < 1:
            raise ValueError(f"tree depth, top_k and budget must be >= 1; got {self.depth}, {self.top_k}, {self.budget}")


@dataclass
class DraftTree:
    """Node 0 is the pending token; nodes 1..M are drafts, each after its parent."""

    tokens: list[int]  # [M+1] target ids
    parents: list[int]  # [M+1], -1 for the root
    depths: list[int]  # [M+1], 0 for the root

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    def ancestors_mask(self) -> torch.Tensor:
        """[M+1, M+1] bool: node i may see node j (j is i or one of its ancestors)."""
        n = len(self.tokens)
        allowed = torch.zeros(n, n, dtype=torch.bool)
        for i, parent in enumerate(self.parents):  # parents come first, so their rows are done
            if parent >= 0:
                allowed[i] = allowed[parent]
            allowed[i, i] = True
        return allowed

    def children(self) -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                kids.setdefault(parent, []).append(i)
        return kids


def static_rank_paths(cfg: TreeConfig) -> list[tuple[int, ...]]:
    """The static shape: `budget` rank paths by (rank sum, depth, ranks), ancestor-closed."""

    def below(prefix: tuple[int, ...], room: int):  # paths extending prefix with rank sum < budget
        for rank in range(min(cfg.top_k, room)):
            path = prefix + (rank,)
            yield path
            if len(path) < cfg.depth:
                yield from below(path, room - rank)

    return sorted(below((), cfg.budget), key=lambda p: (sum(p), len(p), p))[: cfg.budget]


def union_tree(pending: int, chains: list[list[int]], budget: int) -> DraftTree:
    """The trie of `chains` below `pending`, at most `budget` nodes: chains in the order
    given, each node added while the budget lasts (a prefix already in the trie costs nothing)."""
    tree = DraftTree(tokens=[pending], parents=[-1], depths=[0])
    node_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for chain in chains:
        parent = 0
        for token in chain:
            node = node_of.get((parent, token))
            if node is None:
                if tree.size >= budget:
                    break
                node = node_of[(parent, token)] = len(tree.tokens)
                tree.tokens.append(token)
                tree.parents.append(parent)
                tree.depths.append(tree.depths[parent] + 1)
            parent = node
    return tree


@torch.no_grad()
def draft_tree(speculator: Speculator, state, pending: torch.Tensor, cfg: TreeConfig) -> DraftTree:
    """Draft one tree of at most cfg.budget nodes below pending [1, 1] (module docstring)."""
    if cfg.shape == "union":
        chains = [chain[0, : cfg.depth].tolist() for chain in speculator.propose_chains(state, pending, cfg.depth)]
        return union_tree(int(pending), chains, cfg.budget)
    keep = set(static_rank_paths(cfg)) if cfg.shape == "static" else None
    # Every drafted node: (score, depth, parent id, token, rank path); id = index in this list.
    nodes: list[tuple[float, int, int, int, tuple[int, ...]]] = [(0.0, 0, -1, int(pending), ())]
    paths: dict[int, list[int]] = {0: []}
    frontier = [0]
    for depth in range(cfg.depth):
        rows = torch.tensor([paths[i] for i in frontier], dtype=torch.long, device=pending.device).view(len(frontier), depth)
        logp = torch.log_softmax(speculator.extend(state, pending, rows).float(), dim=-1)  # [M, N]
        top = logp.topk(min(cfg.top_k, logp.shape[-1]), dim=-1)
        ids = speculator.vocab.to_target(top.indices)  # [M, K] target ids
        scores, tokens = top.values.tolist(), ids.tolist()  # one transfer per depth
        created = []
        for row, parent in enumerate(frontier):
            for rank, (logq, token) in enumerate(zip(scores[row], tokens[row])):
                ranks = nodes[parent][4] + (rank,)
                if keep is not None and ranks not in keep:
                    continue
                nodes.append((nodes[parent][0] + logq, depth + 1, parent, token, ranks))
                paths[len(nodes) - 1] = paths[parent] + [token]
                created.append(len(nodes) - 1)
        if keep is not None:
            frontier = [i for i in created if any(p[: depth + 1] == nodes[i][4] for p in keep if len(p) > depth + 1)]
        else:
            frontier = sorted(created, key=lambda i: -nodes[i][0])[: cfg.top_k]
        if not frontier:
            break
    # Most confident first, shallower first on ties: a parent (score >= its child's) always
    # precedes its children, so any prefix of this order is a tree.
    chosen = sorted(range(1, len(nodes)), key=lambda i: (-nodes[i][0], nodes[i][1]))[: cfg.budget]
    order = [0] + sorted(chosen, key=lambda i: (nodes[i][1], i))  # by depth: parents before children
    new_id = {old: new for new, old in enumerate(order)}
    return DraftTree(tokens=[nodes[i][3] for i in order],
                     parents=[-1] + [new_id[nodes[i][2]] for i in order[1:]],
                     depths=[nodes[i][1] for i in order])


def walk_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """logits [M+1, V] -> (accepted path of node ids from the root, next token)."""
    choice = greedy_tokens(logits).tolist()  # [M+1], one transfer
    kids, node, path = tree.children(), 0, [0]
    while True:
        match = [c for c in kids.get(node, []) if tree.tokens[c] == choice[node]]
        if not match:
            return path, choice[node]
        node = match[0]
        path.append(node)


def walk_sample(tree: DraftTree, logits: torch.Tensor, chooser: TokenChooser) -> tuple[list[int], int]:
    """Sequential rejection over each node's children (module docstring); logits [M+1, V] raw.

    Each step takes M + 2 uniforms from the run's stream (enough for every node's children to
    be tried once, plus the final draw), so the stream advances the same whatever is accepted.
    """
    kids, node, path = tree.children(), 0, [0]
    probs = torch.softmax(chooser.warp(logits), dim=-1).cpu()  # [M+1, V], one transfer
    uniforms = iter(chooser.randoms(tree.size + 2)[0].tolist())
    while True:
        children = kids.get(node, [])
        tokens = [tree.tokens[c] for c in children]
        p_children = probs[node, tokens].tolist() if tokens else []
        mass = 1.0  # of the residual: p less the rejected children's probability
        for child, p_child in zip(children, p_children):
            if next(uniforms) * mass < p_child:  # u < p(c) / sum(residual)
                break
            mass -= p_child  # rejected: the residual max(0, p - onehot(c))
        else:
            residual = probs[node].clone()
            residual[tokens] = 0.0
            return path, int(sample_inverse_cdf(residual[None], torch.tensor([next(uniforms)]))[0])
        node = child
        path.append(node)


@torch.no_grad()
def generate_tree(
    target: FrozenTarget,
    speculator: Speculator,
    prompt_ids: torch.Tensor,  # [1, T]
    max_new_tokens: int,
    tree: TreeConfig,
    eos_ids: Iterable[int] | None = None,
    stats: AcceptanceStats | None = None,
    sampling: SamplingConfig | None = None,
) -> Generation:
    """Tree speculative decoding; greedy output equals `generate_plain`'s token for token.

    `stats`, when given, must be built for k = the capped depth; each step records the
    accepted path length and the tree's node count as the drafted tokens.
    """
    limit = speculator.max_draft_len()
    cfg = tree if limit is None or tree.depth <= limit else TreeConfig(tree.shape, limit, tree.top_k, tree.budget)
    prompt_ids = _check_prompt(target, prompt_ids, max_new_tokens, headroom=cfg.budget + 1)
    if stats is not None and stats.k != cfg.depth:
        raise ValueError(f"stats were built for k={stats.k} but this tree is {cfg.depth} deep")
    stop = _stop_ids(target, eos_ids)
    chooser = TokenChooser(sampling)
    gen = Generation([], 0.0, 1, 0)
    start = time.perf_counter()
    cache, layer_ids, state, pending = prefill_speculative(target, speculator, prompt_ids, chooser, gen,
                                                           max_len=prompt_ids.shape[1] + max_new_tokens + cfg.budget + 1)
    tokens = [pending.item()]
    while tokens[-1] not in stop and len(tokens) < max_new_tokens:
        clock = time.perf_counter()
        drafted = draft_tree(speculator, state, pending, cfg)
        gen.draft_seconds += _lap(target, clock)
        clock = time.perf_counter()
        past = cache.get_seq_length()
        ids = torch.tensor([drafted.tokens], device=target.device)  # [1, M+1]
        positions = past + torch.tensor([drafted.depths], device=target.device)  # [1, M+1]
        out = target(ids, cache, layer_ids, logits_for="all",
                     attention_mask=target.tree_mask(drafted.ancestors_mask(), past), position_ids=positions)
        gen.steps += 1
        walk = walk_greedy if chooser.mode == "greedy" else (lambda t, l: walk_sample(t, l, chooser))
        path, next_id = walk(drafted, out.logits[0])
        gen.verify_seconds += time.perf_counter() - clock
        n = len(path) - 1
        gen.accepted.append(n)
        gen.drafted_tokens += drafted.size
        if stats is not None:
            stats.update(n, drafted=drafted.size)
        committed = [drafted.tokens[i] for i in path[1:]] + [next_id]
        tokens.extend(committed)
        if len(tokens) >= max_new_tokens or not stop.isdisjoint(committed):
            break
        index = torch.tensor(path, device=target.device)
        FrozenTarget.keep(cache, past, index)  # the cache keeps pending and the accepted path
        clock = time.perf_counter()
        hidden, layers = speculator_features(speculator, out, layer_ids)
        speculator.accept(state, ids[:, index], hidden[:, index], None if layers is None else layers[:, index])
        gen.draft_seconds += _lap(target, clock)
        pending = torch.tensor([[next_id]], device=target.device)
    return finish(gen, tokens, stop, max_new_tokens, start)
