"""The lossless gate: tells a numerical tie from a bug at the first divergence.

Greedy speculative decoding must reproduce plain greedy decoding. Where the target's
numerics depend on how many tokens a pass holds (transformers in bf16: a 1-token step and
a k-token verification round differently), two near-equal top logits can swap, and both
outputs are then correct greedy decodings of the model up to its rounding. So at the first
position where the two outputs differ, the target's logits for the common prefix are
recomputed in fp32 (the same weights, fp32 arithmetic) and the two tokens' logits compared:
within `tie_tolerance` of each other it is a numerical tie (counted, reported, the run
passes); farther apart it is a mismatch (the run fails). A wrong acceptance rule commits
tokens the target does not rank near the top, so its gaps are far beyond any tolerance.

Tolerances (logit units, measured on SmolLM2, whose logits reach ~35):
- fp32 arithmetic (the lean runtime in either weight dtype, transformers in fp32): the
  same logit computed by differently blocked fp32 passes moves by up to ~1e-4; 1e-3 leaves
  a 10x margin.
- bf16 or fp16 arithmetic (transformers in bf16): bf16 keeps 8 significant bits; a logit
  moved by up to 0.375 between a 1-token step and a 5-token pass (measured). Two logits
  moving in opposite directions can swap when their fp32 gap is below 2 x 0.375 = 0.75;
  1.0 covers that, and stays below the gap of a wrongly accepted token (several logits).
"""

from __future__ import annotations

import copy

import torch

FP32_TOLERANCE, HALF_TOLERANCE = 1e-3, 1.0


def tie_tolerance(target) -> float:
    """The tie tolerance for the arithmetic this target's passes run in."""
    fp32_math = target.lean is not None or target.dtype == torch.float32
    return FP32_TOLERANCE if fp32_math else HALF_TOLERANCE


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (one ending early counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def fp32_logits(target, ids: torch.Tensor) -> torch.Tensor:
    """[V] fp32 logits after ids [1, T], the target's weights in fp32 arithmetic."""
    reference = getattr(target, "_fp32_reference", None)
    if reference is None:
        model = target.model
        reference = model if model.dtype == torch.float32 else copy.deepcopy(model).float()
        target._fp32_reference = reference  # kept: ties cluster on the same target
    with torch.no_grad():
        return reference(ids.to(target.device)).logits[0, -1].float()


def classify(target, prompt: torch.Tensor, plain: list[int], speculative: list[int]) -> dict:
    """{"verdict": "equal" | "tie" | "mismatch", ...} for one prompt's two greedy outputs."""
    at = first_divergence(plain, speculative)
    if at is None:
        return {"verdict": "equal"}
    if at >= min(len(plain), len(speculative)):  # one stopped early with the same prefix
        return {"verdict": "mismatch", "position": at, "reason": "one output ends early"}
    prefix = torch.cat([prompt.cpu(), torch.tensor([plain[:at]], dtype=torch.long)], dim=1)
    logits = fp32_logits(target, prefix)
    a, b = plain[at], speculative[at]
    gap, tolerance = abs(float(logits[a] - logits[b])), tie_tolerance(target)
    top2 = logits.topk(2).values
    return {"verdict": "tie" if gap <= tolerance else "mismatch", "position": at, "tokens": [a, b],
            "gap": gap, "tolerance": tolerance, "top2_gap": float(top2[0] - top2[1])}
