"""The data-scaling study's figure and table: acceptance against training tokens.

    python -m speclab.sweeps.plot_scaling --runs DIR [--runs DIR ...] [--out docs/data_scaling.svg] [--markdown]
    python -m speclab.sweeps.plot_scaling --cells docs/study_cells.csv --out docs/data_scaling_grid.svg

One point per counted run (completed, checked lossless, speedup measured: table.counts):
x = the training tokens it trained on (every stage's, log scale), y = its mean acceptance
length, one line per recipe x family; the training-free baselines scored in the same sweeps
are drawn per family: a dashed line, or a band from the lowest to the highest where several
sweeps (or budgets) scored it. `--runs` may repeat: a study whose cells ran as several sweeps
is drawn as one grid. `--markdown` prints the table (tokens x recipe x
family: acceptance length, per-position rates, speedup, data and training seconds). The
recipe is read from the run's resolved config (stages: two_stage; a code_corpus source:
teacher_forced; otherwise self_distilled). Every figure comes from result.json.

`--cells CSV` draws cells recorded from runs that are no longer on disk (a study spread over
several hosts and dates): one row per scoring, with the columns of CELL_COLUMNS. `budget` is
the tokens per data set, as the study's sweep sets `data.max_tokens`; a two_stage cell
trained on two data sets of that budget and is placed at their sum, as its runs are. Rows
whose recipe is `baseline` (budget 0) are drawn as the bands. The file is read as data: its
values are checked and never evaluated.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from xml.sax.saxutils import escape

from .run_rows import load_rows
from .table import counts, format_per_position, is_baseline

W, H, PAD, LEFT, BOTTOM = 640, 360, 20, 60, 40
DASHES = {"teacher_forced": "6 4", "two_stage": "2 3"}  # self-distilled and the rest: solid
COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974"]


def recipe_of(config: dict) -> str:
    training, data = config.get("training") or {}, config.get("data") or {}
    if training.get("stages"):
        return "two_stage"
    return "teacher_forced" if data.get("source") == "code_corpus" else "self_distilled"


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _data_seconds(data: dict) -> float | None:
    """Seconds the run's data cost: building it (generation) and its target features."""
    blocks = data.get("stages") if isinstance(data.get("stages"), list) else [data]
    total = 0.0
    for block in blocks:
        if not isinstance(block, dict):
            return None
        total += _number(block.get("build_seconds")) or 0.0
    for feature in data.get("feature_cache") or []:
        total += _number(feature.get("seconds") if isinstance(feature, dict) else None) or 0.0
    return total


def series_order(point: dict) -> tuple:
    """A line per (recipe, family), its points by training tokens."""
    return point["recipe"], point["family"], point["tokens"]


def points(*runs_dirs: Path) -> tuple[list[dict], list[dict]]:
    """(learned runs as scaling points, baselines): figures read from each result.json of
    every directory given."""
    return points_of([row for runs_dir in runs_dirs for row in load_rows(runs_dir)])


def points_of(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """points() over rows already loaded (index.load_rows)."""
    learned, baselines = [], []
    for row in rows:
        if not counts(row) or row["acceptance_length"] is None:
            continue
        result = row["result"]
        if is_baseline(row):
            baselines.append({"family": row["family"], "acceptance_length": row["acceptance_length"],
                              "speedup": row["speedup"]})
            continue
        data = result.get("data") if isinstance(result.get("data"), dict) else {}
        stages = data.get("stages") if isinstance(data.get("stages"), list) else [data]
        tokens = sum(_number(s.get("assistant_tokens")) or 0 for s in stages if isinstance(s, dict))
        if not tokens:
            continue
        train = result.get("train") if isinstance(result.get("train"), dict) else {}
        learned.append({"run": row["run_id"], "recipe": recipe_of(result.get("config") or {}), "family": row["family"],
                        "tokens": int(tokens), "acceptance_length": row["acceptance_length"],
                        "per_position": row["per_position"], "speedup": row["speedup"],
                        "data_s": _data_seconds(data), "train_s": _number(train.get("wall_s"))})
    learned.sort(key=series_order)
    return learned, baselines


CELL_COLUMNS = ("recipe", "family", "budget", "acceptance_length", "speedup", "date", "host")
CELL_RECIPES = ("self_distilled", "teacher_forced", "two_stage", "corpus", "baseline")


class CellsError(ValueError):
    """A cells file that cannot be drawn: which line, and why."""


def _cell(row: dict, line: int) -> dict:
    recipe, family = row["recipe"].strip(), row["family"].strip()
    if recipe not in CELL_RECIPES:
        raise CellsError(f"line {line}: recipe {recipe!r} is not one of {', '.join(CELL_RECIPES)}")
    if not family:
        raise CellsError(f"line {line}: no family")
    try:
        budget, length, speedup = int(row["budget"]), float(row["acceptance_length"]), float(row["speedup"])
    except ValueError as error:
        raise CellsError(f"line {line}: {error}") from None
    if (recipe == "baseline") != (budget == 0) or budget < 0:
        raise CellsError(f"line {line}: budget {budget}: a baseline has 0 tokens, a trained cell more")
    if not (math.isfinite(length) and length >= 1.0 and math.isfinite(speedup) and speedup > 0):
        raise CellsError(f"line {line}: acceptance {length} must be >= 1 and speedup {speedup} > 0")
    return {"run": f"{row['date'].strip()} {row['host'].strip()}", "recipe": recipe, "family": family,
            "tokens": budget * (2 if recipe == "two_stage" else 1), "acceptance_length": length,
            "per_position": None, "speedup": speedup, "data_s": None, "train_s": None}


def cells(path: Path) -> tuple[list[dict], list[dict]]:
    """(learned cells as scaling points, baselines) from a recorded-cells CSV (CELL_COLUMNS)."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in CELL_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CellsError(f"no column {', '.join(missing)} (expected {','.join(CELL_COLUMNS)})")
        rows = [_cell(row, line) for line, row in enumerate(reader, start=2)]
    learned = sorted((r for r in rows if r["recipe"] != "baseline"), key=series_order)
    baselines = [{"family": r["family"], "acceptance_length": r["acceptance_length"], "speedup": r["speedup"]}
                 for r in rows if r["recipe"] == "baseline"]
    return learned, baselines


def markdown(learned: list[dict], baselines: list[dict]) -> str:
    lines = ["| recipe | family | training tokens | acceptance length | per position | speedup | data s | train s |",
             "|---|---|---|---|---|---|---|---|"]
    for p in learned:
        seconds = " | ".join("–" if p[key] is None else f"{p[key]:.0f}" for key in ("data_s", "train_s"))
        lines.append(f"| {p['recipe']} | {p['family']} | {p['tokens']:,} | {p['acceptance_length']:.2f} | "
                     f"{format_per_position(p['per_position'])} | {p['speedup']:.2f}x | {seconds} |")
    for b in baselines:
        lines.append(f"| (baseline) | {b['family']} | 0 | {b['acceptance_length']:.2f} | | {b['speedup']:.2f}x | | |")
    return "\n".join(lines)


def baseline_ranges(baselines: list[dict]) -> list[tuple[str, float, float, str]]:
    """Per baseline family: (family, lowest and highest acceptance, its speedups as text)."""
    ranges = []
    for family in sorted({b["family"] for b in baselines}):
        scored = [b for b in baselines if b["family"] == family]
        lengths, speedups = [b["acceptance_length"] for b in scored], sorted(b["speedup"] for b in scored)
        text = f"{speedups[0]:.2f}x" if speedups[0] == speedups[-1] else f"{speedups[0]:.2f}-{speedups[-1]:.2f}x"
        ranges.append((family, min(lengths), max(lengths), text))
    return ranges


def svg(learned: list[dict], baselines: list[dict], title: str) -> str:
    """Acceptance length against log10(tokens): a polyline per recipe x family."""
    values = [p["acceptance_length"] for p in learned] + [b["acceptance_length"] for b in baselines]
    lo_y, hi_y = 1.0, max(values + [1.5]) * 1.05
    xs = [math.log10(p["tokens"]) for p in learned] or [4.0, 6.0]
    lo_x, hi_x = math.floor(min(xs)), math.ceil(max(xs) + 1e-9)
    hi_x = max(hi_x, lo_x + 1)
    plot_w, plot_h = W - LEFT - PAD, H - BOTTOM - 2 * PAD

    def x(tokens: float) -> float:
        return LEFT + (math.log10(tokens) - lo_x) / (hi_x - lo_x) * plot_w

    def y(value: float) -> float:
        return PAD + 20 + (1 - (value - lo_y) / (hi_y - lo_y)) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 20 * len(set((p["recipe"], p["family"]) for p in learned))}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="{LEFT}" y="{PAD}" font-size="13">{escape(title)}</text>',
           f'<line x1="{LEFT}" y1="{y(lo_y)}" x2="{LEFT + plot_w}" y2="{y(lo_y)}" stroke="#333"/>',
           f'<line x1="{LEFT}" y1="{y(lo_y)}" x2="{LEFT}" y2="{y(hi_y)}" stroke="#333"/>']
    for decade in range(lo_x, hi_x + 1):
        out.append(f'<text x="{x(10 ** decade)}" y="{y(lo_y) + 14}" text-anchor="middle">1e{decade}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{y(lo_y) + 30}" text-anchor="middle">training tokens (log)</text>')
    steps = 5
    for i in range(steps + 1):
        value = lo_y + (hi_y - lo_y) * i / steps
        out.append(f'<text x="{LEFT - 6}" y="{y(value) + 4}" text-anchor="end">{value:.2f}</text>')
    out.append(f'<text x="14" y="{y((lo_y + hi_y) / 2)}" transform="rotate(-90 14 {y((lo_y + hi_y) / 2)})" '
               'text-anchor="middle">mean acceptance length</text>')
    for family, lo, hi, speedups in baseline_ranges(baselines):
        top, bottom = y(hi), y(lo)
        if hi > lo:  # several scorings of one baseline: their range, not a line each
            out.append(f'<rect x="{LEFT}" y="{top:.1f}" width="{plot_w}" height="{bottom - top:.1f}" fill="#999" '
                       'fill-opacity="0.15"/>')
        out.append(f'<line x1="{LEFT}" y1="{top:.1f}" x2="{LEFT + plot_w}" y2="{top:.1f}" stroke="#999" '
                   'stroke-dasharray="4 3"/>')
        out.append(f'<text x="{LEFT + plot_w - 4}" y="{top - 4:.1f}" text-anchor="end" fill="#666">'
                   f'{escape(family)} {speedups}</text>')
    series: dict[tuple[str, str], list[dict]] = {}
    for p in learned:
        series.setdefault((p["recipe"], p["family"]), []).append(p)
    families = sorted({family for _, family in series})
    for i, ((recipe, family), pts) in enumerate(sorted(series.items())):
        # A colour per family and a dash per recipe: a grid of 3 x 3 lines stays readable.
        colour, dash = COLOURS[families.index(family) % len(COLOURS)], DASHES.get(recipe, "")
        stroke = f'stroke="{colour}" stroke-width="2"' + (f' stroke-dasharray="{dash}"' if dash else "")
        path = " ".join(f"{x(p['tokens']):.1f},{y(p['acceptance_length']):.1f}" for p in pts)
        out.append(f'<polyline points="{path}" fill="none" {stroke}/>')
        for p in pts:
            out.append(f'<circle cx="{x(p["tokens"]):.1f}" cy="{y(p["acceptance_length"]):.1f}" r="3" fill="{colour}">'
                       f'<title>{escape(p["run"])}: {p["acceptance_length"]:.2f}, {p["speedup"]:.2f}x</title></circle>')
        out.append(f'<line x1="{LEFT}" y1="{H + 20 * i - 3}" x2="{LEFT + 24}" y2="{H + 20 * i - 3}" {stroke}/>')
        out.append(f'<text x="{LEFT + 30}" y="{H + 20 * i + 1}">{escape(recipe)} · {escape(family)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, action="append", default=[],
                        help="a runs directory (e.g. a data_scaling sweep's); repeat it to draw several as one grid")
    parser.add_argument("--cells", type=Path, default=None,
                        help="a CSV of recorded cells (docs/study_cells.csv), drawn with any --runs")
    parser.add_argument("--out", type=Path, default=None, help="write the SVG figure here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--title", default="Mean acceptance length against training tokens")
    args = parser.parse_args(argv)
    if not args.runs and args.cells is None:
        parser.error("give --runs DIR or --cells CSV")
    missing = [str(d) for d in args.runs if not d.is_dir()]
    if args.cells is not None and not args.cells.is_file():
        missing.append(str(args.cells))
    if missing:
        print(f"error: not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    learned, baselines = points(*args.runs)
    if args.cells is not None:
        try:
            recorded, recorded_baselines = cells(args.cells)
        except CellsError as error:
            print(f"error: {args.cells}: {error}", file=sys.stderr)
            return 2
        learned = sorted(learned + recorded, key=series_order)
        baselines += recorded_baselines
    if not learned:
        sources = [str(d) for d in args.runs] + ([str(args.cells)] if args.cells else [])
        print(f"error: no counted learned runs with training tokens under {', '.join(sources)}", file=sys.stderr)
        return 1
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(svg(learned, baselines, args.title))
        print(f"wrote {args.out} ({len(learned)} runs, {len(baselines)} baselines)")
    if args.markdown or not args.out:
        print(markdown(learned, baselines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
