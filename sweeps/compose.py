"""`speclab hybrid`: a hybrid speculator put together from two runs, without training.

    speclab hybrid --learned RUN_OR_CKPT --suffix RUN_OR_CKPT --out DIR [--min-match N] [--learned-k K]

The learned part is a run of any learned family (dflash2 took half an hour an epoch on a million
tokens here); the suffix part is a `suffix_corpus` run, whose corpus is its training answers.
Either may be a hybrid run instead, which gives its part of that name: `--learned H --suffix H`
is hybrid H with another rule (`--min-match`, `--learned-k`), tried without training it again.
The result is a speculator checkpoint like a run's (`config.json` + `model.safetensors`),
which `speclab eval`, `speclab bench` and the export layouts read as they read a hybrid that
trained (speculator/hybrid.py, `compose`, says why the two are the same thing).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from .checkpoint_meta import checkpoint_meta
from .results import find_speculator_checkpoint
from .target_spec import recorded_target


def add_parser(commands) -> argparse.ArgumentParser:
    hybrid = commands.add_parser("hybrid", help="a hybrid of a learned run and a suffix_corpus run, no training")
    hybrid.add_argument("--learned", required=True, type=Path, metavar="DIR",
                        help="run or checkpoint of a learned family, or of a hybrid (its learned part)")
    hybrid.add_argument("--suffix", required=True, type=Path, metavar="DIR",
                        help="run or checkpoint of a suffix drafter (suffix_corpus: with its corpus), or of a "
                             "hybrid (its suffix part)")
    hybrid.add_argument("--out", required=True, type=Path, help="the new checkpoint's directory (must not exist)")
    # Their defaults are HybridConfig's, read when the command runs (the parser imports no torch).
    hybrid.add_argument("--min-match", type=int, default=None,
                        help="suffix drafts a step when its match is this long (the hybrid's rule; default 4)")
    hybrid.add_argument("--learned-k", type=int, default=None,
                        help="union trees: the longest chain the learned part drafts beside suffix's (default 2)")
    return hybrid


def cmd_hybrid(args: argparse.Namespace) -> int:
    from speclab.speculator.base import TargetInfo
    from speclab.speculator.hybrid import HybridConfig, compose

    from .doctor import prepare_machine
    from .errors import user_errors
    from .export_formats import load_checkpoint

    min_match = HybridConfig.min_match if args.min_match is None else args.min_match
    learned_k = HybridConfig.learned_k if args.learned_k is None else args.learned_k
    with user_errors():
        if args.out.exists():
            raise FileExistsError(f"--out {args.out} exists: give a new directory")
        learned_dir, suffix_dir = find_speculator_checkpoint(args.learned), find_speculator_checkpoint(args.suffix)
        spec = recorded_target(learned_dir)
        if recorded_target(suffix_dir).as_config() != spec.as_config():
            raise ValueError(f"{learned_dir} and {suffix_dir} record different targets: a hybrid drafts for one")
        prepare_machine(spec.as_config())
        target = TargetInfo.of(spec.build())  # families that draft through its embedding or head read it
        hybrid = compose(part(load_checkpoint(learned_dir, target), "learned"),
                         part(load_checkpoint(suffix_dir, target), "suffix"), min_match, learned_k)
        partial = args.out.with_name(args.out.name + ".partial")  # a failed write leaves no checkpoint
        shutil.rmtree(partial, ignore_errors=True)
        hybrid.save(partial, extra={"target_config": checkpoint_meta(learned_dir)["target_config"],
                                    "composed_of": {"learned": str(learned_dir), "suffix": str(suffix_dir)}})
        partial.rename(args.out)
    corpus = hybrid.suffix  # its buffers, not its trie (seconds to build, and nothing needs it here)
    print(f"hybrid of {hybrid.learned.family} ({hybrid.learned.num_params() / 1e6:.2f}M parameters) and suffix "
          f"(corpus of {len(corpus.corpus_offsets) - 1} answers, {corpus.corpus_ids.numel()} tokens), min_match "
          f"{min_match}, learned_k {learned_k}: {args.out}")
    print(f"score it: speclab eval {args.out}  |  speclab bench --speculator {args.out} --tree union")
    return 0


def part(speculator, name: str):
    """A hybrid's part called `name` (learned or suffix); any other speculator as it is."""
    return getattr(speculator, name) if speculator.family == "hybrid" else speculator
