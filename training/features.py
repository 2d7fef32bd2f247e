"""Target features for training: computed once into a memory-mapped cache, or online.

The offline cache stores, per example, the target's last hidden state at every token
(the LM head's input). The target's logits are recomputed from it by the frozen LM
head only at the rows a loss needs, which is cheap next to storing [T, V] logits
(49,152 floats per token for SmolLM2 vs 576). The cache is keyed by the data's
fingerprint, the target and the dtype, so every run of a sweep shares one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from speclab.speculator.base import Features
from speclab.speculator.target import FrozenTarget

COMPLETE_MARKER = "COMPLETE"
_NP_DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.float32}
# numpy has no bfloat16: bf16 features are stored as the upper halves of fp32 words.


@dataclass
class FeatureStore:
    path: Path
    offsets: np.ndarray  # [E + 1] token offsets of each example in the flat arrays
    input_ids: np.ndarray  # [N] int32
    loss_mask: np.ndarray  # [N] uint8, 1 on assistant tokens
    hidden: np.ndarray  # [N, H] memory-mapped
    dtype: str

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def bytes_per_token(self) -> float:
        total = sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())
        return total / max(int(self.offsets[-1]), 1)

    def example(self, i: int) -> dict[str, torch.Tensor]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        hidden = torch.from_numpy(np.array(self.hidden[lo:hi]))  # copy out of the read-only map
        if self.dtype == "bf16":
            hidden = _unpack_bf16(hidden)
        return {
            "input_ids": torch.from_numpy(self.input_ids[lo:hi].astype(np.int64)),
            "loss_mask": torch.from_numpy(self.loss_mask[lo:hi].astype(bool)),
            "hidden": hidden.float(),
        }


def _pack_bf16(x: torch.Tensor) -> np.ndarray:  # [T, H] -> [T, H/2] float32 words
    return x.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.float32)


def _unpack_bf16(words: torch.Tensor) -> torch.Tensor:
    return words.contiguous().view(torch.int16).view(torch.bfloat16)


def feature_fingerprint(data_fingerprint: str, target: FrozenTarget, dtype: str) -> str:
    key = json.dumps([data_fingerprint, target.name, target.hidden_size, str(target.dtype), dtype, 1])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def build_feature_store(target: FrozenTarget, examples, data_fingerprint: str, cache_dir: Path,
                        dtype: str = "fp32", batch_size: int = 8, progress: bool = True) -> FeatureStore:
    """Run the target teacher-forced over every example once; reuse the cache after."""
    if dtype not in _NP_DTYPES:
        raise ValueError(f"unknown feature_dtype {dtype!r}; valid: {sorted(_NP_DTYPES)}")
    out = cache_dir / feature_fingerprint(data_fingerprint, target, dtype)
    if (out / COMPLETE_MARKER).is_file():
        try:
            return open_feature_store(out)
        except Exception:  # a damaged cache is rebuilt, never trusted
            shutil.rmtree(out, ignore_errors=True)
    _write_feature_store(target, examples, out, dtype, batch_size, progress)
    return open_feature_store(out)


def _write_feature_store(target, examples, out: Path, dtype: str, batch_size: int, progress: bool) -> None:
    ids = [list(e["input_ids"]) for e in examples]
    masks = [list(e["loss_mask"]) for e in examples]
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    width = target.hidden_size // 2 if dtype == "bf16" else target.hidden_size
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "offsets.npy", offsets)
    np.save(tmp / "input_ids.npy", np.concatenate([np.asarray(x, dtype=np.int32) for x in ids]))
    np.save(tmp / "loss_mask.npy", np.concatenate([np.asarray(m, dtype=np.uint8) for m in masks]))
    hidden = np.lib.format.open_memmap(tmp / "hidden.npy", mode="w+", dtype=_NP_DTYPES[dtype],
                                       shape=(int(offsets[-1]), width))
    # Longest first, batched by similar length: little padding, and an early OOM if any.
    order = np.argsort(-lengths, kind="stable")
    bar = tqdm(total=int(offsets[-1]), desc="target features", unit="tok", disable=not progress)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        T = int(lengths[chunk].max())
        batch = torch.full((len(chunk), T), 0, dtype=torch.long)
        for row, i in enumerate(chunk):
            batch[row, : lengths[i]] = torch.tensor(ids[i])
        # Right padding needs no attention mask: causal attention never lets a real
        # token see the pads that follow it.
        h = target(batch.to(target.device), logits_for="none").hidden.float().cpu()  # [b, T, H]
        for row, i in enumerate(chunk):
            rows = h[row, : lengths[i]]
            hidden[offsets[i] : offsets[i + 1]] = _pack_bf16(rows) if dtype == "bf16" else rows.numpy()
        bar.update(int(lengths[chunk].sum()))
    bar.close()
    hidden.flush()
    del hidden
    (tmp / COMPLETE_MARKER).write_text(json.dumps({"dtype": dtype, "tokens": int(offsets[-1])}))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def open_feature_store(path: Path) -> FeatureStore:
    meta = json.loads((path / COMPLETE_MARKER).read_text())
    store = FeatureStore(
        path=path,
        offsets=np.load(path / "offsets.npy"),
        input_ids=np.load(path / "input_ids.npy"),
        loss_mask=np.load(path / "loss_mask.npy"),
        hidden=np.load(path / "hidden.npy", mmap_mode="r"),
        dtype=meta["dtype"],
    )
    if store.hidden.shape[0] != int(store.offsets[-1]) or len(store.input_ids) != int(store.offsets[-1]):
        raise ValueError(f"feature cache {path} is inconsistent")
    return store


def assistant_token_counts(examples, vocab_size: int) -> torch.Tensor:  # [V] int64
    """How often each token is an assistant token in the training data (for draft vocabularies)."""
    if isinstance(examples, FeatureStore):
        ids, mask = examples.input_ids, examples.loss_mask.astype(bool)
    else:
        ids = np.concatenate([np.asarray(e["input_ids"], dtype=np.int64) for e in examples])
        mask = np.concatenate([np.asarray(e["loss_mask"], dtype=bool) for e in examples])
    return torch.from_numpy(np.bincount(ids[mask], minlength=vocab_size).astype(np.int64))


class FeatureDataset(torch.utils.data.Dataset):
    """Examples of a FeatureStore (offline), or token-only examples (online)."""

    def __init__(self, store: FeatureStore | None = None, examples=None):
        self.store, self.examples = store, examples

    def __len__(self) -> int:
        return len(self.store) if self.store is not None else len(self.examples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.store is not None:
            return self.store.example(i)
        e = self.examples[i]
        return {"input_ids": torch.tensor(e["input_ids"]), "loss_mask": torch.tensor(e["loss_mask"], dtype=torch.bool)}


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad a list of examples; loss masks are zero on pads."""
    T = max(len(x["input_ids"]) for x in items)
    out = {"input_ids": torch.zeros(len(items), T, dtype=torch.long),
           "loss_mask": torch.zeros(len(items), T, dtype=torch.bool)}
    if "hidden" in items[0]:
        out["hidden"] = torch.zeros(len(items), T, items[0]["hidden"].shape[-1])
    for row, x in enumerate(items):
        n = len(x["input_ids"])
        for key in out:
            out[key][row, :n] = x[key]
    return out


def to_features(batch: dict[str, torch.Tensor], target: FrozenTarget | None = None) -> Features:
    """A collated batch -> Features; computes the target's hidden states when online."""
    ids = batch["input_ids"]
    hidden = batch.get("hidden")
    if hidden is None:
        hidden = target(ids.to(target.device), logits_for="none").hidden.float()
    # Features.loss_mask[t] asks "is token t+1 worth predicting": shift the token mask left.
    next_is_assistant = torch.zeros_like(batch["loss_mask"])
    next_is_assistant[:, :-1] = batch["loss_mask"][:, 1:]
    return Features(input_ids=ids, hidden=hidden, loss_mask=next_is_assistant)
