"""Token overlap between training answers and eval texts: exact spans, n-gram shares, the
one-line refusal."""

from __future__ import annotations

import random

import pytest

from speclab.eval.contamination import CorpusIndex, contamination, first_over


def _longest_common_run(answers: list[list[int]], text: list[int]) -> int:
    """Brute force: the longest text[i:i+L] found contiguous inside one answer."""
    best = 0
    for a in answers:
        for i in range(len(text)):
            for j in range(len(a)):
                length = 0
                while i + length < len(text) and j + length < len(a) and text[i + length] == a[j + length]:
                    length += 1
                best = max(best, length)
    return best


def test_a_prompt_copied_into_an_answer_shows_whole():
    rng = random.Random(0)
    prompt = [rng.randrange(1000) for _ in range(40)]
    answers = [[rng.randrange(1000) for _ in range(30)] + prompt + [7, 7], [rng.randrange(1000) for _ in range(50)]]
    got = CorpusIndex.build(answers).overlap(prompt)
    assert got == {"span": 40, "ngram": 1.0}


def test_unrelated_text_shares_nothing():
    rng = random.Random(1)
    answers = [[rng.randrange(1000) for _ in range(200)] for _ in range(5)]
    assert CorpusIndex.build(answers).overlap([rng.randrange(1000, 2000) for _ in range(60)]) == {"span": 0, "ngram": 0.0}


@pytest.mark.parametrize("seed", range(6))
def test_spans_equal_brute_force_and_never_cross_two_answers(seed):
    """Small vocabularies make many partial matches; a text made of one answer's tail and the
    next one's head must not count as one span."""
    rng = random.Random(seed)
    answers = [[rng.randrange(4) for _ in range(rng.randrange(10, 60))] for _ in range(4)]
    text = answers[0][-20:] + answers[1][:20] + [rng.randrange(4) for _ in range(15)]
    want = _longest_common_run(answers, text)
    got = CorpusIndex.build(answers, n=5).overlap(text)["span"]
    assert got == (want if want >= 5 else 0)


def test_the_report_names_the_worst_prompt_and_output():
    answers = [list(range(100, 160))]
    prompts, outputs = [list(range(100, 120)), list(range(500, 530))], [list(range(140, 160)), list(range(600, 610))]
    report = contamination(answers, prompts, outputs)
    assert report["prompt"] == {"span": 20, "ngram": 1.0} and report["output"] == {"span": 20, "ngram": 1.0}
    assert report["per_prompt"][1] == {"prompt": {"span": 0, "ngram": 0.0}, "output": {"span": 0, "ngram": 0.0}}
    assert report["answer_tokens"] == 60
    assert first_over(report, 19) == ("eval prompt 0 shares 20 consecutive tokens with the training answers "
                                      "(eval.contamination.max_prompt_span=19): the scored set leaked into training")
    assert first_over(report, 20) is None
