"""Target features for training: computed once into a memory-mapped cache, or online.

The offline cache stores, per example, the target's last hidden state at every token
(the LM head's input). The target's logits are recomputed from it by the frozen LM
head only at the rows a loss needs, which is cheap next to storing [T, V] logits
(49,152 floats per token for SmolLM2 vs 576). The cache is keyed by the data's
fingerprint, the target and the dtype, so every run of a sweep shares one.

Self-distilled data generated on the lean runtime already holds these rows (the data
bundle's hidden.npy, kept while the answers were generated): given them (`generated`),
the store is filled by a copy, or a hard link of that file for fp32, instead of a second
pass of the target over the data. The rows are what the pass computes: the runtime's
kernels give a token the same hidden state whether it came in a prompt's prefill or a
decoding step (tests/training/test_features.py checks it against a pass).

Families that read intermediate target layers (eagle3) get them from the same store: one
memmap per layer id, `layer_<id>.npy`, computed on demand in a separate pass over the data
when a run asks for an id the store lacks, so runs needing different layer sets share the
base store and never overwrite each other's layers. Each layer adds H values per token.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from speclab.kernels.util.cache_lock import build_lock, ensure_free_space, publish_dir, reserve, work_dir_for
from speclab.speculator.base import Features
from speclab.speculator.target import FrozenTarget

from .shards import ShardPlan, batches_of, build_shards, drop_shards

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
    layers: dict[int, np.ndarray] = field(default_factory=dict)  # id -> [N, H] memory-mapped
    # {"tokens", "seconds"} the target ran for in this call, and "copied" rows taken from the
    # data's generation (None: all reused)
    built_now: dict | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def bytes_per_token(self) -> float:
        """Bytes read per training token: the base arrays plus the layers this store opened
        (per row, so a store cut to a budget's prefix reports the same)."""
        rows = [self.input_ids, self.loss_mask, self.hidden, *self.layers.values()]
        return float(sum(a.itemsize * int(np.prod(a.shape[1:])) for a in rows))

    def head(self, n: int) -> "FeatureStore":
        """The first n examples (views, nothing copied): a smaller budget's share of a store
        that a bigger budget extended."""
        end = int(self.offsets[n])
        return FeatureStore(self.path, self.offsets[: n + 1], self.input_ids[:end], self.loss_mask[:end],
                            self.hidden[:end], self.dtype, {i: a[:end] for i, a in self.layers.items()}, self.built_now)

    def example(self, i: int, layer_ids: Sequence[int] = ()) -> dict[str, torch.Tensor]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        item = {
            "input_ids": torch.from_numpy(self.input_ids[lo:hi].astype(np.int64)),
            "loss_mask": torch.from_numpy(self.loss_mask[lo:hi].astype(bool)),
            "hidden": self._rows(self.hidden, lo, hi),
        }
        if layer_ids:
            item["layers"] = torch.stack([self._rows(self.layers[j], lo, hi) for j in layer_ids], 1)  # [T, L, H]
        return item

    def _rows(self, array: np.ndarray, lo: int, hi: int) -> torch.Tensor:
        rows = torch.from_numpy(np.array(array[lo:hi]))  # copy out of the read-only map
        return (_unpack_bf16(rows) if self.dtype == "bf16" else rows).float()


def _pack_bf16(x: torch.Tensor) -> np.ndarray:  # [T, H] -> [T, H/2] float32 words
    return x.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.float32)


def _unpack_bf16(words: torch.Tensor) -> torch.Tensor:
    return words.contiguous().view(torch.int16).view(torch.bfloat16)


def feature_fingerprint(data_fingerprint: str, target: FrozenTarget, dtype: str) -> str:
    key = json.dumps([data_fingerprint, target.name, target.hidden_size, str(target.dtype), dtype, 1])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def build_feature_store(target: FrozenTarget, examples, data_fingerprint: str, cache_dir: Path,
                        dtype: str = "fp32", batch_size: int = 8, progress: bool = True,
                        layer_ids: Sequence[int] = (), generated: np.ndarray | None = None,
                        shards: ShardPlan = ShardPlan()) -> FeatureStore:
    """Run the target teacher-forced over every example once; reuse the cache after.
    `layer_ids` (HF hidden_states ids) are added to the store by an extra pass when missing.
    `generated`: the examples' hidden states, [tokens, H] fp32 (DataBundle.hidden); copied in
    place of the pass when it has exactly one row per token of `examples`.
    `shards`: a new store's pass split across processes (training/shards.py); an extension
    and the layer passes run in one process."""
    if dtype not in _NP_DTYPES:
        raise ValueError(f"unknown feature_dtype {dtype!r}; valid: {sorted(_NP_DTYPES)}")
    out = cache_dir / feature_fingerprint(data_fingerprint, target, dtype)
    passes = []  # (tokens, seconds, rows copied from `generated`) of each build step this call made
    store = _complete_store(out)
    parts = None
    if store is None and shards.count > 1:
        parts = _pass_in_shards(target, examples, out, dtype, batch_size, progress, shards, generated)
    if store is None:
        with build_lock(out):  # a second writer waits here, then reuses the first one's store
            store = _complete_store(out)
            if store is None:
                shutil.rmtree(out, ignore_errors=True)  # absent or damaged: rebuilt, never trusted
                passes.append(_write_feature_store(target, examples, out, dtype, batch_size, progress, generated,
                                                   parts))
                store = open_feature_store(out)
        if parts is not None:
            drop_shards(parts.entry)
    if not _holds(store, examples):  # a bigger data budget: append the new examples' rows
        with build_lock(out):
            store = open_feature_store(out)
            if not _holds(store, examples):
                passes.append(_extend_feature_store(target, store, examples, batch_size, progress, generated))
                store = open_feature_store(out)
    if any(not _layer_ok(store, i) for i in layer_ids):
        with build_lock(out):
            missing = sorted({i for i in layer_ids if not _layer_ok(store, i)})  # another run may have added them
            if missing:
                passes.append((*_write_layers(target, store, missing, batch_size, progress), 0))
    store = open_feature_store(out, layer_ids)
    if passes:
        store.built_now = {"tokens": sum(p[0] for p in passes), "seconds": round(sum(p[1] for p in passes), 3)}
        if any(p[2] for p in passes):
            store.built_now["copied"] = sum(p[2] for p in passes)
    return store.head(len(examples)) if len(examples) < len(store) else store


def _holds(store: FeatureStore, examples) -> bool:
    """The store has at least as many examples as `examples`. The data under one fingerprint
    only ever grows by appending (training/data_rounds.py), so its examples are a prefix of the
    store or the store is a prefix of them; the first example's tokens confirm it."""
    if len(examples) and list(examples[0]["input_ids"]) != store.input_ids[: store.offsets[1]].tolist():
        raise ValueError(f"feature cache {store.path} does not hold this data's examples")
    return len(store) >= len(examples)


def _complete_store(out: Path) -> FeatureStore | None:
    if not (out / COMPLETE_MARKER).is_file():
        return None
    try:
        return open_feature_store(out)
    except Exception:  # damaged: the caller rebuilds it under the lock
        return None


def _layer_file(i: int) -> str:
    return f"layer_{i}.npy"


def _layer_ok(store: FeatureStore, i: int) -> bool:
    try:
        return np.load(store.path / _layer_file(i), mmap_mode="r").shape == store.hidden.shape
    except Exception:  # absent or damaged: recompute
        return False


def _target_passes(target: FrozenTarget, ids: list[list[int]], batch_size: int, progress: bool,
                   layer_ids: Sequence[int] = ()):
    """Teacher-forced target passes over every example: yields (example index, the batch's
    TargetOutput, its row, the example's length)."""
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    # Longest first, batched by similar length: little padding, and an early OOM if any.
    order = np.argsort(-lengths, kind="stable")
    bar = tqdm(total=int(lengths.sum()), desc="target features", unit="tok", disable=not progress)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        T = int(lengths[chunk].max())
        batch = torch.full((len(chunk), T), 0, dtype=torch.long)
        for row, i in enumerate(chunk):
            batch[row, : lengths[i]] = torch.tensor(ids[i])
        # Right padding needs no attention mask: causal attention never lets a real
        # token see the pads that follow it.
        out = target(batch.to(target.device), layer_ids=layer_ids, logits_for="none", invariant=False)
        for row, i in enumerate(chunk):
            yield i, out, row, int(lengths[i])
        bar.update(int(lengths[chunk].sum()))
    bar.close()


def _store_rows(array: np.ndarray, lo: int, rows: torch.Tensor, dtype: str) -> None:
    rows = rows.float().cpu()
    array[lo : lo + len(rows)] = _pack_bf16(rows) if dtype == "bf16" else rows.numpy()


def _new_memmap(path: Path, target: FrozenTarget, tokens: int, dtype: str) -> np.ndarray:
    width = target.hidden_size // 2 if dtype == "bf16" else target.hidden_size
    ensure_free_space(path, tokens * width * np.dtype(_NP_DTYPES[dtype]).itemsize)
    array = np.lib.format.open_memmap(path, mode="w+", dtype=_NP_DTYPES[dtype], shape=(tokens, width))
    reserve(path, os.path.getsize(path))  # the blocks exist before the first write: no SIGBUS
    return array


@dataclass
class PassShards:
    """A feature pass's shards: each holds `index.npy` (its examples, in the order their rows
    follow) and `hidden.npy` (those rows, stored as the store stores them)."""

    entry: Path
    folders: list[Path]
    tokens: int  # the target ran over in this process
    seconds: float


def _pass_in_shards(target: FrozenTarget, examples, out: Path, dtype: str, batch_size: int, progress: bool,
                    plan: ShardPlan, generated: np.ndarray | None) -> PassShards | None:
    """Every shard of a new store's pass built (training/shards.py): shard k runs batches
    k, k+n, ... of the pass's longest-first order, so each batch is the one a one-process
    pass runs and the rows are bitwise its rows. None where the rows are copied, not computed."""
    ids = [list(e["input_ids"]) for e in examples]
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    if _matching(generated, int(lengths.sum()), target) is not None:
        return None
    order = np.argsort(-lengths, kind="stable").tolist()  # as _target_passes orders them
    entry, ran = out.parent / f"{out.name}.shards", [0, 0.0]

    def build(k: int, folder: Path) -> None:
        t0 = time.perf_counter()
        index = batches_of(order, batch_size, k, plan.count)
        part = [ids[i] for i in index]
        starts = np.concatenate([[0], np.cumsum([len(x) for x in part])]).astype(np.int64)
        np.save(folder / "index.npy", np.asarray(index, dtype=np.int64))
        if not index:  # fewer batches than shards
            return
        hidden = _new_memmap(folder / "hidden.npy", target, int(starts[-1]), dtype)
        for j, batch_out, row, n in _target_passes(target, part, batch_size, progress):
            _store_rows(hidden, int(starts[j]), batch_out.hidden[row, :n], dtype)
        hidden.flush()
        ran[0], ran[1] = ran[0] + int(starts[-1]), ran[1] + time.perf_counter() - t0

    folders = build_shards(entry, plan, build, lambda: (out / COMPLETE_MARKER).is_file())
    return PassShards(entry, folders, ran[0], ran[1])


def _merge_pass(parts: PassShards, hidden: np.ndarray, offsets: np.ndarray) -> None:
    for folder in parts.folders:
        index, at = np.load(folder / "index.npy"), 0
        rows = np.load(folder / "hidden.npy", mmap_mode="r") if index.size else None
        for i in index.tolist():
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            hidden[lo:hi] = rows[at : at + hi - lo]
            at += hi - lo


def _write_feature_store(target, examples, out: Path, dtype: str, batch_size: int, progress: bool,
                         generated: np.ndarray | None, parts: PassShards | None = None) -> tuple[int, float, int]:
    """A new store of every example: (tokens the target ran over, seconds, rows copied).
    `parts`: the pass's rows, computed in shards (this process's share counted)."""
    ids = [list(e["input_ids"]) for e in examples]
    masks = [list(e["loss_mask"]) for e in examples]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64)
    generated = _matching(generated, int(offsets[-1]), target)
    tmp = work_dir_for(out)  # this writer's own folder: never shared with a concurrent build
    try:
        seconds = _fill_feature_store(target, ids, masks, offsets, tmp, dtype, batch_size, progress, generated, parts)
        publish_dir(tmp, out)
        tokens = int(offsets[-1])
        if parts is not None:
            return parts.tokens, parts.seconds + seconds, 0
        return (0, seconds, tokens) if generated is not None else (tokens, seconds, 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless the build failed


def _fill_feature_store(target, ids, masks, offsets, tmp: Path, dtype: str, batch_size: int, progress: bool,
                        generated: np.ndarray | None, parts: PassShards | None = None) -> float:
    t0 = time.perf_counter()
    np.save(tmp / "offsets.npy", offsets)
    np.save(tmp / "input_ids.npy", np.concatenate([np.asarray(x, dtype=np.int32) for x in ids]))
    np.save(tmp / "loss_mask.npy", np.concatenate([np.asarray(m, dtype=np.uint8) for m in masks]))
    if generated is not None:
        _copy_generated(generated, tmp / "hidden.npy", target, dtype)
    else:
        hidden = _new_memmap(tmp / "hidden.npy", target, int(offsets[-1]), dtype)
        if parts is not None:
            _merge_pass(parts, hidden, offsets)
        else:
            for i, batch_out, row, n in _target_passes(target, ids, batch_size, progress):
                _store_rows(hidden, int(offsets[i]), batch_out.hidden[row, :n], dtype)
        hidden.flush()
        del hidden
    seconds = time.perf_counter() - t0
    meta = {"dtype": dtype, "tokens": int(offsets[-1]), "seconds": seconds}
    if generated is not None:
        meta["from_generation"] = True
    (tmp / COMPLETE_MARKER).write_text(json.dumps(meta))
    return seconds


def _matching(generated: np.ndarray | None, tokens: int, target: FrozenTarget) -> np.ndarray | None:
    """`generated` if it holds one row per token of the examples being stored, else None (the
    pass computes them). Checked only where a store is written: a reused store costs nothing."""
    return generated if generated is not None and generated.shape == (tokens, target.hidden_size) else None


_COPY_ROWS = 1 << 14  # rows per chunk when copying generated hidden states (~38 MB at H=576)


def _copy_generated(generated: np.ndarray, path: Path, target: FrozenTarget, dtype: str,
                    into: np.ndarray | None = None, at: int = 0) -> None:
    """Generated rows into a store's array: `into` from row `at`, else a new file at `path`
    (a hard link of the generated file itself when it is exactly that file in fp32: no copy,
    no second copy on disk; both files are only ever replaced, never written in place)."""
    if into is None:
        source = getattr(generated, "filename", None)
        if dtype == "fp32" and source and np.load(source, mmap_mode="r").shape == generated.shape:
            try:
                os.link(source, path)
                return
            except OSError:  # another filesystem, or links refused: copy
                pass
        into = _new_memmap(path, target, len(generated), dtype)
    for lo in range(0, len(generated), _COPY_ROWS):
        _store_rows(into, at + lo, torch.from_numpy(np.array(generated[lo : lo + _COPY_ROWS])), dtype)
    into.flush()


def _extend_feature_store(target: FrozenTarget, store: FeatureStore, examples, batch_size: int,
                          progress: bool, generated: np.ndarray | None) -> tuple[int, float, int]:
    """A new store of every example: the old rows copied, the target run only over the new
    examples (for the hidden state and every layer file the old store has; the new rows of
    `generated` copied instead when the store has no layer files), then swapped in for the
    old one (renamed aside first: a reader never sees a mixture). Returns (tokens the target
    ran over, seconds, rows copied from `generated`)."""
    old_n, old_tokens = len(store), int(store.offsets[-1])
    new = [list(examples[i]["input_ids"]) for i in range(old_n, len(examples))]
    masks = [list(examples[i]["loss_mask"]) for i in range(old_n, len(examples))]
    lengths = np.cumsum([len(x) for x in new], dtype=np.int64)
    offsets = np.concatenate([store.offsets, old_tokens + lengths]).astype(np.int64)
    generated = _matching(generated, int(offsets[-1]), target)
    layer_ids = sorted(int(p.stem.split("_")[1]) for p in store.path.glob("layer_*.npy")
                       if _layer_ok(store, int(p.stem.split("_")[1])))
    meta = json.loads((store.path / COMPLETE_MARKER).read_text())
    tmp = work_dir_for(store.path)
    try:
        t0 = time.perf_counter()
        np.save(tmp / "offsets.npy", offsets)
        np.save(tmp / "input_ids.npy", np.concatenate([store.input_ids, *(np.asarray(x, np.int32) for x in new)]))
        np.save(tmp / "loss_mask.npy", np.concatenate([store.loss_mask, *(np.asarray(m, np.uint8) for m in masks)]))
        arrays = {"hidden": (_new_memmap(tmp / "hidden.npy", target, int(offsets[-1]), store.dtype), store.hidden)}
        for j in layer_ids:
            arrays[j] = (_new_memmap(tmp / _layer_file(j), target, int(offsets[-1]), store.dtype),
                         np.load(store.path / _layer_file(j), mmap_mode="r"))
        for array, old in arrays.values():
            array[:old_tokens] = old
        copy = generated is not None and not layer_ids
        if copy:
            _copy_generated(generated[old_tokens:], tmp / "hidden.npy", target, store.dtype, arrays["hidden"][0],
                            old_tokens)
        else:
            for i, out, row, n in _target_passes(target, new, batch_size, progress, layer_ids):
                lo = int(offsets[old_n + i])
                _store_rows(arrays["hidden"][0], lo, out.hidden[row, :n], store.dtype)
                for j in layer_ids:
                    _store_rows(arrays[j][0], lo, out.layers[j][row, :n], store.dtype)
        for array, _ in arrays.values():
            array.flush()
        del arrays
        seconds = time.perf_counter() - t0
        (tmp / COMPLETE_MARKER).write_text(json.dumps({**meta, "tokens": int(offsets[-1]),
                                                       "seconds": meta.get("seconds", 0.0) + seconds,
                                                       "from_generation": bool(meta.get("from_generation")) and copy}))
        aside = store.path.with_name(f".{store.path.name}.old-{os.getpid()}")
        os.replace(store.path, aside)
        publish_dir(tmp, store.path)
        shutil.rmtree(aside, ignore_errors=True)
        added = int(offsets[-1]) - old_tokens
        return (0, seconds, added) if copy else (added, seconds, 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless the build failed


def cache_report(store: FeatureStore) -> dict:
    """The whole feature cache behind `store`: tokens, bytes on disk, seconds the target spent
    building it (all extensions together, layer files not counted) and tokens per second; and
    `built_now`, what this process's call computed (a build, an extension's new rows or added
    layer files): absent when the cache was reused whole."""
    meta = json.loads((store.path / COMPLETE_MARKER).read_text())
    size = sum(p.stat().st_size for p in store.path.iterdir() if p.is_file())
    seconds = meta.get("seconds")
    report = {"tokens": meta["tokens"], "bytes": size, "seconds": None if seconds is None else round(seconds, 3),
              "tok_s": round(meta["tokens"] / seconds, 2) if seconds else None}
    if meta.get("from_generation"):
        report["from_generation"] = True  # copied from the data's generation, not a pass of the target
    if store.built_now is not None:
        report["built_now"] = store.built_now
    return report


def _write_layers(target: FrozenTarget, store: FeatureStore, layer_ids: list[int], batch_size: int,
                  progress: bool) -> tuple[int, float]:
    """One extra pass adding `layer_<id>.npy` per id. Each file appears atomically (written
    under a per-process name, then renamed), so concurrent runs at worst compute one twice.
    Returns (tokens the target ran over, seconds)."""
    if min(layer_ids) < 0 or max(layer_ids) > target.num_layers:
        raise ValueError(f"target layer ids {layer_ids} outside 0..{target.num_layers} (0 = embeddings)")
    t0 = time.perf_counter()
    ids = [store.input_ids[store.offsets[e] : store.offsets[e + 1]].tolist() for e in range(len(store))]
    tag = f".tmp{os.getpid()}"
    partial = [store.path / (_layer_file(j) + tag) for j in layer_ids]
    try:
        arrays = {}
        for j, path in zip(layer_ids, partial):  # one at a time: a full disk fails at its file
            arrays[j] = _new_memmap(path, target, len(store.input_ids), store.dtype)
        for i, batch_out, row, n in _target_passes(target, ids, batch_size, progress, layer_ids):
            for j, array in arrays.items():
                _store_rows(array, int(store.offsets[i]), batch_out.layers[j][row, :n], store.dtype)
        for j, path in zip(layer_ids, partial):
            arrays.pop(j).flush()
            os.replace(path, store.path / _layer_file(j))
    finally:
        # A failed pass (a full disk at the third layer, an interrupt) leaves no partial files:
        # each is the size of the whole store's hidden states (4 GB for a 1.8M-token cache).
        arrays = None
        for path in partial:
            path.unlink(missing_ok=True)
    return len(store.input_ids), time.perf_counter() - t0


def open_feature_store(path: Path, layer_ids: Sequence[int] = ()) -> FeatureStore:
    meta = json.loads((path / COMPLETE_MARKER).read_text())
    store = FeatureStore(
        path=path,
        offsets=np.load(path / "offsets.npy"),
        input_ids=np.load(path / "input_ids.npy"),
        loss_mask=np.load(path / "loss_mask.npy"),
        hidden=np.load(path / "hidden.npy", mmap_mode="r"),
        dtype=meta["dtype"],
        layers={i: np.load(path / _layer_file(i), mmap_mode="r") for i in layer_ids},
    )
    if store.hidden.shape[0] != int(store.offsets[-1]) or len(store.input_ids) != int(store.offsets[-1]):
        raise ValueError(f"feature cache {path} is inconsistent")
    if any(a.shape != store.hidden.shape for a in store.layers.values()):
        raise ValueError(f"feature cache {path}: a layer file does not match hidden.npy")
    return store


def assistant_token_counts(examples, vocab_size: int) -> torch.Tensor:  # [V] int64
    """How often each token is an assistant token in the training data (for draft vocabularies)."""
    if isinstance(examples, FeatureStore):
        ids, mask = examples.input_ids, examples.loss_mask.astype(bool)
    else:
        ids = np.concatenate([np.asarray(e["input_ids"], dtype=np.int64) for e in examples])
        mask = np.concatenate([np.asarray(e["loss_mask"], dtype=bool) for e in examples])
    return torch.from_numpy(np.bincount(ids[mask], minlength=vocab_size).astype(np.int64))


def answer_spans(input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[list[int]]:
    """The runs of consecutive loss tokens of one example: each assistant answer (a
    multi-turn example has several), never joined across the prompt between them."""
    spans, current = [], []
    for token, keep in zip(input_ids, loss_mask):
        if keep:
            current.append(int(token))
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def training_answers(dataset: "FeatureDataset") -> list[list[int]]:
    """Every answer of a training set, in data order (what `Speculator.use_training_data` takes)."""
    answers = []
    if dataset.store is not None:
        store = dataset.store
        for i in range(len(store)):
            lo, hi = int(store.offsets[i]), int(store.offsets[i + 1])
            answers += answer_spans(store.input_ids[lo:hi].tolist(), store.loss_mask[lo:hi].tolist())
    else:
        for e in dataset.examples:
            answers += answer_spans(list(e["input_ids"]), list(e["loss_mask"]))
    return answers


class FeatureDataset(torch.utils.data.Dataset):
    """Examples of a FeatureStore (offline), or token-only examples (online)."""

    def __init__(self, store: FeatureStore | None = None, examples=None, layer_ids: Sequence[int] = ()):
        self.store, self.examples, self.layer_ids = store, examples, tuple(layer_ids)

    def __len__(self) -> int:
        return len(self.store) if self.store is not None else len(self.examples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.store is not None:
            return self.store.example(i, self.layer_ids)
        e = self.examples[i]
        return {"input_ids": torch.tensor(e["input_ids"]), "loss_mask": torch.tensor(e["loss_mask"], dtype=torch.bool)}


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad a list of examples; loss masks are zero on pads."""
    T = max(len(x["input_ids"]) for x in items)
    out = {"input_ids": torch.zeros(len(items), T, dtype=torch.long),
           "loss_mask": torch.zeros(len(items), T, dtype=torch.bool)}
    for key in ("hidden", "layers"):  # [T, H] and [T, L, H] per example
        if key in items[0]:
            out[key] = torch.zeros(len(items), T, *items[0][key].shape[1:])
    for row, x in enumerate(items):
        n = len(x["input_ids"])
        for key in out:
            out[key][row, :n] = x[key]
    return out


def to_features(batch: dict[str, torch.Tensor], target: FrozenTarget | None = None,
                layer_ids: Sequence[int] = ()) -> Features:
    """A collated batch -> Features; computes the target's hidden states (and the layers
    `layer_ids`, HF hidden_states ids) when online."""
    ids = batch["input_ids"]
    hidden, layers = batch.get("hidden"), batch.get("layers")
    if hidden is None or (layer_ids and layers is None):
        if target is None:
            raise ValueError(f"the batch lacks target features (hidden, layers {tuple(layer_ids)}) "
                             "and no target was given to compute them")
        out = target(ids.to(target.device), layer_ids=layer_ids, logits_for="none", invariant=False)
        hidden = out.hidden.float()
        layers = torch.stack([out.layers[i] for i in layer_ids], 2).float() if layer_ids else None
    # Features.loss_mask[t] asks "is token t+1 worth predicting": shift the token mask left.
    next_is_assistant = torch.zeros_like(batch["loss_mask"])
    next_is_assistant[:, :-1] = batch["loss_mask"][:, 1:]
    return Features(input_ids=ids, hidden=hidden, loss_mask=next_is_assistant, layers=layers)
