"""The runs table `speclab runs` prints: one line per run, best speedup first."""

from __future__ import annotations

import math
from typing import Any, Callable

MISSING = "-"


def format_params(n: Any) -> str:
    """1234567 -> '1.23M', 35000 -> '35K', 350000 -> '350K'."""
    if not _is_number(n) or n <= 0:
        return MISSING
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}" if n / scale < 100 else f"{n / scale:.0f}{suffix}"
    return str(int(n))


def format_per_position(rates: Any) -> str:
    """[0.712, 0.52, 0.38] -> '0.71/0.52/0.38': the acceptance rate at each draft position."""
    if not rates:
        return MISSING
    return "/".join(f"{r:.2f}" if _is_number(r) else "?" for r in rates)


def format_number(value: Any, fmt: str = ".2f") -> str:
    return format(value, fmt) if _is_number(value) else MISSING


def format_speedup(value: Any) -> str:
    return f"{value:.2f}x" if _is_number(value) else MISSING


def format_lossless(row: dict) -> str:
    """'8/8' = 8 of 8 checked prompts identical to plain decoding."""
    checked, mismatches = row.get("checked_prompts"), row.get("mismatches")
    if not _is_number(checked) or not checked:
        return MISSING
    return f"{checked - (mismatches or 0)}/{checked}"


# (header, cell of a row, right-aligned)
COLUMNS: list[tuple[str, Callable[[dict], str], bool]] = [
    ("run", lambda r: str(r.get("run_id") or r.get("run_dir") or MISSING), False),
    ("family", lambda r: str(r.get("family") or MISSING), False),
    ("params", lambda r: format_params(r.get("params")), True),
    ("acc.len", lambda r: format_number(r.get("acceptance_length"), ".2f"), True),
    ("per-position", lambda r: format_per_position(r.get("per_position")), False),
    ("spec tok/s", lambda r: format_number(r.get("spec_tok_s"), ".1f"), True),
    ("base tok/s", lambda r: format_number(r.get("baseline_tok_s"), ".1f"), True),
    ("speedup", lambda r: format_speedup(r.get("speedup")), True),
    ("lossless", format_lossless, True),
    ("status", lambda r: str(r.get("status") or MISSING), False),
]


def sort_by_speedup(rows: list[dict]) -> list[dict]:
    """Highest speedup first; runs without one (failed, unmeasured) last, in their order."""
    return sorted(rows, key=lambda r: -r["speedup"] if _is_number(r.get("speedup")) else math.inf)


def format_table(rows: list[dict]) -> str:
    if not rows:
        return "no runs"
    cells = [[header for header, _, _ in COLUMNS]]
    cells += [[cell(row) for _, cell, _ in COLUMNS] for row in sort_by_speedup(rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = []
    for line in cells:
        padded = [text.rjust(w) if right else text.ljust(w)
                  for text, w, (_, _, right) in zip(line, widths, COLUMNS)]
        lines.append("  ".join(padded).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    errors = [f"  {row.get('run_id')}: {row['error']}" for row in rows if row.get("error")]
    if errors:
        lines += ["", "errors:", *errors]
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
