"""How much of what a run is scored on it has already seen: token overlap between its
training answers (a corpus, or self-distilled data) and each eval prompt and plain output.

Two figures per text, both over token ids:
- `span`: the longest run of consecutive tokens that also occurs, contiguous, in one
  training answer (exact: every candidate is compared token by token). Spans shorter than
  `n` are not looked for and read 0: short runs ("return a + b") are common code, not leaks.
- `ngram`: the share of the text's n-grams (n = 13, the convention of GPT-3's and
  Llama's contamination reports) that occur in some training answer.

A prompt copied into the training answers shows as a long prompt span; a target that
reproduces a training answer for an eval prompt, as a long output span (which speeds a
corpus lookup up for free). The index is a sorted array of 64-bit rolling hashes of every
training n-gram, with the n-gram's position, so a 1M-token corpus costs ~16 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

N = 13
_BASE = np.uint64(1_000_003)  # the rolling hash's base; collisions are resolved by comparing tokens


def _hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """[len - n + 1] uint64 polynomial hashes (wrapping) of every n-gram of `tokens`."""
    windows = np.lib.stride_tricks.sliding_window_view(tokens.astype(np.uint64), n)
    powers = _BASE ** np.arange(n - 1, -1, -1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (windows * powers).sum(axis=1, dtype=np.uint64)


@dataclass
class CorpusIndex:
    tokens: np.ndarray  # every answer concatenated, each followed by -1 (no span crosses answers)
    hashes: np.ndarray  # [M] sorted n-gram hashes
    starts: np.ndarray  # [M] where each n-gram starts in `tokens`
    n: int

    @classmethod
    def build(cls, answers: list[list[int]], n: int = N) -> "CorpusIndex":
        parts = [np.asarray(a + [-1], dtype=np.int64) for a in answers if len(a) >= n]
        tokens = np.concatenate(parts) if parts else np.full(1, -1, dtype=np.int64)
        if len(tokens) < n:
            return cls(tokens, np.empty(0, np.uint64), np.empty(0, np.int64), n)
        hashes = _hashes(tokens, n)
        starts = np.arange(len(hashes))
        keep = ~np.lib.stride_tricks.sliding_window_view(tokens < 0, n).any(axis=1)  # n-grams within one answer
        order = np.argsort(hashes[keep], kind="stable")
        return cls(tokens, hashes[keep][order], starts[keep][order], n)

    def overlap(self, text: list[int]) -> dict:
        """{"span": longest common run (0 below n), "ngram": share of text n-grams seen}."""
        if len(text) < self.n or not len(self.hashes):
            return {"span": 0, "ngram": 0.0}
        t = np.asarray(text, dtype=np.int64)
        h = _hashes(t, self.n)
        lo, hi = np.searchsorted(self.hashes, h, "left"), np.searchsorted(self.hashes, h, "right")
        seen = [self._match_len(t, i, self.starts[a:b]) for i, (a, b) in enumerate(zip(lo, hi))]
        return {"span": max(seen), "ngram": round(sum(s > 0 for s in seen) / len(seen), 4)}

    def _match_len(self, text: np.ndarray, i: int, candidates: np.ndarray) -> int:
        """The longest exact match of text[i:] in the corpus among hash hits (0: none is real)."""
        best = 0
        for start in candidates[:64]:  # a 13-gram repeated more often is boilerplate; its longest run shows in the first
            length = 0
            while i + length < len(text) and self.tokens[start + length] == text[i + length]:
                length += 1  # the -1 after every answer stops the walk
            best = max(best, length if length >= self.n else 0)
        return best


def contamination(answers: list[list[int]], prompts: list[list[int]], outputs: list[list[int]],
                  n: int = N) -> dict:
    """result.json's `contamination` block: per eval prompt its prompt's and plain output's
    figures, and the worst of each over the set."""
    index = CorpusIndex.build(answers, n)
    rows = [{"prompt": index.overlap(p), "output": index.overlap(o)} for p, o in zip(prompts, outputs)]
    worst = {side: {"span": max((r[side]["span"] for r in rows), default=0),
                    "ngram": max((r[side]["ngram"] for r in rows), default=0.0)} for side in ("prompt", "output")}
    return {"n": n, "answers": len(answers), "answer_tokens": int(sum(map(len, answers))), **worst, "per_prompt": rows}


def first_over(report: dict, max_span: int) -> str | None:
    """A one-line reason naming the first prompt whose prompt span exceeds `max_span` tokens."""
    for i, row in enumerate(report["per_prompt"]):
        if row["prompt"]["span"] > max_span:
            return (f"eval prompt {i} shares {row['prompt']['span']} consecutive tokens with the training answers "
                    f"(eval.contamination.max_prompt_span={max_span}): the scored set leaked into training")
    return None
