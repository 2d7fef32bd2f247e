"""The shared decoder blocks: grouped-query attention and the rotary table give what their
plain definitions give."""

from __future__ import annotations

import pytest
import torch

from speclab.speculator.layers import attend, rope, rope_rows


def _shapes():
    # (query rows, prefix rows, kv heads, groups, queries, prefix length, chain length)
    return [(2, 2, 3, 3, 5, 7, 2), (4, 1, 3, 3, 1, 9, 3), (1, 1, 2, 1, 4, 4, 1), (3, 3, 1, 4, 6, 6, 0)]


# bf16: both sides round the same products; the tolerance is a few bf16 ulps of outputs near 1.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B, Bp, kv, groups, S, N, R", _shapes())
def test_grouped_attention_equals_keys_copied_to_every_head(B, Bp, kv, groups, S, N, R, dtype):
    """Query head i reads key head i // groups: the same as repeating each key head
    `groups` times (what Llama's repeat_kv does) and attending head by head."""
    torch.manual_seed(0)
    dh = 8
    rand = lambda *shape: torch.randn(*shape).to(dtype)
    q = rand(B, kv * groups, S, dh)
    prefix = (rand(Bp, kv, N, dh), rand(Bp, kv, N, dh))
    mask = torch.rand(S, N) > 0.3
    mask[:, 0] = True  # every query sees something
    chain = (rand(B, kv, S, R, dh), rand(B, kv, S, R, dh)) if R else None
    copied = lambda kv_pair: None if kv_pair is None else tuple(t.repeat_interleave(groups, 1) for t in kv_pair)
    for pre, m in ((prefix, mask), (prefix, None), (None, None)):
        if pre is None and chain is None:
            continue
        grouped = attend(q, pre, m, chain, groups)
        reference = attend(q, copied(pre), m, copied(chain), 1)
        assert grouped.dtype == dtype
        torch.testing.assert_close(grouped, reference, **TOLERANCE[dtype])


def test_attention_groups_map_each_query_head_to_its_own_key_head():
    """A key head that only one query group can see moves only that group's output."""
    torch.manual_seed(1)
    q = torch.randn(1, 4, 1, 8)
    keys, values = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    base = attend(q, (keys, values), None, None, 2)
    values2 = values.clone()
    values2[:, 1] += 1.0  # key head 1 serves query heads 2 and 3
    moved = attend(q, (keys, values2), None, None, 2)
    assert torch.equal(moved[:, :2], base[:, :2])
    torch.testing.assert_close(moved[:, 2:], base[:, 2:] + 1.0)


def test_rope_rows_are_ropes_own_rows_past_the_tables_end():
    positions = torch.tensor([0, 7, 1023, 1024, 5000])
    for got, want in zip(rope_rows(positions, 64, 10000.0), rope(positions, 64, 10000.0)):
        assert torch.equal(got, want)
