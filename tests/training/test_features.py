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


def test_intermediate_layers_are_cached_per_id_and_added_on_demand(target, tmp_path, monkeypatch):
    """Layers a run asks for are added by an extra pass; other ids and the base stay untouched."""
    import speclab.training.features as features

    data = examples(4)
    base = build_feature_store(target, data, "fp", tmp_path, batch_size=3, progress=False)
    base_bytes = base.bytes_per_token

    def boom(*a, **k):
        raise AssertionError("the base store should have been reused")

    monkeypatch.setattr(features, "_write_feature_store", boom)
    first = build_feature_store(target, data, "fp", tmp_path, batch_size=3, progress=False, layer_ids=(0, 2))
    hidden_file = (first.path / "hidden.npy").stat().st_mtime_ns
    second = build_feature_store(target, data, "fp", tmp_path, batch_size=3, progress=False, layer_ids=(1, 2))
    assert (second.path / "hidden.npy").stat().st_mtime_ns == hidden_file
    for store, ids in ((first, (0, 2)), (second, (1, 2))):
        assert store.path == base.path and tuple(store.layers) == ids
        for i, e in enumerate(data):
            fresh = target(torch.tensor([e["input_ids"]]), layer_ids=ids, logits_for="none")
            got = store.example(i, ids)["layers"]  # [T, L, H]
            assert got.shape == (len(e["input_ids"]), len(ids), target.hidden_size)
            for col, j in enumerate(ids):
                # batched-with-padding vs alone reorders sums; the residual stream of this
                # large-weight target reaches ~200, so the bound is 1e-5 of the layer's scale
                # (as in test_builders.py), far below a wrong layer or position (O(1)).
                expected = fresh.layers[j][0]
                torch.testing.assert_close(got[:, col], expected, rtol=0, atol=1e-5 * expected.abs().max().item())
    # each layer adds H fp32 values per token, plus its .npy header (<= 256 bytes) over the tokens
    tokens = int(second.offsets[-1])
    assert second.bytes_per_token == pytest.approx(base_bytes + 2 * 4 * target.hidden_size, abs=2 * 256 / tokens)
    with pytest.raises(ValueError, match="outside 0..2"):
        build_feature_store(target, data, "fp", tmp_path, progress=False, layer_ids=(3,))


def test_layers_collate_and_online_equal_offline(target, tmp_path):
    data = examples(3)
    ids = (1, 2)
    store = build_feature_store(target, data, "fp", tmp_path, progress=False, layer_ids=ids)
    batch = collate([FeatureDataset(store=store, layer_ids=ids)[i] for i in range(3)])
    assert batch["layers"].shape == (3, 12, 2, target.hidden_size)
    assert not batch["layers"][0, 6:].any()  # pads of the shortest example
    offline = to_features(batch, layer_ids=ids)
    online = to_features(collate([FeatureDataset(examples=data)[i] for i in range(3)]), target, ids)
    mask = offline.loss_mask
    expected = offline.layers[mask]
    torch.testing.assert_close(online.layers[mask], expected, rtol=0, atol=1e-5 * expected.abs().max().item())
    with pytest.raises(ValueError, match="lacks target features"):
        to_features(collate([FeatureDataset(store=store)[i] for i in range(3)]), None, ids)


def test_a_failed_layer_pass_leaves_no_partial_files(target, tmp_path, monkeypatch):
    """A full disk at the second layer's file (as CacheSpaceError raises it): the first layer's
    file, as large as the store's hidden states, is removed, and a later call builds both."""
    import speclab.training.features as features

    data = examples(4)
    build_feature_store(target, data, "fp", tmp_path, batch_size=3, progress=False)
    real, made = features._new_memmap, []

    def second_fails(path, *a, **k):
        made.append(path)
        if len(made) == 2:
            raise OSError(28, "not enough space")
        return real(path, *a, **k)

    monkeypatch.setattr(features, "_new_memmap", second_fails)
    with pytest.raises(OSError, match="not enough space"):
        build_feature_store(target, data, "fp", tmp_path, batch_size=3, progress=False, layer_ids=(0, 2))
    assert made and not any(p.exists() for p in made)
    assert not list(made[0].parent.glob("*.tmp*"))
    monkeypatch.setattr(features, "_new_memmap", real)
    store = build_feature_store(target, data, "fp", tmp_path, batch_size=3, progress=False, layer_ids=(0, 2))
    assert tuple(store.layers) == (0, 2)
