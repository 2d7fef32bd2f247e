"""Evaluation: plain, chain and tree speculative decoding (greedy or sampled), acceptance
metrics in every convention, peers, prompts, and scoring."""

from .benchmark import hf_generate_tok_s, score
from .engine import Generation, effective_draft_len, generate_plain, generate_speculative
from .metrics import AcceptanceStats, RequestRecord, acceptance_conventions, bootstrap_ci, speedups, timing
from .prompts import encode_prompt, humaneval_prompts, load_prompts
from .sampling import SamplingConfig, TokenChooser
from .tree import TreeConfig, draft_tree, generate_tree

__all__ = [
    "AcceptanceStats",
    "Generation",
    "RequestRecord",
    "SamplingConfig",
    "TokenChooser",
    "TreeConfig",
    "acceptance_conventions",
    "bootstrap_ci",
    "draft_tree",
    "effective_draft_len",
    "encode_prompt",
    "generate_plain",
    "generate_speculative",
    "generate_tree",
    "hf_generate_tok_s",
    "humaneval_prompts",
    "load_prompts",
    "score",
    "speedups",
    "timing",
]
