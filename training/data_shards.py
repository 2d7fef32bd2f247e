"""A self-distillation round answered in shards (training/shards.py).

Answering is the expensive part of a round, so that is what is split: the round's prompts
are chosen once (`prompts.json`: sampled by the first process to take its lock, read by the
others), then shard k answers batches k, k+n, ... of the prompts in the order
`generate_batched` batches them, and the round is assembled in prompt order: the same
examples and hidden states, bit for bit, as one process answering every prompt.

A round's entry is `<data cache>/<fingerprint>.shards/round-<r>/`; it is dropped once the
round is merged into the data bundle (training/data.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from speclab.kernels.util.cache_lock import build_lock, write_atomic
from speclab.speculator.target import FrozenTarget

from .data_config import DataConfig
from .data_tokenize import Encoded, encode_prompt_reply
from .self_distill import Generated, answer, generation_batch_size, length_order, response_contexts
from .shards import ShardPlan, batches_of, build_shards

ANSWERS, HIDDEN = "answers.json", "hidden.npy"


class RoundShards:
    """One round's shared entry: its chosen prompts and its answers in shards."""

    def __init__(self, entry: Path, plan: ShardPlan, merged: Callable[[], bool]):
        self.entry, self.plan, self.merged = entry, plan, merged

    def prompts(self, choose: Callable[[], dict]) -> dict:
        """The round's prompts: `choose()`'s JSON-able answer, computed by one process only."""
        path = self.entry / "prompts.json"
        with build_lock(path):
            if not path.is_file():
                write_atomic(path, json.dumps(choose()).encode())
        return json.loads(path.read_text())

    def distill(self, target: FrozenTarget, cfg: DataConfig, prompts: list[str],
                progress: bool) -> tuple[list[Encoded], Generated]:
        """As self_distill.distill_responses, each shard answered (or waited for) in turn."""
        contexts = response_contexts(target, cfg, prompts)
        order, size = length_order(contexts), generation_batch_size(target, cfg)

        def build(k: int, folder: Path) -> None:
            index = batches_of(order, size, k, self.plan.count)
            out = answer(target, cfg, [contexts[i] for i in index], progress)
            (folder / ANSWERS).write_text(json.dumps({
                "index": index, "replies": out.replies, "finished": out.finished,
                "new_tokens": out.new_tokens, "seconds": out.seconds,
                "lengths": None if out.hidden is None else [len(h) for h in out.hidden]}))
            if out.hidden is not None:
                rows = [h.numpy() for h in out.hidden]
                np.save(folder / HIDDEN, np.concatenate(rows) if rows else np.zeros((0, target.hidden_size), np.float32))

        out = merge(build_shards(self.entry, self.plan, build, self.merged), len(contexts))
        return [encode_prompt_reply(c, r) for c, r in zip(contexts, out.replies)], out


def merge(folders: list[Path], count: int) -> Generated:
    """The shards' answers in prompt order. Seconds are summed over shards (the processes'
    generation time, as the rates of a one-process build count it)."""
    replies: list[list[int]] = [[] for _ in range(count)]
    finished = [False] * count
    hidden: list[torch.Tensor | None] = [None] * count
    new_tokens, seconds, whole = 0, 0.0, True
    for folder in folders:
        part = json.loads((folder / ANSWERS).read_text())
        new_tokens, seconds = new_tokens + part["new_tokens"], seconds + part["seconds"]
        for i, reply, done in zip(part["index"], part["replies"], part["finished"]):
            replies[i], finished[i] = reply, done
        if part["lengths"] is None:
            whole = False
            continue
        rows, at = np.load(folder / HIDDEN), 0
        for i, n in zip(part["index"], part["lengths"]):
            hidden[i] = torch.from_numpy(rows[at:at + n])
            at += n
    return Generated(replies, finished, new_tokens, seconds, hidden if whole else None)
