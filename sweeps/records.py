"""Records: CSV files of measured figures, one row per scoring of one thing (docs/records/).

Each row carries the machine, its CPU flags, the date, the dtype and the command that measured
it. A record of runs (the columns of RUN_COLUMNS) holds one or more scorings of a runs folder,
each named in its `scoring` column, in the order they were appended. Values are read as text
and parsed as numbers where a table needs one; nothing is evaluated.
"""

from __future__ import annotations

import csv
from pathlib import Path

RUN_COLUMNS = ("scoring", "run", "family", "params", "acceptance_length", "per_position", "spec_tok_s",
               "baseline_tok_s", "speedup", "ci_low", "ci_high", "method", "lossless", "status", "note",
               "machine", "cpu_flags", "date", "dtype", "command")


def read_record(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def scorings(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["scoring"] for row in rows))


def latest_printout(rows: list[dict]) -> list[dict]:
    """The latest scoring whose rows carry acceptance lengths: one recorded by its speedups
    alone is not a full runs table."""
    full = [name for name in scorings(rows) if any(r["scoring"] == name and r["acceptance_length"] for r in rows)]
    return [r for r in rows if r["scoring"] == full[-1]] if full else []


def counted(row: dict) -> bool:
    """A recorded run that counts: completed, every checked prompt lossless, speedup measured."""
    done, checked = row["lossless"].partition("/")[::2]
    return (row["status"] == "completed" and number(row["speedup"]) is not None
            and bool(checked) and done == checked and checked != "0")
