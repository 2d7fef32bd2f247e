"""speclab's mlp speculator in vLLM's `mlp_speculator` maths, exactly, and back.

speclab's stage i (speculator/mlp.py) and vLLM's `MLPSpeculator` stage differ in three ways:

    speclab: y = GELU(LayerNorm_eps=1e-5(sw * P_i s + ew * E[z]))          LayerNorm centres the mean
    vLLM:    y = GELU(w * x / sqrt(mean(x^2) + 1e-6) + b),  x = P_i s + (ew'/sw) * E[z]

and vLLM's head has a row per target token (it has no draft vocabulary). All three are folded
into the exported weights, so vLLM's maths computes speclab's function:

- centring is linear, C = I - 11^T/d, so C x = (sw C P_i) s + ew (E C^T)[z]: P_i's rows and E's
  rows are centred and vLLM's mean-free norm then sees a zero-mean x, whose mean square is
  LayerNorm's variance;
- a scale t on x turns vLLM's eps into eps_v / t^2, so t^2 = eps_v / eps_s makes the two
  epsilons agree (x / sqrt(var + eps_s) == t x / sqrt(t^2 var + eps_v));
- a reduced draft vocabulary (N < V rows) is expanded with one extra state dimension e that
  is 0 before the norm (zero rows/columns) and GELU(BETA) after it (norm weight 0, bias BETA).
  Drafted tokens keep their head rows (0 at e); every other token's row is MASKED / GELU(BETA)
  at e, so its logit is MASKED whatever the state: vLLM never drafts it, as speclab cannot.
  The extra dimension adds a zero to the norm's sum of squares, and its mean over d + 1 entries
  is folded into t and the norm weight.

`from_vllm` undoes the scales; LayerNorm(C x) == LayerNorm(x), so the reloaded module
computes what the measured one did (to float rounding; its tensors are not bit-equal).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

VLLM_EPS = 1e-6  # MLPSpeculatorLayerNorm's eps in vLLM (and fms-extras)
BETA = 1.0  # the extra dimension's constant before GELU
MASKED = -1.0e4  # logit of a token outside the draft vocabulary: exp(-1e4) is 0 in any float dtype


def _dims(speculator) -> tuple[int, int, float, float, float]:
    """(d, d', t, sw, emb scale of speclab over vLLM's) for this speculator's export."""
    d, n = speculator.config.inner_dim, speculator.config.n_predict
    d_out = d if speculator.vocab.full else d + 1
    eps_s = speculator.norm[0].eps
    t = math.sqrt(VLLM_EPS * d_out / (d * eps_s))
    sw = 0.5 ** (0.5 / n)  # vLLM and speclab share the state weight (it depends on n only)
    emb_ratio = speculator.emb_weight / (math.sqrt((1 - sw**2) * d_out / 2) / sw)  # ew / (ew' / sw)
    return d, d_out, t, sw, emb_ratio


def _pad(x: torch.Tensor, rows: int, cols: int, fill: float = 0.0) -> torch.Tensor:
    return F.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]), value=fill) if x.dim() == 2 else \
        F.pad(x, (0, rows - x.shape[0]), value=fill)


@torch.no_grad()
def to_vllm(speculator) -> tuple[dict[str, torch.Tensor], int]:
    """-> (tensors in vLLM's names: emb.i, proj.i, ln.i, head.i; the exported inner_dim)."""
    d, d_out, t, sw, emb_ratio = _dims(speculator)
    ids, V = speculator.vocab.ids, speculator.vocab.target_vocab
    out = {}
    for i, emb in enumerate(speculator.emb):
        E = emb.weight.float()  # [V, d]
        out[f"emb.{i}.weight"] = _pad(t * emb_ratio * (E - E.mean(1, keepdim=True)), V, d_out)
    for i, proj in enumerate(speculator.proj):
        P = proj.weight.float()  # [d, d_in]
        centred = t * sw * (P - P.mean(0, keepdim=True))  # C P: each column's mean over the d outputs removed
        out[f"proj.{i}.weight"] = _pad(centred, d_out, P.shape[1] if i == 0 else d_out)
    for i, norm in enumerate(speculator.norm):
        out[f"ln.{i}.weight"] = _pad(norm.weight.float() * math.sqrt(d / d_out), d_out, 0)
        out[f"ln.{i}.bias"] = _pad(norm.bias.float(), d_out, 0, BETA)
    for i, head in enumerate(speculator.head):
        W = head.weight.float()  # [N, d]
        if speculator.vocab.full:
            out[f"head.{i}.weight"] = W
            continue
        full = torch.zeros(V, d_out)
        full[:, d] = MASKED / F.gelu(torch.tensor(BETA)).item()
        full[ids] = _pad(W, W.shape[0], d_out)
        out[f"head.{i}.weight"] = full
    dtype = next(speculator.parameters()).dtype
    return {name: x.to(dtype).contiguous() for name, x in out.items()}, d_out


@torch.no_grad()
def from_vllm(speculator, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `to_vllm` into `speculator`'s state-dict names (its vocabulary already loaded)."""
    d, _, t, sw, emb_ratio = _dims(speculator)
    ids = speculator.vocab.ids
    state = {}
    for i, _ in enumerate(speculator.emb):
        state[f"emb.{i}.weight"] = tensors[f"emb.{i}.weight"][:, :d] / (t * emb_ratio)
    for i, proj in enumerate(speculator.proj):
        state[f"proj.{i}.weight"] = tensors[f"proj.{i}.weight"][:d, :proj.weight.shape[1]] / (t * sw)
    for i, _ in enumerate(speculator.norm):
        d_out = tensors[f"ln.{i}.weight"].shape[0]
        state[f"norm.{i}.weight"] = tensors[f"ln.{i}.weight"][:d] * math.sqrt(d_out / d)
        state[f"norm.{i}.bias"] = tensors[f"ln.{i}.bias"][:d]
    for i, _ in enumerate(speculator.head):
        W = tensors[f"head.{i}.weight"]
        state[f"head.{i}.weight"] = W if speculator.vocab.full else W[ids, :d]
    return state
