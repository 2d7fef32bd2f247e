import numpy as np
import pytest
import torch

from speclab.training.features import FeatureDataset, build_feature_store, collate, to_features


def examples(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 6 + 3 * i
        ids = torch.randint(0, 300, (T,), generator=g).tolist()
        out.append({"input_ids": ids, "loss_mask": [0] * 3 + [1] * (T - 3)})
    return out


@pytest.mark.parametrize("dtype,tol", [("fp32", 0.0), ("bf16", 2**-8)])
def test_cached_hidden_equals_a_fresh_forward(target, tmp_path, dtype, tol):
    data = examples()
    store = build_feature_store(target, data, "fp-test", tmp_path, dtype=dtype, batch_size=2, progress=False)
    for i, e in enumerate(data):
        got = store.example(i)
        fresh = target(torch.tensor([e["input_ids"]]), logits_for="none").hidden[0]
        assert got["input_ids"].tolist() == e["input_ids"]
        assert got["loss_mask"].tolist() == [bool(m) for m in e["loss_mask"]]
        # fp32: batched-with-padding vs alone may reorder sums, a few ulps; bf16: its 8-bit mantissa.
        torch.testing.assert_close(got["hidden"], fresh, rtol=max(tol, 1e-5), atol=1e-5)
    assert store.bytes_per_token > target.hidden_size * (2 if dtype == "bf16" else 4)


def test_second_build_reuses_cache_and_corrupt_cache_is_rebuilt(target, tmp_path, monkeypatch):
    data = examples()
    store = build_feature_store(target, data, "fp", tmp_path, batch_size=2, progress=False)
    import speclab.training.features as features

    def boom(*a, **k):
        raise AssertionError("cache should have been reused")

    monkeypatch.setattr(features, "_write_feature_store", boom)
    again = build_feature_store(target, data, "fp", tmp_path, batch_size=2, progress=False)
    assert np.array_equal(again.input_ids, store.input_ids)
    monkeypatch.undo()
    (store.path / "offsets.npy").write_bytes(b"garbage")
    rebuilt = build_feature_store(target, data, "fp", tmp_path, batch_size=2, progress=False)
    assert np.array_equal(rebuilt.input_ids, store.input_ids)


def test_collate_pads_right_and_features_shift_the_mask(target, tmp_path):
    store = build_feature_store(target, examples(3), "fp", tmp_path, progress=False)
    batch = collate([FeatureDataset(store=store)[i] for i in range(3)])
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (3, 12)
    assert not batch["loss_mask"][0, 6:].any()  # pads of the shortest example
    feats = to_features(batch)
    assert torch.equal(feats.loss_mask[:, :-1], batch["loss_mask"][:, 1:])
    assert not feats.loss_mask[:, -1].any()


def test_online_features_equal_offline(target, tmp_path):
    data = examples(3)
    store = build_feature_store(target, data, "fp", tmp_path, progress=False)
    offline = to_features(collate([FeatureDataset(store=store)[i] for i in range(3)]))
    online = to_features(collate([FeatureDataset(examples=data)[i] for i in range(3)]), target)
    mask = offline.loss_mask
    torch.testing.assert_close(online.hidden[mask], offline.hidden[mask], rtol=1e-5, atol=1e-5)
