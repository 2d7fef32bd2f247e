"""A hybrid composed from a learned speculator and a suffix drafter trained apart (`compose`).

Its drafting rule itself (suffix on a long match, else the learned part) is tested with the
other training-free families in test_training_free.py."""

import pytest
import torch

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator, load_speculator
from speclab.speculator.hybrid import compose

from test_families import SMALL, TOL, TRAINING_FREE, random_layers, target_info

V, H = 11, 8
PROMPT = [4, 5, 6, 7, 8, 9, 10, 1, 4, 5]


def info(vocab=V):
    torch.manual_seed(0)
    return TargetInfo(vocab_size=vocab, hidden_size=H, num_layers=2, name="stub",
                      embed_weight=torch.randn(vocab, H), lm_head_weight=torch.randn(vocab, H))


def parts(target=None):
    target = target or info()
    torch.manual_seed(1)
    learned = build_speculator("mlp", {"n_predict": 3, "inner_dim": 16, "draft_vocab_size": 6},
                               target.with_counts(torch.arange(target.vocab_size, 0, -1))).eval()
    suffix = build_speculator("suffix", {"corpus_tokens": 50, "global_outputs": False}, target)
    suffix.use_training_data([[2, 3, 9, 9, 7], [8, 1, 2]])
    return learned, suffix


def drafts(spec, pending, hidden, k=3):
    state = spec.start(torch.tensor([PROMPT]), hidden)
    return spec.propose(state, torch.tensor([[pending]]), k)


def test_a_composed_hybrid_drafts_what_its_parts_draft_and_saves_as_a_trained_one(tmp_path):
    learned, suffix = parts()
    hybrid = compose(learned, suffix, min_match=3, learned_k=2)
    assert hybrid.family == "hybrid" and hybrid.config.min_match == 3 and hybrid.config.learned_k == 2
    hidden = torch.randn(1, len(PROMPT), H)
    long_match, _ = drafts(hybrid, 6, hidden)  # "4 5 6": a 3-token match in the prompt
    assert torch.equal(long_match, drafts(suffix, 6, hidden)[0])
    short, logits = drafts(hybrid, 9, hidden)  # "5 9": too short, the learned part drafts
    expected, expected_logits = drafts(learned, 9, hidden)
    assert torch.equal(short, expected) and torch.equal(logits, hybrid.widen(expected_logits))
    assert torch.equal(hybrid.suffix.corpus_ids, suffix.corpus_ids)
    hybrid.save(tmp_path / "ckpt")
    loaded = load_speculator(tmp_path / "ckpt", info())
    assert loaded.config == hybrid.config
    assert torch.equal(loaded.suffix.corpus_ids, suffix.corpus_ids)
    assert all(torch.equal(a, b) for a, b in zip(loaded.learned.state_dict().values(),
                                                 learned.state_dict().values()))
    assert torch.equal(drafts(loaded, 9, hidden)[0], expected)


def test_composing_refuses_parts_that_do_not_make_a_hybrid():
    learned, suffix = parts()
    with pytest.raises(ValueError, match="must be a suffix drafter"):
        compose(learned, learned)
    with pytest.raises(ValueError, match="learned family"):
        compose(suffix, suffix)
    with pytest.raises(ValueError, match="min_match >= 1"):
        compose(learned, suffix, min_match=0)
    _, other_target = parts(info(vocab=V + 2))
    with pytest.raises(ValueError, match="not one target"):
        compose(learned, other_target)


LEARNED = sorted(set(SMALL) - TRAINING_FREE - {"hybrid"})


@pytest.mark.parametrize("family", LEARNED)
def test_the_learned_part_takes_in_skipped_steps_at_once_and_drafts_as_if_fed_every_step(family):
    """Steps the suffix part drafts are queued for the learned part, which takes them in with
    one `accept` when it drafts next. Its drafts then equal those of the same learned part
    fed every step (a reference run beside it), and it was called fewer times."""
    target = target_info()
    torch.manual_seed(2)
    learned = build_speculator(family, SMALL[family][0], target).eval()
    suffix = build_speculator("suffix", {"global_outputs": False}, target)
    hybrid = compose(learned, suffix, min_match=2)
    calls = []
    hybrid.learned.accept = lambda *a, _accept=hybrid.learned.accept: calls.append(1) or _accept(*a)

    prompt = torch.tensor([[3, 4, 5, 6] * 4])
    hidden, layers = torch.randn(1, 16, target.hidden_size), random_layers(learned, 16, target.hidden_size)
    mine, ref = hybrid.start(prompt, hidden, layers), learned.start(prompt, hidden, layers)
    kinds, k, last = [], 3, 6
    for step in range(15):
        # An unseen token every fifth step (no match: the learned part drafts, also at the
        # step after it), else the pattern's next token (a long match: the suffix part drafts).
        unseen = step % 5 == 0
        pending = torch.tensor([[int(torch.randint(20, 50, ())) if unseen else 3 + (last - 2) % 4 if 3 <= last <= 6 else 3]])
        suffix_step = hybrid.uses_suffix(mine, pending)
        kinds.append(suffix_step)
        if not suffix_step:
            paths = torch.randint(0, target.vocab_size, (2, 1))
            torch.testing.assert_close(hybrid.extend(mine, pending, paths),
                                       hybrid.widen(learned.extend(ref, pending, paths)), **TOL)
        drafts, logits = hybrid.propose(mine, pending, k)
        if not suffix_step:
            expected, expected_logits = learned.propose(ref, pending, k)
            assert torch.equal(drafts, expected)
            torch.testing.assert_close(logits, hybrid.widen(expected_logits), **TOL)
        n = int(torch.randint(0, drafts.shape[1] + 1, ()))
        committed = torch.cat([pending, drafts[:, :n]], 1)
        hidden = torch.randn(1, n + 1, target.hidden_size)
        layers = random_layers(learned, n + 1, target.hidden_size)
        hybrid.accept(mine, committed, hidden, layers)
        learned.accept(ref, committed, hidden, layers)
        last = int(committed[0, -1])
    assert any(kinds) and not all(kinds), kinds
    assert len(calls) < len(kinds), kinds  # one call for each run of suffix steps, not one a step
