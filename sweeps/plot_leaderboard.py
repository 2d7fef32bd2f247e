"""Draw a runs directory's leaderboard: measured speedup and mean acceptance length per run.

    python -m speclab.sweeps.plot_leaderboard --runs DIR --out docs/leaderboard.svg
    python -m speclab.sweeps.plot_leaderboard --record docs/records/demo.csv --out docs/leaderboard.svg

Only runs that count (completed, checked lossless, speedup measured: table.counts) are
drawn, best speedup first; the training-free baselines are drawn in their own colour so a
learned run is read against them. `.svg` is written as hand-built markup (no dependency);
any other suffix (`.png`, `.pdf`) is drawn by matplotlib, which must then be installed.
Every figure comes from the runs' result.json files, or from a record of them (its latest full
scoring, sweeps/records.py): nothing is drawn that was not measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from xml.sax.saxutils import escape

from .records import counted, latest_printout, number, read_record
from .run_rows import load_rows
from .table import counts, is_baseline, sort_by_speedup

BAR_H, GAP, LABEL_W, PANEL_W, PAD = 18, 6, 260, 300, 20
LEARNED, BASELINE = "#4c72b0", "#999999"


def leaderboard(runs_dir: Path) -> list[dict]:
    """Counted runs with an acceptance length, best speedup first: {name, family, baseline,
    speedup, acceptance_length}."""
    rows = sort_by_speedup([r for r in load_rows(runs_dir) if counts(r)])
    return [{"name": r["run_dir"], "family": r["family"], "baseline": is_baseline(r),
             "speedup": float(r["speedup"]), "acceptance_length": float(r["acceptance_length"])}
            for r in rows if r["acceptance_length"] is not None]


def leaderboard_of_record(path: Path) -> list[dict]:
    """leaderboard() of a record's latest full scoring, in its recorded (the runs table's) order."""
    rows = [r for r in latest_printout(read_record(path)) if counted(r) and number(r["acceptance_length"]) is not None]
    return [{"name": r["run"], "family": r["family"], "baseline": r["note"] == "baseline",
             "speedup": number(r["speedup"]), "acceptance_length": number(r["acceptance_length"])} for r in rows]


def svg(entries: list[dict], title: str) -> str:
    """Two horizontal bar panels (speedup with a 1.0x line, mean acceptance length)."""
    panels = [("speedup over plain decoding", "speedup", "{:.2f}x", 1.0),
              ("mean acceptance length", "acceptance_length", "{:.2f}", None)]
    height = 2 * PAD + 30 + len(entries) * (BAR_H + GAP)
    width = LABEL_W + len(panels) * (PANEL_W + PAD) + PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{PAD}" y="{PAD}" font-size="14" font-weight="bold">{escape(title)}</text>']
    top = PAD + 30
    for i, entry in enumerate(entries):
        y = top + i * (BAR_H + GAP)
        out.append(f'<text x="{LABEL_W - 8}" y="{y + BAR_H - 5}" text-anchor="end">{escape(entry["name"])}</text>')
    for p, (label, key, fmt, rule) in enumerate(panels):
        x0 = LABEL_W + p * (PANEL_W + PAD)
        scale = (PANEL_W - 60) / max([e[key] for e in entries] + [rule or 0, 1e-9])
        out.append(f'<text x="{x0}" y="{top - 8}">{escape(label)}</text>')
        for i, entry in enumerate(entries):
            y = top + i * (BAR_H + GAP)
            w = entry[key] * scale
            colour = BASELINE if entry["baseline"] else LEARNED
            out.append(f'<rect x="{x0}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill="{colour}"/>')
            out.append(f'<text x="{x0 + w + 4:.1f}" y="{y + BAR_H - 5}">{fmt.format(entry[key])}</text>')
        if rule is not None:
            xr = x0 + rule * scale
            out.append(f'<line x1="{xr:.1f}" y1="{top - 4}" x2="{xr:.1f}" y2="{height - PAD}" '
                       f'stroke="black" stroke-dasharray="4 3"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw_matplotlib(entries: list[dict], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [e["name"] for e in entries][::-1]
    colours = [BASELINE if e["baseline"] else LEARNED for e in entries][::-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 1 + 0.35 * len(entries)), sharey=True)
    for ax, key, label in zip(axes, ("speedup", "acceptance_length"),
                              ("speedup over plain decoding", "mean acceptance length")):
        ax.barh(names, [e[key] for e in entries][::-1], color=colours)
        ax.set_xlabel(label)
    axes[0].axvline(1.0, color="black", linestyle="--", linewidth=1)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speclab.sweeps.plot_leaderboard", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--runs", type=Path, default=Path("runs"), help="directory holding the run directories")
    source.add_argument("--record", type=Path, default=None, help="a record of runs (docs/records/NAME.csv) instead")
    parser.add_argument("--out", type=Path, required=True, help="image to write: .svg (no dependency) or .png via matplotlib")
    parser.add_argument("--title", default=None, help="figure title (default: the runs directory's name)")
    args = parser.parse_args(argv)
    source = args.record or args.runs
    if not source.exists():
        parser.exit(2, f"{parser.prog}: error: no {'record' if args.record else 'runs directory'} {source}\n")
    entries = leaderboard_of_record(args.record) if args.record else leaderboard(args.runs)
    if not entries:
        parser.exit(2, f"{parser.prog}: error: no run in {source} counts (completed, lossless, measured)\n")
    title = args.title or f"speclab leaderboard: {args.record.stem if args.record else args.runs.name}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix == ".svg":
        args.out.write_text(svg(entries, title))
    else:
        try:
            draw_matplotlib(entries, title, args.out)
        except ImportError:
            parser.exit(2, f"{parser.prog}: error: {args.out.suffix} needs matplotlib; write .svg instead\n")
    print(f"{args.out}: {len(entries)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
