"""Plain and speculative greedy decoding on the tiny target, driven by scripted speculators."""

import math

import pytest
import torch

from speclab.eval.engine import generate_plain, generate_speculative
from speclab.eval.metrics import AcceptanceStats
from speclab.speculator.target.builders import tiny_llama
from speculator_stubs import NeverSpeculator, OracleSpeculator, SometimesSpeculator, reference, scripted

MAX_NEW = 20
STUBS = [OracleSpeculator, NeverSpeculator, SometimesSpeculator]


def run_speculative(cls, target, prompt, k, max_new=MAX_NEW, eos_ids=(), max_draft=None):
    """(generation, stats) with a stub that knows enough of the continuation for every draft."""
    speculator = scripted(cls, target, [prompt], max_new + k, max_draft)
    stats = AcceptanceStats(min(k, max_draft or k))
    return generate_speculative(target, speculator, prompt, max_new, k, eos_ids=eos_ids, stats=stats), stats


def test_plain_matches_transformers_generate(target, prompt):
    gen = generate_plain(target, prompt, MAX_NEW)
    hf = target.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                               max_new_tokens=MAX_NEW, eos_token_id=sorted(target.eos_token_ids))
    assert gen.tokens == hf[0, prompt.shape[1]:].tolist()
    assert gen.new_tokens == len(gen.tokens) == gen.steps
    assert gen.seconds > 0


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("cls", STUBS, ids=lambda c: c.family)
def test_speculative_output_equals_plain_output(target, prompt, cls, k):
    plain = generate_plain(target, prompt, MAX_NEW, eos_ids=())
    spec, _ = run_speculative(cls, target, prompt, k)
    assert spec.tokens == plain.tokens
    assert spec.new_tokens == MAX_NEW


@pytest.mark.parametrize("cls", [OracleSpeculator, SometimesSpeculator], ids=lambda c: c.family)
def test_wide_prefills_keep_speculative_output_equal_to_plain(monkeypatch, prompt, cls):
    """Prefills on the wide GEMM (forced from 1 row), verification on the invariant kernels:
    plain and speculative decoding prefill alike, so their outputs stay equal token for token
    and the oracle's drafts, taken from plain decoding, are all accepted."""
    monkeypatch.setenv("SPECLAB_WIDE_GEMM", "1")
    target = tiny_llama(dtype="bf16")
    if not target.lean.wide.used:
        pytest.skip("the torch backend runs here (no native kernels): no wide GEMM to choose")
    plain = generate_plain(target, prompt, MAX_NEW, eos_ids=())
    speculator, stats = scripted(cls, target, [prompt], MAX_NEW + 4), AcceptanceStats(4)
    passes = []  # (new tokens, invariant) of every target pass of the speculative run
    forward = target.lean.forward
    monkeypatch.setattr(target.lean, "forward", lambda ids, *a, invariant=True, **kw: passes.append(
        (ids.shape[1], invariant)) or forward(ids, *a, invariant=invariant, **kw))
    spec = generate_speculative(target, speculator, prompt, MAX_NEW, 4, eos_ids=(), stats=stats)
    assert spec.tokens == plain.tokens
    if cls is OracleSpeculator:
        assert stats.acceptance_rate == 1.0
    # Only the prefill may leave the invariant kernels: a wide verification would not be
    # bit for bit what plain decoding computes (the tiny target's greedy tokens survive
    # that, so the passes are checked themselves).
    assert passes[0] == (prompt.shape[1], False) and len(passes) > 1
    assert all(invariant for _, invariant in passes[1:])


def test_oracle_accepts_every_draft(target, prompt):
    k = 4
    spec, stats = run_speculative(OracleSpeculator, target, prompt, k)
    assert stats.acceptance_rate == 1.0
    assert stats.mean_acceptance_length == k + 1
    assert stats.per_position == [1.0] * k
    # The prefill gives one token, then every step commits k + 1.
    assert stats.num_drafts == math.ceil((MAX_NEW - 1) / (k + 1))
    assert spec.steps == 1 + stats.num_drafts


def test_never_accepts_nothing_and_stays_exact(target, prompt):
    spec, stats = run_speculative(NeverSpeculator, target, prompt, k=3)
    assert stats.num_accepted_tokens == 0
    assert stats.mean_acceptance_length == 1.0
    assert stats.num_drafts == MAX_NEW - 1  # one committed token per step after the prefill's


@pytest.mark.parametrize("k, rate, per_position", [(1, 1.0, [1.0]), (4, 0.25, [1.0, 0.0, 0.0, 0.0])])
def test_sometimes_accepts_up_to_the_first_wrong_position(target, prompt, k, rate, per_position):
    # Right at positions 0, 2, ...: position 1 is always rejected, so only position 0 counts.
    _, stats = run_speculative(SometimesSpeculator, target, prompt, k)
    assert stats.acceptance_rate == rate
    assert stats.per_position == per_position
    assert stats.mean_acceptance_length == 2.0


@pytest.mark.parametrize("max_new", [1, 2, 3])
def test_k_larger_than_the_remaining_tokens(target, prompt, max_new):
    plain = generate_plain(target, prompt, max_new, eos_ids=())
    spec, stats = run_speculative(OracleSpeculator, target, prompt, k=8, max_new=max_new)
    assert spec.tokens == plain.tokens and len(spec.tokens) == max_new
    assert stats.num_drafts == (0 if max_new == 1 else 1)


@pytest.mark.parametrize("cls", STUBS, ids=lambda c: c.family)
def test_stops_after_the_first_eos(target, prompt, cls):
    continuation = reference(target, prompt, MAX_NEW)[prompt.shape[1]:]
    eos = continuation[7]
    first = continuation.index(eos)
    plain = generate_plain(target, prompt, MAX_NEW, eos_ids={eos})
    spec, _ = run_speculative(cls, target, prompt, k=4, eos_ids={eos})
    assert plain.tokens == spec.tokens == continuation[: first + 1]


def test_default_eos_ids_come_from_the_target(prompt):
    target = tiny_llama()  # a private copy: its generation config is edited below
    continuation = reference(target, prompt, MAX_NEW)[prompt.shape[1]:]
    target.model.generation_config.eos_token_id = continuation[5]
    first = continuation.index(continuation[5])
    speculator = scripted(OracleSpeculator, target, [prompt], MAX_NEW + 3)
    assert generate_plain(target, prompt, MAX_NEW).tokens == continuation[: first + 1]
    assert generate_speculative(target, speculator, prompt, MAX_NEW, 3).tokens == continuation[: first + 1]


def test_k_is_capped_at_the_speculators_max_draft_len(target, prompt):
    spec, stats = run_speculative(OracleSpeculator, target, prompt, k=5, max_draft=2)
    assert stats.k == 2 and stats.mean_acceptance_length == 3.0
    assert spec.tokens == generate_plain(target, prompt, MAX_NEW, eos_ids=()).tokens
    speculator = scripted(OracleSpeculator, target, [prompt], MAX_NEW + 5, max_draft=2)
    with pytest.raises(ValueError, match="k=5 but this run drafts k=2"):
        generate_speculative(target, speculator, prompt, MAX_NEW, 5, stats=AcceptanceStats(5))


def test_rejects_bad_arguments(target, prompt):
    speculator = scripted(OracleSpeculator, target, [prompt], MAX_NEW + 3)
    with pytest.raises(ValueError, match="one prompt"):
        generate_plain(target, prompt.repeat(2, 1), MAX_NEW)
    with pytest.raises(ValueError, match="one prompt"):
        generate_speculative(target, speculator, prompt.repeat(2, 1), MAX_NEW, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_plain(target, prompt, 0)
    with pytest.raises(ValueError, match="k \\(draft tokens per step\\)"):
        generate_speculative(target, speculator, prompt, MAX_NEW, 0)


def test_rejects_drafts_of_the_wrong_shape(target, prompt):
    class LongDrafts(OracleSpeculator):  # more than k: fewer is allowed, more is not
        family = "test-long"

        def propose(self, state, pending, k):
            return super().propose(state, pending, k + 1)

    speculator = scripted(LongDrafts, target, [prompt], MAX_NEW + 4)
    with pytest.raises(ValueError, match="expected \\[1, k'\\] with k' <= 3"):
        generate_speculative(target, speculator, prompt, MAX_NEW, 3)


def test_a_drafter_may_propose_fewer_tokens_or_none(target, prompt):
    """k' <= k drafts per step, none on some steps (a plain step): still exactly lossless,
    each step counted with the drafts it verified."""
    from speclab.eval.metrics import AcceptanceStats
    from speculator_stubs import OracleSpeculator, scripted

    class Sparse(OracleSpeculator):
        family = "test-sparse"
        calls = 0

        def propose(self, state, pending, k):
            Sparse.calls += 1
            drafts, logits = super().propose(state, pending, k)
            keep = Sparse.calls % 3  # 1, 2, 0, 1, 2, 0, ... drafts
            return drafts[:, :keep], logits[:, :keep]

    plain = generate_plain(target, prompt, 20, eos_ids=())
    stats = AcceptanceStats(4)
    spec = generate_speculative(target, scripted(Sparse, target, [prompt], 30), prompt, 20, 4, eos_ids=(), stats=stats)
    assert spec.tokens == plain.tokens
    assert stats.num_draft_tokens == spec.drafted_tokens < 4 * stats.num_drafts  # fewer than k verified
    assert 0 in [min(a, 1) for a in spec.accepted]  # some steps drafted nothing
