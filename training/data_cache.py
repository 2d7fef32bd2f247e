"""The built data set on disk, keyed by a fingerprint of everything it depends on.

A bundle directory holds `train/` (a saved `datasets.Dataset`), `heldout.jsonl`,
`meta.json` (config, stats), `hidden.npy` for self-distilled data generated on the lean
runtime (the target's hidden states at every token, training/data.py) and, written last,
the `COMPLETE` marker: a manifest of every file's sha256. It is built in a temporary
sibling directory and renamed into place, so a reader never sees half a bundle; one whose
marker is missing or whose files do not match it is removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import datasets
import torch

from speclab.speculator.target import FrozenTarget

from .code_source import listing_fingerprint, roots_of
from .data_config import DataConfig, fields_that_matter
from .data_sources import source_files

log = logging.getLogger(__name__)

DATA_FORMAT_VERSION = 1  # bump when what a bundle holds, or how it is built, changes
COMPLETE_MARKER = "COMPLETE"
TRAIN_DIR, HELDOUT_FILE, META_FILE, HIDDEN_FILE = "train", "heldout.jsonl", "meta.json", "hidden.npy"


# --- fingerprint ---------------------------------------------------------------------------


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """Vocabulary, special tokens and chat template: all that tokenisation depends on."""
    return _sha({"vocab": sorted(tokenizer.get_vocab().items()),
                 "special": tokenizer.all_special_tokens,
                 "template": getattr(tokenizer, "chat_template", None)})


@torch.no_grad()
def model_fingerprint(target: FrozenTarget) -> str:
    """The target's identity for generated data: name, config, dtype and a probe of every
    weight tensor (the first values of each; cheap, yet tells two seeds apart)."""
    h = hashlib.sha256(f"{target.name}|{target.dtype}|{target.model.config.to_json_string()}".encode())
    for name, p in sorted(target.model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().flatten()[:256].float().cpu().numpy().tobytes())
    return h.hexdigest()


def _hash_file(h, path: Path):
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h


def _files_fingerprint(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode())
        _hash_file(h, path)
    return h.hexdigest()


def data_fingerprint(target: FrozenTarget, cfg: DataConfig, exclude: list[str] | tuple = ()) -> str:
    """What the built data depends on. Tokenising a file depends on the tokenizer only;
    self-distilled data on the exact model (and dtype) that generated it; mined Python source
    on the files' listing and on the texts it must not overlap (`exclude`)."""
    parts = {"format": DATA_FORMAT_VERSION, "config": fields_that_matter(cfg),
             "tokenizer": tokenizer_fingerprint(target.tokenizer)}
    if cfg.source in ("self_distill", "code_prompts"):
        parts["model"] = model_fingerprint(target)
    if cfg.source in ("code_prompts", "code_corpus"):
        parts["python_source"] = listing_fingerprint(roots_of(cfg.path))
    if cfg.source == "code_prompts":
        parts["exclude"] = _sha(sorted(exclude))
    elif cfg.source in ("jsonl", "text", "parquet"):  # a hub data set is named by id/subset/split, already in config
        parts["files"] = _files_fingerprint(source_files(cfg))
    return _sha(parts)[:16]


# --- write / read a bundle -----------------------------------------------------------------


def _manifest(bundle: Path) -> dict[str, str]:
    files = [p for p in sorted(bundle.rglob("*")) if p.is_file() and p.name != COMPLETE_MARKER]
    return {str(p.relative_to(bundle)): _hash_file(hashlib.sha256(), p).hexdigest() for p in files}


def write_bundle(work: Path, fingerprint: str, train: datasets.Dataset, heldout: list[dict], meta: dict) -> None:
    train.save_to_disk(str(work / TRAIN_DIR))
    (work / HELDOUT_FILE).write_text("".join(json.dumps(h) + "\n" for h in heldout))
    (work / META_FILE).write_text(json.dumps({"fingerprint": fingerprint, **meta}, indent=2, default=str))
    marker = {"fingerprint": fingerprint, "files": _manifest(work)}
    with open(work / COMPLETE_MARKER, "w") as f:  # last: its presence means the rest is whole
        json.dump(marker, f)
        f.flush()
        os.fsync(f.fileno())


def publish(work: Path, final: Path) -> None:
    """Rename the finished work dir into place. If another process published the same
    fingerprint meanwhile, its (identical) bundle wins and ours is dropped."""
    try:
        os.replace(work, final)
    except OSError:
        if read_bundle(final, final.name) is None:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(work, final)
        else:
            shutil.rmtree(work, ignore_errors=True)


def replace_bundle(work: Path, final: Path) -> None:
    """Put an extended bundle in place of the one it extends. The old one is renamed aside
    first, so a reader finds the old bundle, nothing (and waits or builds), or the new one,
    never a mixture."""
    aside = final.with_name(f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(final, aside)
    except FileNotFoundError:
        pass
    publish(work, final)
    shutil.rmtree(aside, ignore_errors=True)


def bundle_bytes(bundle: Path) -> int:
    return sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())


def read_bundle(bundle: Path, fingerprint: str) -> tuple[datasets.Dataset, list[dict], dict] | None:
    """(train, heldout, meta) if `bundle` is complete and intact, else None."""
    marker_file = bundle / COMPLETE_MARKER
    if not marker_file.is_file():
        return None
    try:
        marker = json.loads(marker_file.read_text())
        if marker["fingerprint"] != fingerprint or marker["files"] != _manifest(bundle):
            raise ValueError("files do not match the COMPLETE manifest")
        train = datasets.load_from_disk(str(bundle / TRAIN_DIR))
        heldout = [json.loads(line) for line in (bundle / HELDOUT_FILE).read_text().splitlines()]
        meta = json.loads((bundle / META_FILE).read_text())
    except Exception as exc:  # a damaged cache is rebuilt, never trusted
        log.warning("data cache %s is damaged (%s); rebuilding", bundle, exc)
        return None
    return train, heldout, meta
