"""The runs table `speclab runs` prints: one line per run, best speedup first.

Ranking: runs that count (completed, checked lossless on at least one prompt with no
mismatch, speedup measured) come first, by speedup; every other run follows, also by
speedup, so a failed or lossy run never ranks above one that counts however fast it
looked. The `note` column says why a run does not count (its one-line error), marks the
training-free baselines, and marks each learned run below the best baseline's speedup:
a speculator is only worth its training if it beats what costs nothing. A baseline is a
training-free drafter as its paper has it; one that also matches a corpus of the run's
training data (`suffix_corpus`) pays for that data and is a candidate like the rest.

Each speedup shows its 95% interval, and `vs leader` says whether the prompts separate the
run from the fastest counted run (the leader): `tied` where they do not (run_rows.mark_ties:
paired per-prompt intervals, docs/design.md). A baseline note follows the same rule: "below
baseline" only where the paired interval puts the run below it, "tied with baseline" where
it does not separate them; runs whose records hold no per-prompt figures or intervals are
compared by their point estimates.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .run_rows import mark_ties, versus

MISSING = "-"
BASELINE_FAMILIES = ("ngram", "suffix")  # the training-free drafters every sweep scores (sweeps/baselines.py)
NOTE_CHARS = 60  # a note is one short line; the whole error is listed under the table


def format_params(n: Any) -> str:
    """1234567 -> '1.23M', 35000 -> '35K', 350000 -> '350K', 0 -> '0' (a training-free drafter)."""
    if not _is_number(n) or n < 0:
        return MISSING
    if n == 0:
        return "0"
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


def format_method(row: dict) -> str:
    """The drafting method the run was scored with: 'chain k=4', 'tree 8 (d4 x4)'; '-' when
    the run did not choose one (eval.method.select=fixed: a chain of eval.k)."""
    block = (row.get("result") or {}).get("method")
    chosen = block.get("chosen") if isinstance(block, dict) else None
    if not isinstance(chosen, dict):
        return MISSING
    if chosen.get("kind") == "tree":
        return f"tree {chosen.get('budget')} (d{chosen.get('depth')} x{chosen.get('top_k')})"
    return f"chain k={chosen.get('k')}"


def format_interval(pair: Any, fmt: str = ".2f") -> str:
    """[1.47, 2.02] -> '1.47-2.02'; '-' when not recorded."""
    if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(_is_number(v) for v in pair)):
        return MISSING
    return f"{format(pair[0], fmt)}-{format(pair[1], fmt)}"


def format_standing(row: dict) -> str:
    """'leader', 'tied' (with the leader), 'behind' (separated from it), '-' (not counted)."""
    if row.get("leader"):
        return "leader"
    if not counts(row):
        return MISSING
    return "tied" if row.get("tied_with_leader") else "behind"


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
    ("95% CI", lambda r: format_interval(r.get("speedup_ci")), True),
    ("vs leader", format_standing, False),
    ("method", format_method, False),
    ("lossless", format_lossless, True),
    ("status", lambda r: str(r.get("status") or MISSING), False),
]


def counts(row: dict) -> bool:
    """Completed, checked lossless (some prompts, no mismatch), speedup measured."""
    checked = row.get("checked_prompts")
    return (row.get("status") == "completed" and _is_number(checked) and checked > 0
            and row.get("mismatches") == 0 and _is_number(row.get("speedup")))


def not_counted_reason(row: dict) -> str | None:
    """Why a run does not count (None when it does)."""
    if counts(row):
        return None
    if row.get("error"):
        return str(row["error"]).splitlines()[0] if str(row["error"]).strip() else "failed"
    if row.get("status") != "completed":
        return f"status {row.get('status') or 'unknown'}"
    if row.get("mismatches"):
        return f"not lossless: {format_lossless(row)} prompts equal to plain decoding"
    if not row.get("checked_prompts"):
        return "never checked against plain decoding"
    return "no measured speedup"


def is_baseline(row: dict) -> bool:
    """A training-free drafter that reads no training data (module docstring)."""
    if row.get("family") not in BASELINE_FAMILIES:
        return False
    config = (row.get("result") or {}).get("config")
    speculator = config.get("speculator") if isinstance(config, dict) else None
    corpus = speculator.get("corpus_tokens") if isinstance(speculator, dict) else None
    return not (_is_number(corpus) and corpus > 0)


def best_baseline(rows: list[dict]) -> dict | None:
    """The counted training-free baseline with the highest speedup."""
    baselines = [r for r in rows if is_baseline(r) and counts(r)]
    return max(baselines, key=lambda r: r["speedup"]) if baselines else None


def note(row: dict, baseline: dict | None) -> str:
    reason = not_counted_reason(row)
    if reason is not None:
        return reason if len(reason) <= NOTE_CHARS else reason[: NOTE_CHARS - 3] + "..."
    if is_baseline(row):
        return "baseline"
    notes = []
    if baseline is not None:
        standing = against_baseline(row, baseline)
        if standing:
            notes.append(f"{standing} ({baseline['family']} {format_speedup(baseline['speedup'])})")
    overlap = (row.get("result") or {}).get("contamination")
    if isinstance(overlap, dict) and all(isinstance(overlap.get(side), dict) for side in ("prompt", "output")):
        # the longest runs of eval tokens found in the training answers (eval/contamination.py)
        notes.append(f"overlap p{overlap['prompt'].get('span')}/o{overlap['output'].get('span')}")
    parts = parts_of(row)
    if parts:
        verdict = "beats its parts" if row["speedup"] > max(parts.values()) else "parts"
        notes.append(f"{verdict} ({', '.join(f'{name} {format_speedup(x)}' for name, x in parts.items())})")
    return "; ".join(notes)


def against_baseline(row: dict, baseline: dict) -> str | None:
    """'below baseline' where the paired interval (else the intervals) puts the run below the
    best baseline, 'tied with baseline' where it does not separate them, None when the run is
    ahead; by the point estimates where the records hold neither."""
    found = versus(row, baseline)
    if found is None:
        return "below baseline" if row["speedup"] < baseline["speedup"] else None
    if found["tied"]:
        return "tied with baseline"
    return "below baseline" if row["speedup"] < baseline["speedup"] else None


def parts_of(row: dict) -> dict[str, float]:
    """A hybrid's parts scored alone in its run: {part: speedup} ({} when absent or malformed)."""
    parts = (row.get("result") or {}).get("parts")
    if not isinstance(parts, dict):
        return {}
    out = {}
    for name in ("learned", "suffix"):
        block = parts.get(name)
        speedup = block.get("speedup") if isinstance(block, dict) else None
        if not _is_number(speedup):
            return {}
        out[name] = float(speedup)
    return out


def sort_by_speedup(rows: list[dict]) -> list[dict]:
    """Counted runs first, then the rest; each part by highest speedup, unmeasured last."""
    def key(r: dict) -> tuple[bool, float]:
        return (not counts(r), -r["speedup"] if _is_number(r.get("speedup")) else math.inf)

    return sorted(rows, key=key)


def format_table(rows: list[dict]) -> str:
    if not rows:
        return "no runs"
    if any("leader" not in row for row in rows):  # rows built one by one (run_rows.row_of)
        mark_ties(rows)
    baseline = best_baseline(rows)
    columns = [*COLUMNS, ("note", lambda r: note(r, baseline), False)]
    cells = [[cell(row) for _, cell, _ in columns] for row in sort_by_speedup(rows)]
    lines = align([header for header, _, _ in columns], cells, [right for _, _, right in columns]).splitlines()
    errors = [f"  {row.get('run_id')}: {row['error']}" for row in rows if row.get("error")]
    if errors:
        lines += ["", "errors:", *errors]
    return "\n".join(lines)


CATEGORY_COLUMNS = ["run", "family", "category", "prompts", "speedup", "95% CI", "acc.len", "acc.rate"]


def format_categories(rows: list[dict]) -> str:
    """`speclab runs --by-category`: one line per run and kind of task (result.json's
    `by_category`), counted runs first by speedup; runs that recorded none are left out."""
    cells = []
    for row in sort_by_speedup(rows):
        block = (row.get("result") or {}).get("by_category")
        if not isinstance(block, dict):
            continue
        for category, figures in sorted(block.items()):
            if not isinstance(figures, dict):
                continue
            cells.append([str(row.get("run_id") or MISSING), str(row.get("family") or MISSING), str(category),
                          format_number(figures.get("prompts"), "d"), format_speedup(figures.get("speedup")),
                          format_interval(figures.get("speedup_ci")),
                          format_number(figures.get("acceptance_length")),
                          format_number(figures.get("acceptance_rate"))])
    if not cells:
        return "no run records per-category figures (result.json: by_category)"
    return align(CATEGORY_COLUMNS, cells, [False, False, False, True, True, True, True, True])


def align(header: list[str], cells: list[list[str]], right: list[bool]) -> str:
    """The runs table's layout: padded columns, a dashed rule under the header."""
    lines = [header, *cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(text.rjust(w) if r else text.ljust(w) for text, w, r in zip(line, widths, right)).rstrip()
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
