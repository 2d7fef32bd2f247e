"""Feature-level autoregressive drafting, shared by EAGLE (-1/2) and EAGLE-3.

The draft is a few decoder layers running along the sequence. Position j reads a
"carried" feature c_j and the token x_{j+1} after it, and its output o_j guesses token
x_{j+2} (shift = 1). For committed positions c_j comes from the target (`lift` of its
features); when the draft runs ahead of the target it feeds back its own output
(`carry(o_{j-1})`) instead: that is the autoregression.

Training unrolls `steps` of it in parallel over all positions (EAGLE-3's training-time
test): step p at position t plays the p-th drafted position of a chain started after t.
It reads token x_{t+1+p} (teacher forced), the carried output of step p - 1 at t, and
attends to step 0's keys at positions <= t plus its own chain's keys (steps 1..p at t),
see layers.py. Step 0 alone is EAGLE-1's teacher-forced training.

Inference keeps a KV cache of committed positions whose next token is known; the last
committed position waits for the pending token. `propose` and `extend` run step 0 there
and the chain beyond it without touching the cache; `accept` feeds the newly committed
positions, whose features the target just computed. A state started inside
`native_drafting(speculator)` runs the layers of `propose` and `accept` as native steps
(speculator/lean_draft.py), whose chain keys sit in the cache's slots past the committed ones.
There `accept` only queues the committed positions' rows, and the next `propose` runs them
with its step 0 in one pass: step 0 is the row `accept` would feed once the pending token
is known (the same input at the same slot), and a pass of a few rows streams the layer's
weights once, as a pass of one does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Features, Speculator
from .layers import KV, causal_mask, compute_dtype, run_layers
from . import lean_draft
from .fast_linear import drafting_ops


@dataclass
class FeatureARState:
    cache: list[KV] | None  # per layer, keys/values of the fed positions [1, h_kv, n, dh]
    length: int  # positions fed (0..length-1)
    last: torch.Tensor  # [1, 1, F] the target's features at position `length` (next token: pending)
    lean: lean_draft.LeanDraftCache | None = None  # native steps: their cache replaces `cache`
    queued: torch.Tensor | None = None  # native steps: rows [u, d_in] of positions length.. not yet fed

    def feed(self, rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """Native states: the queued rows, then `rows` (step 0 of a chain, not counted as
        fed), through the layers in one pass at slot `length`; -> the outputs of `rows`."""
        queued = self.queued
        if queued is None and rows is None:
            return None
        x = queued if rows is None else rows if queued is None else torch.cat([queued, rows])
        out = self.lean.layers.run(x, self.lean, self.length)
        if queued is not None:
            self.length += queued.shape[0]
            self.queued = None
        return None if rows is None else out[out.shape[0] - rows.shape[0]:]

    def prefix(self, dtype: torch.dtype) -> list[KV] | None:
        """The fed positions' keys/values as the eager layers read them."""
        if self.lean is None:
            return self.cache
        self.feed()
        return self.lean.prefix_kv(self.length, dtype)


class FeatureAutoregressive(Speculator):
    """Subclasses define the feature maps below, `self.layers` and `self.unroll_steps`."""

    shift = 1

    def target_features(self, hidden: torch.Tensor, layers: torch.Tensor | None) -> torch.Tensor:  # [B, T, F]
        raise NotImplementedError

    def lift(self, features: torch.Tensor) -> torch.Tensor:
        """Target features -> the carried feature."""
        raise NotImplementedError

    def carry(self, out: torch.Tensor) -> torch.Tensor:
        """The draft's output at a position -> the carried feature of the next one."""
        raise NotImplementedError

    def step_input(self, carried: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # [B, S, C], [B, S] -> [B, S, d_in]
        raise NotImplementedError

    def head_states(self, out: torch.Tensor) -> torch.Tensor:
        """The draft's output -> what `draft_head` reads."""
        raise NotImplementedError

    @property
    def unroll_steps(self) -> int:
        raise NotImplementedError

    def _features(self, hidden: torch.Tensor, layers: torch.Tensor | None) -> torch.Tensor:
        dtype = compute_dtype(self)
        return self.target_features(hidden.to(dtype), None if layers is None else layers.to(dtype))

    # --- training -------------------------------------------------------------------

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, P, T, D]
        ids = feats.input_ids
        T = ids.shape[1]
        carried = self.lift(self._features(feats.hidden, feats.layers))
        positions = torch.arange(T, device=ids.device)
        mask = causal_mask(T, 0, ids.device)  # [T, T]
        base = chain = None
        states = []
        for p in range(max(1, min(self.unroll_steps, T - 1))):
            tokens = F.pad(ids[:, 1 + p :], (0, 1 + p))  # [B, T]: x_{t+1+p} at t (0 past the end)
            x = self.step_input(carried, tokens)
            if p == 0:
                out, base = run_layers(self.layers, x, positions, self.config.rope_theta, None, mask, None, "prefix")
            else:
                out, chain = run_layers(self.layers, x, positions + p, self.config.rope_theta, base, mask, chain, "chain")
            states.append(self.head_states(out))
            carried = self.carry(out)
        return torch.stack(states, 1)

    # --- inference ------------------------------------------------------------------

    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor,
              layers: torch.Tensor | None = None) -> FeatureARState:
        features = self._features(prompt_hidden, layers)  # [1, T, F]
        state = FeatureARState(cache=None, length=0, last=features[:, :0], lean=self._lean_cache(features.device))
        self._advance(state, features, prompt_ids[:, 1:])
        return state

    def accept(self, state: FeatureARState, committed: torch.Tensor, hidden: torch.Tensor,
               layers: torch.Tensor | None = None) -> None:
        # The waiting position's next token was the pending one (committed[0]).
        features = self._features(hidden, layers)  # [1, n+1, F]
        self._advance(state, torch.cat([state.last, features], 1), committed)

    def _lean_cache(self, device: torch.device) -> lean_draft.LeanDraftCache | None:
        """A cache for native draft steps, where they apply (decoding on the CPU inside
        `native_drafting`, layers of a structure they compute); else None (eager layers)."""
        ops = drafting_ops(self)
        if ops is None or device.type != "cpu" or torch.is_grad_enabled() or not lean_draft.supports(self.layers):
            return None
        return lean_draft.LeanDraftLayers.of(self.layers, self.config.rope_theta, ops).new_cache()

    @torch.no_grad()
    def _advance(self, state: FeatureARState, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Feed features [1, u, F] whose next tokens [1, u-1] are known; the last one waits."""
        u = next_tokens.shape[1]
        if u > 0:
            x = self.step_input(self.lift(features[:, :u]), next_tokens)
            if state.lean is not None:  # fed with the next step 0 (`feed`)
                state.queued = x[0] if state.queued is None else torch.cat([state.queued, x[0]])
            else:
                positions = torch.arange(state.length, state.length + u, device=x.device)
                mask = causal_mask(u, state.length, x.device)
                _, state.cache = run_layers(self.layers, x, positions, self.config.rope_theta,
                                            state.cache, mask, None, "prefix")
                state.length += u
        state.last = features[:, u:]

    def _step(self, state: FeatureARState, carried: torch.Tensor, tokens: torch.Tensor, p: int,
              chain: list[KV] | None, native: bool = True) -> tuple[torch.Tensor, list[KV] | None]:
        """Chain step p at position length + p for M rows: carried [M, 1, C], tokens [M, 1].
        A native state's single chain writes its key at that slot of the cache (chain stays
        None); native=False computes the step eagerly, over the cache's committed part."""
        x = self.step_input(carried, tokens)
        if native and state.lean is not None:
            out = state.feed(x[0]) if p == 0 else state.lean.layers.run(x[0], state.lean, state.length + p)
            return out.to(x.dtype)[None], None
        prefix = state.prefix(x.dtype)  # a native state feeds its queued rows first: `length` counts them
        position = torch.arange(state.length + p, state.length + p + 1, device=x.device)
        return run_layers(self.layers, x, position, self.config.rope_theta, prefix, None, chain, "chain")

    @torch.no_grad()
    def propose(self, state: FeatureARState, pending: torch.Tensor, k: int):
        out, chain = self._step(state, self.lift(state.last), pending, 0, None)
        tokens, logits = [], []
        for i in range(k):
            step_logits = self.draft_head(i, self.head_states(out))[:, -1]  # [1, N]
            token = self.vocab.to_target(step_logits.argmax(-1, keepdim=True))  # [1, 1] target id
            tokens.append(token)
            logits.append(step_logits)
            if i + 1 < k:
                out, chain = self._step(state, self.carry(out), token, i + 1, chain)
        return torch.cat(tokens, 1), torch.stack(logits, 1)  # [1, k], [1, k, N]

    @torch.no_grad()
    def extend(self, state: FeatureARState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        M, d = paths.shape
        # Eager steps: each path is its own chain, which the native cache's one slot per position cannot hold.
        out, chain = self._step(state, self.lift(state.last), pending, 0, None, native=False)
        out = out.expand(M, -1, -1)  # step 0 is common to every path
        chain = [tuple(t.expand(M, *t.shape[1:]) for t in kv) for kv in chain]
        for j in range(d):
            out, chain = self._step(state, self.carry(out), paths[:, j : j + 1], j + 1, chain, native=False)
        return self.draft_head(d, self.head_states(out))[:, -1]  # [M, N]
