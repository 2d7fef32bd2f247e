"""A static KV cache: preallocated once, rolled back by moving a length.

k, v: [layers, rows, kv_heads, max_len, head_dim] fp32; `lens[r]` is how many positions
row r holds. A decoding step writes its new keys and values at slots lens[r].. (in the
attention kernel) and then advances the length; rejecting n drafts moves it back by n;
keeping a verified tree's accepted path is one index copy over every layer at once.
Nothing is concatenated or allocated per step.
"""

from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(self, layers: int, rows: int, kv_heads: int, max_len: int, head_dim: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (layers, rows, kv_heads, max_len, head_dim)
        # empty, not zeros: only slots below a row's length are ever read, and untouched
        # pages of a long context cost no memory.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.lens = [0] * rows
        self.max_len = max_len

    @property
    def rows(self) -> int:
        return len(self.lens)

    def get_seq_length(self, row: int = 0) -> int:
        return self.lens[row]

    def reserve(self, rows: list[int], new_tokens: int) -> None:
        """Refuse a step that would run past the preallocated length."""
        longest = max(self.lens[r] for r in rows) + new_tokens
        if longest > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; this step needs {longest} "
                             "(prompt + new tokens + drafts exceed the context this cache was built for)")

    def advance(self, rows: list[int], new_tokens: int) -> None:
        for r in rows:
            self.lens[r] += new_tokens

    def rollback(self, n: int, row: int = 0) -> None:
        """Forget the last n positions of a row (rejected drafts)."""
        if n < 0 or n > self.lens[row]:
            raise ValueError(f"cannot roll back {n} of {self.lens[row]} cached positions")
        self.lens[row] -= n

    def keep(self, start: int, indices: torch.Tensor, row: int = 0) -> None:
        """Keep [0, start) and then only slots start + indices (ascending): a tree's accepted path."""
        n = int(indices.numel())
        picked = (start + indices).to(self.k.device)
        for t in (self.k, self.v):
            t[:, row, :, start : start + n] = t[:, row, :, :].index_select(2, picked)
        self.lens[row] = start + n

    def copy_row(self, src: int, dst: int) -> None:
        """Row dst becomes a copy of row src's cached positions (the same prompt, prefilled once)."""
        n = self.lens[src]
        for t in (self.k, self.v):
            t[:, dst, :, :n] = t[:, src, :, :n]
        self.lens[dst] = n

    def reset(self, row: int) -> None:
        self.lens[row] = 0
