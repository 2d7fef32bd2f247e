"""`speclab bench`: side-by-side throughput against peers, one process, one target.

    speclab bench --speculator RUN_OR_CKPT [--speculator ...] [--assistant DRAFT_LM_CKPT]
                  [--prompts FILE ...] [--set NAME ...] [--heldout FILE_OR_DATA_DIR] [--humaneval] [--limit N]
                  [--max-new-tokens N] [--k K] [--tree static|dynamic|union ...]
                  [--temperature T --top-p P --top-k K --seed S] [--repeat N] [--json OUT] [target.KEY=VALUE ...]

Methods, alternated prompt by prompt on the same prompts and max new tokens: the project's
plain decoding (the baseline), transformers' `generate`, transformers' assisted generation
with the `--assistant` draft_lm, transformers' prompt-lookup decoding, and the project's
speculative decoding (chain of k, and each `--tree` shape with budget = k, i.e. the same
number of verified tokens) for every speculator given (the assistant included). The target is
the one the first checkpoint recorded, with target.KEY=VALUE overrides.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from .results import find_speculator_checkpoint, write_json_atomic
from .table import format_lossless, format_number

SETS_HELP = "HumanEval prompts (the default set when no other is given)"


def add_parser(commands) -> argparse.ArgumentParser:
    bench = commands.add_parser("bench", help="side-by-side throughput against peers, one process")
    bench.add_argument("--speculator", action="append", type=Path, default=[], metavar="DIR",
                       help="a speculator checkpoint or run directory (repeatable)")
    bench.add_argument("--assistant", type=Path, default=None, metavar="DIR",
                       help="a draft_lm checkpoint: transformers' assisted generation drafts with it")
    bench.add_argument("--prompts", action="append", type=Path, default=[], metavar="FILE",
                       help="a prompts JSONL (repeatable; per-category results when lines have \"category\")")
    bench.add_argument("--heldout", type=Path, default=None, metavar="PATH",
                       help="the held-out split of the training data: heldout.jsonl or its data cache directory")
    bench.add_argument("--humaneval", action="store_true", help=SETS_HELP)
    bench.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME",
                       help="a built-in prompt set (repeatable; eval/task_sets.py): general, long_context, math, "
                            "chat, tasks")
    bench.add_argument("--limit", type=int, default=None, help="at most this many prompts per set")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt, every method")
    bench.add_argument("--k", type=int, default=4, help="draft tokens per step (chain), the tree budget too")
    bench.add_argument("--tree", action="append", choices=("static", "dynamic", "union"), default=[],
                       help="also decode with a draft tree of this shape (repeatable; union: the trie "
                            "of the speculator's candidate chains, e.g. a hybrid's two parts)")
    bench.add_argument("--tree-depth", type=int, default=None, help="tree depth (default: k)")
    bench.add_argument("--tree-top-k", type=int, default=4, help="children per expanded tree node")
    bench.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: seeded sampling")
    bench.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    bench.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: off)")
    bench.add_argument("--seed", type=int, default=0, help="seed of every sampled run")
    bench.add_argument("--drafts", choices=("argmax", "sample"), default="argmax",
                       help="sampling only: chain drafts by argmax (q one-hot) or drawn from the draft's distribution")
    bench.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    bench.add_argument("--repeat", type=int, default=1, metavar="N",
                       help="score N times in this process: each method's median speedup and the range of the N")
    bench.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the intervals")
    bench.add_argument("--json", dest="json_out", type=Path, default=None, metavar="OUT", help="write the report here")
    bench.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                       help="tokenize raw prompt text instead of rendering the tokenizer's chat template")
    bench.add_argument("--no-peers", dest="peers", action="store_false",
                       help="skip transformers' generate and prompt lookup (the assistant's peer stays): "
                            "on a CPU they take most of a bench's time")
    bench.add_argument("--engine", choices=("speclab", "llama.cpp"), default="speclab",
                       help="llama.cpp: one exported draft decoded by speclab and by llama.cpp (with llama.cpp's "
                            "plain decoding and its n-gram drafters) on the same prompts (engines/llama_cpp_bench.py; "
                            "the CLI sends it there)")
    bench.add_argument("overrides", nargs="*", help="target.KEY=VALUE changes to the recorded target")
    return bench


def check_args(args: argparse.Namespace) -> None:
    if not args.speculator and args.assistant is None:
        raise ValueError("bench needs at least one --speculator or an --assistant (their checkpoint names the target)")
    # A shell's brace list after one --speculator lands its other directories among the overrides.
    paths = [o for o in args.overrides if Path(o).exists()]
    if paths:
        raise ValueError(f"{paths} are paths, not target.KEY=VALUE changes: give each speculator its own --speculator")
    for option, value in (("--k", args.k), ("--max-new-tokens", args.max_new_tokens), ("--limit", args.limit),
                          ("--repeat", args.repeat),
                          ("--tree-depth", args.tree_depth), ("--tree-top-k", args.tree_top_k)):
        if value is not None and value < 1:
            raise ValueError(f"{option} must be at least 1, got {value}")
    if args.json_out and not args.json_out.parent.is_dir():
        raise FileNotFoundError(f"--json {args.json_out}: directory {args.json_out.parent} does not exist")


def prompt_sets(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Set name -> prompt items, each cut to --limit."""
    from speclab.eval.prompts import humaneval_prompts, load_prompts
    from speclab.eval.task_sets import builtin_set

    sets: dict[str, list[dict]] = {}
    if args.humaneval or not (args.prompts or args.heldout or args.sets):
        sets["humaneval"] = humaneval_prompts(args.limit)
    for name in args.sets:
        sets[name] = builtin_set(name, args.limit)
    if args.heldout:
        path = args.heldout / "heldout.jsonl" if args.heldout.is_dir() else args.heldout
        sets["heldout"] = load_prompts(path)[: args.limit]
    for path in args.prompts:
        sets[path.stem] = load_prompts(path)[: args.limit]
    return sets


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from speclab.eval.prompts import encode_prompt
    from speclab.eval.sampling import SamplingConfig
    from speclab.speculator.base import TargetInfo
    from speclab.speculator.families import load_speculator

    from .doctor import prepare_machine
    from .errors import user_errors
    from .target_spec import recorded_target

    with user_errors():  # everything a user can get wrong fails here, before the timing starts
        check_args(args)
        sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed, args.drafts)
        checkpoints = [find_speculator_checkpoint(p) for p in args.speculator]
        assistant_dir = find_speculator_checkpoint(args.assistant) if args.assistant else None
        target_spec = recorded_target((checkpoints or [assistant_dir])[0], args.overrides)  # plain data
        target_config = target_spec.as_config()
        sets = prompt_sets(args)
        if args.threads:
            torch.set_num_threads(args.threads)
        prepare_machine(target_config)  # what the target's build reads, measured where not recorded
        target = target_spec.build()
        info = TargetInfo.of(target)
        speculators = {}
        for path in checkpoints + ([assistant_dir] if assistant_dir and assistant_dir not in checkpoints else []):
            spec = load_speculator(path, info).to(device=target.device, dtype=target.compute_dtype).eval()
            speculators[_unique(_label(path, spec.family), speculators)] = (path, spec)
        if assistant_dir is not None and speculators[_name_of(assistant_dir, speculators)][1].family != "draft_lm":
            raise ValueError(f"--assistant {args.assistant} is not a draft_lm checkpoint")
        items = [item for prompts in sets.values() for item in prompts]
        encoded = [encode_prompt(target.tokenizer, item, chat_template=args.chat_template).to(target.device)
                   for item in items]
    methods, ks = build_methods(target, speculators, assistant_dir, args, sampling)
    report = run_bench(methods, ks, encoded, items, sets, sampling, args.resamples)
    if args.repeat > 1:  # the tables stay the first scoring's; `repeats` holds every scoring's speedups
        again = [run_bench(methods, ks, encoded, items, sets, sampling, args.resamples) for _ in range(args.repeat - 1)]
        report["repeats"] = repeats([report, *again])
    report["config"] = {
        # dtype: the weights', what `dtype: auto` chose; runtime: what decoded them, e.g.
        # lean/native/widened, the kernel path included (its bits and speed differ per path)
        "target_config": target_config, "dtype": str(target.dtype).removeprefix("torch."), "runtime": target.runtime,
        "speculators": {n: str(p) for n, (p, _) in speculators.items()},
        "assistant": str(assistant_dir) if assistant_dir else None, "k": args.k, "tree": args.tree,
        "tree_depth": args.tree_depth or args.k, "tree_top_k": args.tree_top_k, "max_new_tokens": args.max_new_tokens,
        "sampling": vars(sampling), "threads": torch.get_num_threads(), "limit": args.limit,
        "sets": {name: len(prompts) for name, prompts in sets.items()}, "repeat": args.repeat,
    }
    print(format_report(report))
    if args.json_out:
        write_json_atomic(args.json_out, report)
    return 0


def build_methods(target, speculators: dict, assistant_dir: Path | None, args, sampling):
    """Method name -> callable(prompt, max_new=None) -> Generation, and each speculative method's k."""
    from speclab.eval.assisted import assistant_model
    from speclab.eval.engine import generate_plain, generate_speculative
    from speclab.eval.peers import hf_method
    from speclab.eval.tree import TreeConfig, generate_tree

    max_new = args.max_new_tokens
    methods = {"plain": lambda p, n=None: generate_plain(target, p, n or max_new, sampling=sampling)}
    if args.peers:
        methods["hf_generate"] = hf_method(target, max_new, sampling)
        methods["hf_prompt_lookup"] = hf_method(target, max_new, sampling, prompt_lookup_num_tokens=args.k)
    ks = {}
    if assistant_dir is not None:
        draft = speculators[_name_of(assistant_dir, speculators)][1]
        methods["hf_assisted"] = hf_method(target, max_new, sampling,
                                           assistant_model=assistant_model(draft, target.model, args.k))
    for name, (_, spec) in speculators.items():
        k = min(args.k, spec.max_draft_len() or args.k)
        methods[f"spec_{name}"] = OwnSpeculator(spec, target.dtype, lambda s, p, n, k=k:
                                                generate_speculative(target, s, p, n or max_new, k, sampling=sampling))
        ks[f"spec_{name}"] = k
        for shape in args.tree:
            cfg = TreeConfig(shape, min(args.tree_depth or args.k, spec.max_draft_len() or 1 << 30),
                             args.tree_top_k, args.k)
            methods[f"tree_{shape}_{name}"] = OwnSpeculator(copy.deepcopy(spec), target.dtype, lambda s, p, n, c=cfg:
                                                            generate_tree(target, s, p, n or max_new, c, sampling=sampling))
            ks[f"tree_{shape}_{name}"] = cfg.depth
    return methods, ks


class OwnSpeculator:
    """A speculative method with a speculator of its own. Methods alternate prompt by prompt,
    so a drafter that remembers what it decoded (suffix's eval history) would otherwise draft
    one method's prompt from another method's output of that very prompt."""

    def __init__(self, speculator, weight_dtype, decode):
        self.speculator, self.weight_dtype, self.decode = speculator, weight_dtype, decode

    def __call__(self, prompt, max_new=None):
        from speclab.speculator.fast_linear import native_drafting  # bench imports torch only once it runs

        # Drafting through the native GEMM where it builds, as a run's own scoring does (eval/benchmark.score).
        with native_drafting(self.speculator, self.weight_dtype):
            return self.decode(self.speculator, prompt, max_new)

    def reset(self) -> None:
        self.speculator.reset()


def run_bench(methods, ks, encoded, items, sets, sampling, resamples: int) -> dict:
    from speclab.eval.peers import compare, summarise

    exact = sampling.mode == "greedy"
    runs = compare(methods, encoded)
    report = {"overall": summarise(runs, exact=exact, ks=ks, resamples=resamples), "sets": {}}
    start = 0
    for name, prompts in sets.items():
        indices = list(range(start, start + len(prompts)))
        start += len(prompts)
        categories: dict[str, list[int]] = {}
        for i in indices:
            categories.setdefault(items[i].get("category") or name, []).append(i)
        report["sets"][name] = {
            "methods": summarise(runs, exact=exact, ks=ks, indices=indices, resamples=resamples),
            "categories": {c: summarise(runs, exact=exact, ks=ks, indices=idx, resamples=resamples)
                           for c, idx in categories.items() if len(categories) > 1},
        }
    return report


def repeats(reports: list[dict]) -> dict:
    """Per method, its overall speedup in each scoring: median and range (eval/paired.py), with
    each scoring's acceptance length and standing (leader, tied with it, or neither)."""
    from speclab.eval.paired import median_and_range

    return {name: {**median_and_range([r["overall"][name]["speedup_total"] for r in reports]),
                   "acceptance_lengths": [r["overall"][name]["acceptance_length"] for r in reports],
                   "standings": [standing(r["overall"][name]) for r in reports]}
            for name in reports[0]["overall"]}


def standing(row: dict) -> str:
    """'leader', 'tied' (the paired interval does not separate it from the leader) or ''."""
    return "leader" if row.get("leader") else "tied" if row.get("tied_with_leader") else ""


def format_report(report: dict) -> str:
    lines = []
    cfg = report.get("config", {})
    sampling = cfg.get("sampling", {})
    lines.append(f"speclab bench: k={cfg.get('k')}, max_new_tokens={cfg.get('max_new_tokens')}, "
                 f"temperature={sampling.get('temperature')}, threads={cfg.get('threads')}, sets={cfg.get('sets')}")
    blocks = [("overall", report["overall"])]
    for name, found in report["sets"].items():  # each set, then its categories where its lines name several
        blocks += [(f"set {name}", found["methods"])]
        blocks += [(f"set {name}, category {c}", methods) for c, methods in found.get("categories", {}).items()]
    for title, methods in blocks:
        lines.append(f"\n{title}")
        lines.append(f"{'method':<28} {'tok/s':>7} {'95% CI':>15} {'speedup':>8} {'95% CI':>13} "
                     f"{'specbench':>9} {'acc len':>7} {'effic.':>6} {'draft ms/tok':>12} {'lossless':>8} vs leader")
        for name, row in methods.items():
            ci = row["ci"]
            draft_ms = (row.get("timing") or {}).get("draft_ms_per_token")
            lines.append(
                f"{name:<28} {row['tok_s']:>7.1f} {_interval(ci['tok_s'], '.1f'):>15} "
                f"{row['speedup_total']:>7.2f}x {_interval(ci['speedup_total'], '.2f'):>13} "
                f"{row['speedup_specbench']:>8.2f}x {row['acceptance_length']:>7.2f} {row['efficiency']:>6.2f} "
                f"{format_number(draft_ms, '.3f'):>12} {format_lossless(row['lossless']):>8} {standing(row)}".rstrip())
    if report.get("repeats"):
        runs = len(next(iter(report["repeats"].values()))["values"])
        lines.append(f"\noverall speedup over {runs} scorings in this process: median (range)")
        for name, found in report["repeats"].items():
            lo, hi = found["interval"]
            lines.append(f"{name:<28} {found['median']:>7.2f}x ({lo:.2f}-{hi:.2f})")
    return "\n".join(lines)


def _interval(pair, fmt: str) -> str:
    return f"[{format(pair[0], fmt)}, {format(pair[1], fmt)}]"


def _label(checkpoint: Path, family: str) -> str:
    """A sweep's baseline run (`baseline-suffix/`) is named as one, so that it is not read as
    the run of the same family beside it (suffix_corpus is a `suffix` too)."""
    run = next((p.name for p in (checkpoint, *checkpoint.parents) if p.name.startswith("baseline-")), None)
    return f"baseline_{family}" if run else family


def _unique(name: str, taken: dict) -> str:
    """name, or name_2, name_3, ... (a family's name may end in a digit: dflash2_2 is dflash2's second run)."""
    candidate, i = name, 2
    while candidate in taken:
        candidate, i = f"{name}_{i}", i + 1
    return candidate


def _name_of(path: Path, speculators: dict) -> str:
    return next(name for name, (p, _) in speculators.items() if p == path)
