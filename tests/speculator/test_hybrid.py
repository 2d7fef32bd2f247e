"""A hybrid composed from a learned speculator and a suffix drafter trained apart (`compose`).

Its drafting rule itself (suffix on a long match, else the learned part) is tested with the
other training-free families in test_training_free.py."""

import pytest
import torch

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator, load_speculator
from speclab.speculator.hybrid import compose

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
