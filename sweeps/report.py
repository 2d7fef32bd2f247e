"""Generated tables and figures: every figure in README.md and docs/results.md comes from a record.

    python -m speclab.sweeps.report render [--check]
    python -m speclab.sweeps.report record --runs runs/demo --name demo [--scoring NAME] [--command CMD] [--replace]
    python -m speclab.sweeps.report record-engine --json BENCH.json --name NAME --command CMD
    python -m speclab.sweeps.report record-build --entry CACHE_ENTRY --command CMD
    python -m speclab.sweeps.report record-bench --json BENCH.json --name NAME --command CMD
    python -m speclab.sweeps.report record-runtime --json RUNTIME.json --command CMD [--dtype bf16]

A record is a CSV file under docs/records/ (docs/study_cells.csv is the data-scaling
study's): one row per scoring of one thing, with the machine, its CPU flags, the date and
dtype, and the command that measured it. `render` rewrites each block between
`<!-- table:NAME -->` and `<!-- /table:NAME -->` in the pages from its record, so a figure
is changed by changing the record, never the page; `--check` rewrites nothing and exits 1
naming each block that differs (the docs test runs it). The README's leaderboard figure is
drawn the same way (FIGURES). Where a record holds several scorings of a thing, the table
shows their median and, in brackets, their range; a single scoring shows its 95% interval
when the record has one. `record` appends a runs folder's
result.json figures as one scoring, on the machine it runs on (`--replace`: the record's
only one).

Records are read as data: values are parsed as numbers or shown as text, never evaluated.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Callable

from . import plot_leaderboard
from .run_rows import load_rows
from .records import RUN_COLUMNS, latest_printout, number, read_record, scorings
from .table import (align, best_baseline, format_lossless, format_method, format_params, format_per_position,
                    note, sort_by_speedup)

PAGES = ("README.md", "docs/results.md", "docs/serving.md")
BLOCK = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S)


def spread(values: list[float], fmt: str = ".2f", unit: str = "", ci: tuple | None = None) -> str:
    """One scoring: its figure (and its interval when known); several: median (lowest–highest)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    mid = f"{statistics.median(values):{fmt}}{unit}"
    if len(values) > 1:
        return f"{mid} ({min(values):{fmt}}–{max(values):{fmt}})"
    if ci and None not in ci:
        return f"{mid} ({ci[0]:{fmt}}–{ci[1]:{fmt}})"
    return mid


def measured_on(rows: list[dict], machine: str = "machine", date: str = "date") -> str:
    """One line: each distinct (machine, CPU flags, dtype), with its dates."""
    seen: dict[tuple, list[str]] = {}
    for row in rows:
        key = (row.get(machine), row.get("cpu_flags"), row.get("dtype"))
        seen.setdefault(key, [])
        if row.get(date) not in seen[key]:
            seen[key].append(row.get(date))
    parts = []
    for (name, flags, dtype), dates in seen.items():
        described = name + (f", CPU flags `{flags}`" if flags else "") + (f", {dtype}" if dtype else "")
        parts.append(f"{described}, {', '.join(sorted(dates))}")
    return "Measured on: " + "; ".join(parts) + "."


def commands_of(rows: list[dict]) -> str:
    distinct = list(dict.fromkeys(row["command"] for row in rows if row.get("command")))
    return "Command: " + "; ".join(f"`{c}`" for c in distinct) + "." if distinct else ""


def markdown(header: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in cells)])


# --- the tables ------------------------------------------------------------------------------


def printout(rows: list[dict]) -> str:
    """The runs table as `speclab runs` prints it, for the record's latest full scoring (one
    whose rows carry acceptance lengths: a scoring recorded by its speedups alone is not a printout)."""
    latest = latest_printout(rows)
    header = ["run", "family", "params", "acc.len", "per-position", "spec tok/s", "base tok/s", "speedup",
              "method", "lossless", "status", "note"]
    right = [False, False, True, True, False, True, True, True, False, True, False, False]

    def show(text: str, fmt: str, unit: str = "") -> str:
        value = number(text)
        return "-" if value is None else f"{value:{fmt}}{unit}"

    cells = [[r["run"], r["family"], r["params"], show(r["acceptance_length"], ".2f"), r["per_position"] or "-",
              show(r["spec_tok_s"], ".1f"), show(r["baseline_tok_s"], ".1f"), show(r["speedup"], ".2f", "x"),
              r["method"] or "-", r["lossless"] or "-", r["status"], r["note"]] for r in latest]
    table = "```\n" + align(header, cells, right) + "\n```"
    return "\n".join([table, "", measured_on(latest) + " " + commands_of(latest)])


def medians(rows: list[dict]) -> str:
    """Each run over every scoring in the record: median (range), or its interval when scored once."""
    by_run: dict[str, list[dict]] = {}
    for row in rows:
        by_run.setdefault(row["run"], []).append(row)
    cells = []
    for run, scored in by_run.items():
        speed = [number(r["speedup"]) for r in scored]
        ci = (number(scored[0]["ci_low"]), number(scored[0]["ci_high"]))
        cells.append([run, scored[0]["family"], next((r["method"] for r in scored if r["method"]), "–"),
                      spread([number(r["acceptance_length"]) for r in scored]),
                      spread(speed, unit="x", ci=ci), str(sum(v is not None for v in speed)),
                      " ".join(dict.fromkeys(r["lossless"] for r in scored))])
    header = ["run", "family", "method", "acceptance length", "speedup", "scorings", "lossless"]
    return "\n".join([markdown(header, cells), "", measured_on(rows) + " " + commands_of(rows)])


def repeated(rows: list[dict]) -> str:
    """A bench's methods over its scorings in one process (`record-bench`): the median speedup
    and range, the first scoring's 95% interval, and where each scoring placed it."""
    by_method: dict[str, list[dict]] = {}
    for row in rows:
        by_method.setdefault(row["run"], []).append(row)
    cells = []
    for method, scored in by_method.items():
        lo, hi = number(scored[0]["ci_low"]), number(scored[0]["ci_high"])
        cells.append([f"`{method}`", spread([number(r["acceptance_length"]) for r in scored]),
                      spread([number(r["speedup"]) for r in scored], unit="x"),
                      f"{lo:.2f}–{hi:.2f}" if lo is not None and hi is not None else "–",
                      ", ".join(r["note"] or "behind" for r in scored) if method != "plain" else "baseline",
                      " ".join(dict.fromkeys(r["lossless"] for r in scored))])
    header = ["method", "acceptance length", "speedup, median (range)", "first scoring's 95% interval",
              "each scoring: leader, tied with it (paired interval), or behind", "lossless"]
    return "\n".join([markdown(header, cells), "",
                      f"{len(scorings(rows))} scorings in one process. " + measured_on(rows) + " " + commands_of(rows)])


def demo_machines(rows: list[dict]) -> str:
    header = ["machine", "CPU flags", "dtype", "cold, min", "warm, min", "best run", "best baseline", "date"]
    cells = [[r["machine"], f"`{r['cpu_flags']}`", r["dtype"], r["cold_min"], r["warm_min"],
              f"{r['best_speedup']}x ({r['scored']})", f"{r['baseline_speedup']}x", r["date"]] for r in rows]
    return "\n".join([markdown(header, cells), "", "Measured on: each row's machine, on its date. " + commands_of(rows)])


def runtime(rows: list[dict]) -> str:
    """The lean target's decode step against its memory-bandwidth bound, its verification passes
    against one token, a long prompt's prefill, and against transformers' `generate`."""
    def times(ms: str, of: str) -> str:
        return "–" if number(ms) is None else f"{ms} ({number(ms) / number(of):.2f}x)"

    def prefill(r: dict) -> str:
        return "–" if number(r.get("prefill_ms")) is None else f"{r['prefill_ms']} ({r['prefill_tokens']} tokens)"

    header = ["machine", "CPU flags", "dtype", "1-token step, ms (x bound)", "5 tokens, ms (x step)",
              "8 tokens, ms (x step)", "prefill, ms", "batch 32, tok/s", "step vs `generate`", "date"]
    cells = [[r["machine"], f"`{r['cpu_flags']}`", r["dtype"], times(r["step_ms"], r["bound_ms"]),
              times(r["pass5_ms"], r["step_ms"]), times(r["pass8_ms"], r["step_ms"]), prefill(r),
              r["batch32_tok_s"] or "–",
              f"{number(r['vs_generate']) or number(r['generate_ms']) / number(r['step_ms']):.2f}x faster", r["date"]]
             for r in rows]
    return "\n".join([markdown(header, cells), "", "Measured on: each row's machine, on its date. " + commands_of(rows)])


def categories(rows: list[dict]) -> str:
    """Speedup / acceptance length per method and prompt category."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    names = list(dict.fromkeys(r["category"] for r in rows))
    by = {(r["method"], r["category"]): r for r in rows}
    cells = []
    for method in methods:
        line = [method]
        for name in names:
            r = by.get((method, name))
            accepted = number(r["acceptance_length"]) if r else None
            shown = "–" if r is None else f"{float(r['speedup']):.2f}x"
            line.append(shown + (f" / {accepted:.2f}" if accepted else ""))
        cells.append(line)
    return "\n".join([markdown(["method", *names], cells), "", measured_on(rows) + " " + commands_of(rows)])


STUDY_RECIPES = {"self_distilled": "self-distilled", "teacher_forced": "teacher-forced Python source",
                 "two_stage": "two-stage (source, then self-distilled; tokens per stage)",
                 "corpus": "the self-distilled answers as a `suffix` corpus (no training)"}
STUDY_BUDGETS = {30_000: "30k tokens", 100_000: "100k", 300_000: "300k", 1_000_000: "1M"}


def study_grid(rows: list[dict]) -> str:
    """The data-scaling grid: acceptance length / speedup per recipe, family and token budget."""
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["recipe"] != "baseline":
            cells.setdefault((row["recipe"], row["family"]), []).append(row)
    lines = []
    for recipe in STUDY_RECIPES:
        for family in dict.fromkeys(r["family"] for r in rows if r["recipe"] == recipe):
            scored = cells[recipe, family]
            line = [STUDY_RECIPES[recipe], f"`{family}`"]
            for budget in STUDY_BUDGETS:
                at = [r for r in scored if int(r["budget"]) == budget]
                line.append(f"{spread([number(r['acceptance_length']) for r in at])} / "
                            f"{spread([number(r['speedup']) for r in at], unit='x')}" if at else "–")
            lines.append(line)
    return "\n".join([markdown(["recipe", "family", *STUDY_BUDGETS.values()], lines), "",
                      measured_on(rows, machine="host"), ""])


def study_baselines(rows: list[dict]) -> str:
    """The training-free baselines scored in the study's sweeps."""
    base = [r for r in rows if r["recipe"] == "baseline"]
    lines = [[f"`{family}`", spread([number(r["acceptance_length"]) for r in base if r["family"] == family]),
              spread([number(r["speedup"]) for r in base if r["family"] == family], unit="x"),
              str(sum(r["family"] == family for r in base))]
             for family in dict.fromkeys(r["family"] for r in base)]
    return "\n".join([markdown(["baseline", "acceptance length", "speedup", "scorings"], lines), "",
                      measured_on(base, machine="host"), ""])


def engines(rows: list[dict]) -> str:
    """One draft in speclab and in llama.cpp (`speclab bench --engine llama.cpp`): each method over
    the record's scorings, each engine's speedup over its own plain decoding."""
    by: dict[tuple, list[dict]] = {}
    for row in rows:
        by.setdefault((row["engine"], row["method"]), []).append(row)
    cells = []
    for (engine, method), scored in by.items():
        ci = (number(scored[0]["ci_low"]), number(scored[0]["ci_high"]))
        drafted = sum(number(r["drafted"]) or 0 for r in scored)
        accepted = sum(number(r["accepted"]) or 0 for r in scored)
        cells.append([engine, f"`{method}`", spread([number(r["tok_s"]) for r in scored], ".1f"),
                      spread([number(r["speedup"]) for r in scored], unit="x", ci=ci),
                      spread([number(r["acceptance_length"]) for r in scored]),
                      f"{accepted / drafted:.2f}" if drafted else "–",
                      " ".join(dict.fromkeys(r["lossless"] for r in scored))])
    header = ["engine", "method", "tok/s", "speedup over the engine's plain", "acceptance length",
              "accepted / drafted", "lossless"]
    plain = [r for r in rows if r["vs_speclab_plain"]]
    across = (f"llama.cpp's plain decoding ran {spread([number(r['vs_speclab_plain']) for r in plain], unit='x')} "
              f"speclab's plain tok/s; the two engines' plain tokens agreed on "
              f"{', '.join(dict.fromkeys(r['plain_agree'] for r in plain))} prompts. ") if plain else ""
    benches = list(dict.fromkeys(r.get("bench") for r in rows))
    runs = (f"{len(scorings(rows))} scorings in one process" if len(benches) == 1 else
            f"{len(scorings(rows))} scorings in each of {len(benches)} bench processes (one a draft)")
    return "\n".join([markdown(header, cells), "", f"{runs}. " + across +
                      measured_on(rows) + " " + commands_of(rows)])


BUILD_COLUMNS = ("version", "tools", "jobs", "seconds", "bin_mb", "src_mb", "machine", "cpu_flags", "date", "command")


def engine_builds(rows: list[dict]) -> str:
    """Each recorded build of llama.cpp (its entry's build.json): time and sizes."""
    def took(seconds: str) -> str:
        return f"{number(seconds):.0f} s ({number(seconds) / 60:.1f} min)"

    cells = [[r["version"], f"`{r['tools']}`", r["jobs"], took(r["seconds"]),
              f"{r['bin_mb']} MB", f"{r['src_mb']} MB", r["machine"], f"`{r['cpu_flags']}`", r["date"]] for r in rows]
    header = ["llama.cpp", "tools", "jobs", "build, download included", "tools", "kept source tree", "machine",
              "CPU flags", "date"]
    return "\n".join([markdown(header, cells), "", commands_of(rows)])


# name -> (record, how it is drawn)
TABLES: dict[str, tuple[str, Callable[[list[dict]], str]]] = {
    "demo": ("docs/records/demo.csv", printout),
    "demo-medians": ("docs/records/demo.csv", medians),
    "demo-repeat": ("docs/records/demo_repeat.csv", repeated),
    "demo-machines": ("docs/records/demo_machines.csv", demo_machines),
    "block-drafters": ("docs/records/block_drafters.csv", printout),
    "dflash-epochs": ("docs/records/dflash_epochs.csv", printout),
    "dflash2-demo": ("docs/records/dflash2_demo.csv", printout),
    "block-drafters-repeat": ("docs/records/block_drafters_repeat.csv", repeated),
    "block-drafters-300k": ("docs/records/block_drafters_300k.csv", printout),
    "dflash2-1m": ("docs/records/dflash2_1m.csv", printout),
    "dflash2-1m-epochs": ("docs/records/dflash2_1m_epochs.csv", printout),
    "dflash2-1m-epochs-hybrids": ("docs/records/dflash2_1m_epochs_hybrids.csv", repeated),
    "block-hybrids-repeat": ("docs/records/block_hybrids_repeat.csv", repeated),
    "block-drafters-1m": ("docs/records/block_drafters_1m.csv", printout),
    "block-drafters-1m-repeat": ("docs/records/block_drafters_1m_repeat.csv", repeated),
    "block-hybrids-min-match": ("docs/records/block_hybrids_min_match.csv", repeated),
    "peagle-xpress-1m": ("docs/records/peagle_xpress_1m.csv", printout),
    "peagle-1m-repeat": ("docs/records/peagle_1m_repeat.csv", repeated),
    "xpress-peagle-1m-repeat": ("docs/records/xpress_peagle_1m_repeat.csv", repeated),
    "eagle3-target-start-100k": ("docs/records/eagle3_target_start_100k.csv", printout),
    "eagle3-target-start-100k-bench": ("docs/records/eagle3_target_start_100k_bench.csv", repeated),
    "peagle-target-start-100k": ("docs/records/peagle_target_start_100k.csv", printout),
    "peagle-target-start-100k-bench": ("docs/records/peagle_target_start_100k_bench.csv", repeated),
    "eagle3-target-start-1m": ("docs/records/eagle3_target_start_1m.csv", printout),
    "eagle3-target-start-1m-repeat": ("docs/records/eagle3_target_start_1m_repeat.csv", repeated),
    "peagle-target-start-1m": ("docs/records/peagle_target_start_1m.csv", printout),
    "peagle-target-start-1m-bench": ("docs/records/peagle_target_start_1m_bench.csv", repeated),
    "eagle3-target-start-1m-epochs": ("docs/records/eagle3_target_start_1m_epochs.csv", printout),
    "eagle3-target-start-1m-epochs-bench": ("docs/records/eagle3_target_start_1m_epochs_bench.csv", repeated),
    "eagle3-ttt-steps-100k-bench": ("docs/records/eagle3_ttt_steps_100k_bench.csv", repeated),
    "eagle3-1-1m": ("docs/records/eagle3_1_1m.csv", printout),
    "eagle3-1-1m-bench": ("docs/records/eagle3_1_1m_bench.csv", repeated),
    "eagle3-1-1m-epoch3-bench": ("docs/records/eagle3_1_1m_epoch3_bench.csv", repeated),
    "eagle3-1-1m-epoch4-bench": ("docs/records/eagle3_1_1m_epoch4_bench.csv", repeated),
    "eagle3-1-100k-bench": ("docs/records/eagle3_1_100k_bench.csv", repeated),
    "eagle3-1-100k-lr-bench": ("docs/records/eagle3_1_100k_lr_bench.csv", repeated),
    "eagle3-1-100k-hybrid-bench": ("docs/records/eagle3_1_100k_hybrid_bench.csv", repeated),
    "runtime": ("docs/records/runtime.csv", runtime),
    "full-recipe": ("docs/records/full_recipe.csv", medians),
    "full-recipe-repeat": ("docs/records/full_recipe_repeat.csv", repeated),
    "full-recipe-rules": ("docs/records/full_recipe_rules.csv", repeated),
    "full-recipe-categories": ("docs/records/full_recipe_categories.csv", categories),
    "off-domain-rules": ("docs/records/off_domain_rules.csv", repeated),
    "off-domain-data": ("docs/records/off_domain_data.csv", repeated),
    "llama-cpp-build": ("docs/records/llama_cpp_build.csv", engine_builds),
    "llama-cpp-eagle3": ("docs/records/llama_cpp_eagle3.csv", engines),
    "llama-cpp-block-drafters": ("docs/records/llama_cpp_block_drafters.csv", engines),
    "data-scaling": ("docs/study_cells.csv", study_grid),
    "data-scaling-baselines": ("docs/study_cells.csv", study_baselines),
}


# figure -> (record, title): drawn by plot_leaderboard from the record's latest full scoring
FIGURES: dict[str, tuple[str, str]] = {
    "docs/leaderboard.svg": ("docs/records/demo.csv", "speclab leaderboard: demo"),
}


def drawn(figure: str, root: Path) -> str:
    record, title = FIGURES[figure]
    return plot_leaderboard.svg(plot_leaderboard.leaderboard_of_record(root / record), title)


def rendered(name: str, root: Path) -> str:
    record, draw = TABLES[name]
    return draw(read_record(root / record)).rstrip("\n") + "\n"


def render_page(text: str, root: Path) -> str:
    def block(m: re.Match) -> str:
        if m["name"] not in TABLES:
            raise SystemExit(f"unknown generated table {m['name']!r}; known: {', '.join(TABLES)}")
        return m.group(1) + rendered(m["name"], root) + m.group(4)

    return BLOCK.sub(block, text)


def stale_blocks(root: Path) -> list[str]:
    """'page: table' for each generated block whose text is not what `render` writes."""
    stale = []
    for page in PAGES:
        text = (root / page).read_text()
        for m in BLOCK.finditer(text):
            if m["body"] != rendered(m["name"], root):
                stale.append(f"{page}: {m['name']}")
    for figure in FIGURES:
        path = root / figure
        if not path.exists() or path.read_text() != drawn(figure, root):
            stale.append(figure)
    return stale


# --- writing a record from a runs folder -----------------------------------------------------


def this_machine() -> dict:
    """The record columns naming where and when a figure is recorded: machine, cpu_flags, date."""
    from speclab.kernels.native import PATH_FLAGS, cpu_info, machine_label  # the machine the record is written on

    model, flags = cpu_info()
    return {"machine": machine_label(model, os.cpu_count()),
            "cpu_flags": " ".join(f for f in PATH_FLAGS if f in flags), "date": datetime.date.today().isoformat()}


def record_path(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path:
    """docs/records/NAME.csv, NAME checked: it becomes a file name."""
    if not re.fullmatch(r"[\w-]+", args.name):
        parser.error(f"--name {args.name!r}: letters, digits, '-' and '_' only")
    return args.root / "docs" / "records" / f"{args.name}.csv"


def record_rows(runs_dir: Path, scoring: str, command: str) -> list[dict]:
    """One scoring of every run in runs_dir, in the runs table's order, on this machine."""
    where = this_machine()
    rows = load_rows(runs_dir)
    baseline = best_baseline(rows)
    out = []
    for row in sort_by_speedup(rows):
        result = row.get("result") or {}
        ci = (result.get("ci") or {}).get("speedup_total") or [None, None]
        out.append({
            "scoring": scoring, "run": row["run_dir"], "family": row.get("family") or "",
            "params": format_params(row.get("params")), "acceptance_length": _fixed(row.get("acceptance_length")),
            "per_position": format_per_position(row.get("per_position")),
            "spec_tok_s": _fixed(row.get("spec_tok_s"), 1),
            "baseline_tok_s": _fixed(row.get("baseline_tok_s"), 1), "speedup": _fixed(row.get("speedup")),
            "ci_low": _fixed(ci[0]), "ci_high": _fixed(ci[1]), "method": format_method(row),
            "lossless": format_lossless(row), "status": row.get("status") or "", "note": note(row, baseline),
            **where, "dtype": (result.get("target") or {}).get("dtype") or "", "command": command,
        })
    return out


def _fixed(value, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def append_record(path: Path, rows: list[dict], replace: bool = False, columns: tuple = RUN_COLUMNS) -> None:
    new = replace or not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w" if new else "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def bench_rows(report: dict, command: str, where: dict) -> list[dict]:
    """A `speclab bench --repeat N` report as N scorings of each method, in RUN_COLUMNS (the
    `medians` table draws them); the first scoring carries the full row's interval and lossless
    check. Every value is formatted from a number or one of the known standings, never evaluated."""
    config = report.get("config") or {}
    dtype = str(config.get("dtype") or (config.get("target_config") or {}).get("dtype") or "")  # the resolved one
    rows = []
    for name, found in report["repeats"].items():
        first = report["overall"][name]
        lo, hi = first["ci"]["speedup_total"]
        lossless = first["lossless"]
        for i, value in enumerate(found["values"]):
            standing = found["standings"][i]
            rows.append({
                "scoring": f"bench scoring {i + 1}", "run": name, "family": "", "params": "",
                "acceptance_length": f"{float(found['acceptance_lengths'][i]):.2f}", "per_position": "",
                "spec_tok_s": "", "baseline_tok_s": "", "speedup": f"{float(value):.2f}",
                "ci_low": f"{float(lo):.2f}" if i == 0 else "", "ci_high": f"{float(hi):.2f}" if i == 0 else "",
                "method": "",
                "lossless": f"{lossless['checked_prompts'] - lossless['mismatches']}/{lossless['checked_prompts']}",
                "status": "completed", "note": standing if standing in ("leader", "tied") else "",
                **where, "dtype": dtype, "command": command})
    return rows


def record_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import json

    path = record_path(args, parser)
    report = json.loads(args.json.read_text())
    if not report.get("repeats"):
        parser.error(f"{args.json} holds one scoring: run the bench with --repeat 3 (or more)")
    rows = bench_rows(report, args.command, this_machine())
    append_record(path, rows, replace=True)
    print(f"{path}: {len(rows)} rows written; now run `render`")
    return 0


def record_build(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """build.json is data: each field is formatted from a number or a string, never evaluated."""
    import json

    path = record_path(args, parser)
    info = json.loads((args.entry / "build.json").read_text())
    row = {"version": str(info["version"]), "tools": " ".join(str(t) for t in info["tools"]),
           "jobs": str(int(info["jobs"])), "seconds": f"{float(info['seconds']):.1f}",
           "bin_mb": f"{int(info['bin_bytes']) / 1e6:.1f}", "src_mb": f"{int(info['src_bytes']) / 1e6:.1f}",
           **this_machine(), "command": args.command}
    append_record(path, [row], columns=BUILD_COLUMNS)
    print(f"{path}: a build appended; now run `render`")
    return 0


def record_engine(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import json

    from .engines.llama_cpp_bench import ENGINE_COLUMNS, record_rows as engine_rows

    path = record_path(args, parser)
    where = this_machine()
    rows = [{"bench": str(i + 1), **row} for i, report in enumerate(args.json)
            for row in engine_rows(json.loads(report.read_text()), args.command, where)]
    append_record(path, rows, replace=True, columns=("bench", *ENGINE_COLUMNS))
    print(f"{path}: {len(rows)} rows written; now run `render`")
    return 0


def record_runtime(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """A runtime_bench report (`--json`) as one row of a record, named by the machine the report
    was timed on, not the one recording it: the report is data, read as numbers and strings."""
    import json

    from speclab.eval.runtime_bench import RECORD_COLUMNS, record_row

    path = record_path(args, parser)
    try:
        row = record_row(json.loads(args.json.read_text()), args.dtype, args.command)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"{args.json}: not a runtime_bench report with {args.dtype} figures and its machine ({exc})")
    append_record(path, [row], columns=RECORD_COLUMNS)
    print(f"{path}: a row appended; now run `render`")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speclab.sweeps.report", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    render = sub.add_parser("render", help="rewrite every generated table from its record")
    render.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table differs")
    render.add_argument("--root", type=Path, default=Path("."), help="the repository (default: here)")
    record = sub.add_parser("record", help="append a runs folder's results to a record as one scoring")
    record.add_argument("--runs", type=Path, required=True)
    record.add_argument("--name", required=True, help="the record: docs/records/NAME.csv")
    record.add_argument("--scoring", default=None, help="this scoring's name (default: the date and time)")
    record.add_argument("--command", default="make demo", help="the command that made the runs")
    record.add_argument("--replace", action="store_true", help="start the record over with this scoring")
    record.add_argument("--root", type=Path, default=Path("."))
    engine = sub.add_parser("record-engine",
                            help="write a `speclab bench --engine llama.cpp --json` report as a record")
    engine.add_argument("--json", type=Path, required=True, action="append",
                        help="the bench's report (repeatable: one bench process each)")
    engine.add_argument("--name", required=True, help="the record: docs/records/NAME.csv (replaced)")
    engine.add_argument("--command", required=True, help="the bench command that wrote the report")
    engine.add_argument("--root", type=Path, default=Path("."))
    bench = sub.add_parser("record-bench", help="write a `speclab bench --repeat N --json` report as N scorings")
    bench.add_argument("--json", type=Path, required=True, help="the bench's report")
    bench.add_argument("--name", required=True, help="the record: docs/records/NAME.csv (replaced)")
    bench.add_argument("--command", required=True, help="the bench command that wrote the report")
    bench.add_argument("--root", type=Path, default=Path("."))
    build = sub.add_parser("record-build", help="append a llama.cpp build (its cache entry's build.json) to a record")
    build.add_argument("--entry", type=Path, required=True, help="the engine's cache entry (speclab engine status)")
    build.add_argument("--name", default="llama_cpp_build", help="the record: docs/records/NAME.csv (appended)")
    build.add_argument("--command", required=True, help="the command that built it")
    build.add_argument("--root", type=Path, default=Path("."))
    runtime_ = sub.add_parser("record-runtime", help="append a `python -m speclab.eval.runtime_bench --json` report "
                                                      "to a record")
    runtime_.add_argument("--json", type=Path, required=True, help="the runtime bench's report")
    runtime_.add_argument("--dtype", default="bf16", help="which of the report's dtypes (default: bf16)")
    runtime_.add_argument("--name", default="runtime", help="the record: docs/records/NAME.csv (appended)")
    runtime_.add_argument("--command", required=True, help="the command that wrote the report")
    runtime_.add_argument("--root", type=Path, default=Path("."))
    args = parser.parse_args(argv)

    if args.action == "record-runtime":
        return record_runtime(args, parser)
    if args.action == "record-build":
        return record_build(args, parser)
    if args.action == "record-bench":
        return record_bench(args, parser)
    if args.action == "record-engine":
        return record_engine(args, parser)

    if args.action == "record":
        path = record_path(args, parser)
        scoring = args.scoring or datetime.datetime.now().strftime("%Y-%m-%dT%H:%M")
        rows = record_rows(args.runs, scoring, args.command)
        append_record(path, rows, replace=args.replace)
        done = "written" if args.replace else "appended"
        print(f"{path}: {len(rows)} rows {done} as scoring {scoring!r}; now run `render`")
        return 0
    if args.check:
        stale = stale_blocks(args.root)
        for line in stale:
            print(f"{line}: differs from its record (edited by hand?); run `python -m speclab.sweeps.report render`")
        return 1 if stale else 0
    for page in PAGES:
        path = args.root / page
        text = path.read_text()
        new = render_page(text, args.root)
        if new != text:
            path.write_text(new)
            print(f"{page}: rewritten")
    for figure in FIGURES:
        path = args.root / figure
        picture = drawn(figure, args.root)
        if not path.exists() or path.read_text() != picture:
            path.write_text(picture)
            print(f"{figure}: drawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
