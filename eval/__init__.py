"""Evaluation: greedy plain and speculative decoding, acceptance metrics, prompts, and scoring."""

from .benchmark import hf_generate_tok_s, score
from .engine import Generation, effective_draft_len, generate_plain, generate_speculative
from .metrics import AcceptanceStats
from .prompts import encode_prompt, humaneval_prompts, load_prompts

__all__ = [
    "AcceptanceStats",
    "Generation",
    "effective_draft_len",
    "encode_prompt",
    "generate_plain",
    "generate_speculative",
    "hf_generate_tok_s",
    "humaneval_prompts",
    "load_prompts",
    "score",
]
