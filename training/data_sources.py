"""Rows from local files (jsonl, parquet, plain text) or the hub, as `Record`s.

Each row becomes a chat (a "messages" column, or a prompt + response pair) or raw text
(plain-text files, or rows with only a text column). `Record.key` is the prompt text:
rows are deduplicated on it and split into train / held-out by its hash.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import datasets

from .data_config import DataConfig

# The file endings a directory given as data.path is searched for, per source.
FILE_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".json"),
    "parquet": (".parquet",),
    "text": (".txt", ".text", ".md"),
}
# The `datasets` builder that reads each file source.
_BUILDERS = {"jsonl": "json", "parquet": "parquet", "text": "text"}


@dataclass
class Record:
    key: str  # the (first) user prompt: the dedup and split key
    messages: list[dict] | None = None  # a chat; loss on its assistant turns
    text: str | None = None  # raw text; loss on every token

    def prompt_messages(self) -> list[dict]:
        """The turns before the first assistant reply: how this record is evaluated."""
        if self.messages is None:
            return [{"role": "user", "content": self.text}]
        head = []
        for m in self.messages:
            if m["role"] == "assistant":
                break
            head.append(m)
        return head


def normalise(text: str) -> str:
    """The dedup key of a prompt: case and whitespace do not make a new prompt."""
    return " ".join(text.split()).casefold()


def source_files(cfg: DataConfig) -> list[Path]:
    """The local files of a file source, in a stable order; a clear error if there are none."""
    path = Path(cfg.path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data.path {str(path)!r} does not exist (data.source={cfg.source})")
    if path.is_file():
        return [path]
    suffixes = FILE_SUFFIXES[cfg.source]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
    if not files:
        raise FileNotFoundError(f"data.path {str(path)!r} holds no {'/'.join(suffixes)} files "
                                f"(data.source={cfg.source})")
    return files


@contextlib.contextmanager
def datasets_progress(enabled: bool) -> Iterator[None]:
    """Silence `datasets`' own progress bars (a global switch) for the duration, if asked."""
    enabled_before = datasets.is_progress_bar_enabled()
    if not enabled:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and enabled_before:
            datasets.enable_progress_bars()


def load_rows(cfg: DataConfig, scratch_dir: Path) -> datasets.Dataset:
    """The raw rows of a file or hub source. Local files are parsed into `scratch_dir`
    (not the global `datasets` cache); hub data sets use the usual hub cache.
    A text file gives one row per paragraph (blank-line separated), or per file when chunked."""
    if cfg.source == "hub":
        return _load_hub(cfg)
    files = [str(p) for p in source_files(cfg)]
    if cfg.source == "jsonl":
        for path in files:
            check_json_lines(Path(path))  # `datasets`' own errors name neither the file nor the line
    unit = "document" if cfg.text_split == "chunk" else "paragraph"  # chunk: whole files, cut later
    extra = {"sample_by": unit} if cfg.source == "text" else {}
    try:
        return datasets.load_dataset(_BUILDERS[cfg.source], data_files=files, split="train",
                                     cache_dir=str(scratch_dir), **extra)
    except Exception as exc:
        raise ValueError(f"could not read {cfg.path} as data.source={cfg.source}: {exc}") from exc


def check_json_lines(path: Path) -> None:
    """Every non-blank line of a .jsonl file is a JSON object, and there is at least one;
    otherwise a ValueError naming the file and the line. (A .json file may be one document.)"""
    if path.suffix != ".jsonl":
        return
    rows = 0
    with open(path, encoding="utf-8", errors="replace") as f:  # bad bytes then fail as bad JSON, with a line
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object per line, got {type(row).__name__}")
            rows += 1
    if not rows:
        raise ValueError(f"{path} is empty: a jsonl data file needs one JSON object per line")


def _load_hub(cfg: DataConfig) -> datasets.Dataset:
    try:
        return datasets.load_dataset(cfg.name, cfg.subset, split=cfg.split)
    except Exception as exc:
        raise RuntimeError(
            f"could not load hub data set {cfg.name!r} (subset {cfg.subset!r}, split {cfg.split!r}): "
            f"{type(exc).__name__}: {exc}. Offline, export it to a local file and use "
            "data.source=jsonl or parquet with data.path=<file>.") from exc


def _row_format(cfg: DataConfig, columns: list[str]) -> str:
    if cfg.source == "text":
        return "text"
    if cfg.messages_field in columns:
        return "messages"
    if cfg.prompt_field in columns and cfg.response_field in columns:
        return "prompt_response"
    if cfg.text_field in columns:
        return "text"
    raise ValueError(
        f"data rows have columns {columns}; expected a chat column {cfg.messages_field!r}, "
        f"a {cfg.prompt_field!r} + {cfg.response_field!r} pair, or a text column {cfg.text_field!r} "
        "(set data.messages_field / prompt_field / response_field / text_field)")


def _chat_record(messages: list[dict], row_number: int) -> Record | None:
    """A chat row as a Record; None when it has no user prompt or no assistant reply."""
    turns = []
    for m in messages:
        if not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
            raise ValueError(f"row {row_number}: each message needs string 'role' and 'content', got {m!r}")
        turns.append({"role": m["role"], "content": m["content"]})
    users = [m["content"] for m in turns if m["role"] == "user"]
    if not users or not any(m["role"] == "assistant" for m in turns):
        return None
    return Record(key=users[0], messages=turns)


def to_records(cfg: DataConfig, rows: datasets.Dataset) -> tuple[list[Record], int]:
    """Rows -> Records, plus the number of rows skipped (empty text, nothing to train on)."""
    fmt = _row_format(cfg, rows.column_names)
    records: list[Record] = []
    for i, row in enumerate(rows):
        if fmt == "messages":
            record = _chat_record(row[cfg.messages_field] or [], i)
        elif fmt == "prompt_response":
            record = _chat_record([{"role": "user", "content": row[cfg.prompt_field]},
                                   {"role": "assistant", "content": row[cfg.response_field]}], i)
        else:
            text = (row["text"] if cfg.source == "text" else row[cfg.text_field]) or ""
            record = Record(key=text, text=text) if text.strip() else None
        if record is not None:
            records.append(record)
    return records, len(rows) - len(records)
