"""score() and the transformers peer on the tiny target."""

import math
from types import SimpleNamespace

import pytest
import torch

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator

import speclab.eval.benchmark as benchmark
from speclab.eval.benchmark import hf_generate_tok_s, score
from speclab.eval.engine import generate_plain, generate_speculative
from speclab.eval.prompts import encode_prompt
from speclab.speculator.target.builders import tiny_llama
from speculator_stubs import NeverSpeculator, OracleSpeculator, scripted

MAX_NEW, K = 8, 3


@pytest.fixture(scope="module")
def prompts(target):
    texts = ["What is the capital of France?", "Explain why the sky is blue."]
    return [encode_prompt(target.tokenizer, {"prompt": t}) for t in texts]


def test_score_oracle(target, prompts):
    speculator = scripted(OracleSpeculator, target, prompts, MAX_NEW + K).train()
    result = score(target, speculator, prompts, MAX_NEW, K, progress=False)
    assert speculator.training  # the caller's mode comes back
    assert result["lossless"] == {"checked_prompts": 2, "mismatches": 0, "ties": 0, "tie_tolerance": 1e-3}
    acceptance = result["acceptance"]
    assert acceptance["k"] == K and acceptance["acceptance_rate"] == 1.0
    # Warm-up drafts are not counted: each prompt takes ceil((MAX_NEW - 1) / (K + 1)) steps.
    assert acceptance["num_drafts"] == 2 * math.ceil((MAX_NEW - 1) / (K + 1))
    throughput = result["throughput"]
    assert throughput["speedup"] == pytest.approx(throughput["spec_tok_s"] / throughput["baseline_tok_s"])
    assert [row["lossless"] for row in result["per_prompt"]] == [True, True]
    assert [row["prompt_tokens"] for row in result["per_prompt"]] == [p.shape[1] for p in prompts]


@pytest.mark.parametrize("dtype, packed", [("fp32", "as loaded"), ("bf16", "bf16")])
def test_score_records_how_the_drafts_ran(dtype, packed):
    from speclab.kernels import native

    target = tiny_llama(dtype=dtype)
    prompt = encode_prompt(target.tokenizer, {"prompt": "Say hi"})
    speculator = build_speculator("mlp", {"n_predict": 2, "inner_dim": 16}, TargetInfo.of(target))  # fp32; tied: 3 linears
    drafting = score(target, speculator, [prompt], 4, 2, progress=False)["drafting"]
    if native.load() is None:  # no C compiler: torch's linears, as loaded
        assert drafting == {"native_linears": 0, "weights": "as loaded"}
    else:
        assert drafting == {"native_linears": 3, "weights": packed}


def test_score_counts_mismatches(target, prompts, monkeypatch):
    real = benchmark.generate_speculative

    def corrupted(*args, **kwargs):
        gen = real(*args, **kwargs)
        gen.tokens[-1] += 1
        return gen

    monkeypatch.setattr(benchmark, "generate_speculative", corrupted)
    speculator = scripted(NeverSpeculator, target, prompts, MAX_NEW + K)
    result = score(target, speculator, prompts, MAX_NEW, K, progress=False)
    assert result["lossless"] == {"checked_prompts": 2, "mismatches": 2, "ties": 0, "tie_tolerance": 1e-3}
    assert [row["lossless"] for row in result["per_prompt"]] == [False, False]
    # The last token is off by one id: the target ranks it far below its own choice.
    assert all(row["divergence"]["verdict"] == "mismatch" and row["divergence"]["gap"] > 1e-3
               for row in result["per_prompt"])


def test_score_reports_the_capped_k(target, prompts):
    speculator = scripted(OracleSpeculator, target, prompts[:1], MAX_NEW + K, max_draft=2)
    result = score(target, speculator, prompts[:1], MAX_NEW, K, progress=False)
    assert result["acceptance"]["k"] == 2 and len(result["acceptance"]["per_position"]) == 2


def test_score_does_not_learn_from_its_warm_up(target, prompts):
    # suffix remembers what it decoded: the untimed warm-up on the first prompt must not
    # hand the scored decode of that prompt its own output
    speculator = build_speculator("suffix", {}, TargetInfo.of(target))
    scored = score(target, speculator, prompts[:1], MAX_NEW, K, progress=False)["acceptance"]
    fresh = generate_speculative(target, build_speculator("suffix", {}, TargetInfo.of(target)), prompts[0], MAX_NEW, K)
    assert scored["num_accepted_tokens"] == sum(fresh.accepted)


def test_score_needs_prompts(target, prompts):
    with pytest.raises(ValueError, match="at least one prompt"):
        score(target, scripted(OracleSpeculator, target, prompts, MAX_NEW + K), [], MAX_NEW, K)


def test_hf_generate_tok_s_counts_generated_tokens(target, prompts, monkeypatch):
    # On a fake clock every generate call lasts 0.5 s, so tok/s = new tokens / (0.5 s per prompt);
    # transformers' greedy tokens are generate_plain's (tested in test_engine).
    ticks = iter(range(1000))
    monkeypatch.setattr(benchmark, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 0.5))
    new_tokens = sum(generate_plain(target, p, 4).new_tokens for p in prompts)
    assert hf_generate_tok_s(target, prompts, 4) == pytest.approx(new_tokens / (0.5 * len(prompts)))


def test_peer_joins_the_rotation_and_reports_its_ratio():
    from speclab.eval.benchmark import score as score_with_peer
    from speclab.speculator.target.builders import tiny_llama

    target = tiny_llama()
    prompts = [torch.tensor([[1, 5, 9, 13]]), torch.tensor([[1, 7, 2]])]
    spec = build_speculator("mlp", {"n_predict": 2, "inner_dim": 8}, TargetInfo.of(target))
    report = score_with_peer(target, spec, prompts, 6, 2, progress=False, peer=True)
    thr = report["throughput"]
    assert thr["hf_generate_tok_s"] > 0
    assert thr["plain_vs_hf"] == pytest.approx(thr["baseline_tok_s"] / thr["hf_generate_tok_s"])
    assert all("hf_generate_tok_s" in row for row in report["per_prompt"])


def test_score_records_each_prompt_for_pairing_and_its_category(target, prompts):
    from speclab.eval.paired import prompt_key

    speculator = scripted(OracleSpeculator, target, prompts, MAX_NEW + K)
    result = score(target, speculator, prompts, MAX_NEW, K, progress=False, categories=["chat", "code"])
    rows = result["per_prompt"]
    assert [r["index"] for r in rows] == [0, 1] and [r["category"] for r in rows] == ["chat", "code"]
    assert [r["key"] for r in rows] == [prompt_key(p[0].tolist()) for p in prompts]
    for r in rows:
        assert r["new_tokens"] / r["plain_seconds"] == pytest.approx(r["baseline_tok_s"])
        assert r["spec_new_tokens"] / r["spec_seconds"] == pytest.approx(r["spec_tok_s"])
    by = result["by_category"]
    assert set(by) == {"chat", "code"} and by["chat"]["prompts"] == 1
    assert by["code"]["speedup"] == pytest.approx(rows[1]["spec_tok_s"] / rows[1]["baseline_tok_s"])
    assert by["code"]["acceptance_rate"] == 1.0  # the oracle's drafts are always accepted
    assert score(target, speculator, prompts, MAX_NEW, K, progress=False)["per_prompt"][0]["category"] == "uncategorized"
    with pytest.raises(ValueError, match="1 categories for 2 prompts"):
        score(target, speculator, prompts, MAX_NEW, K, progress=False, categories=["chat"])
