"""A test oracle: vLLM's `MLPSpeculator` (vllm/model_executor/models/mlp_speculator.py) rebuilt
from its published source in plain torch, because vLLM itself installs on no CPU machine.

What it reproduces, as vLLM does it:
- construction from config.json alone (vocab_size, emb_dim, inner_dim, n_predict, tie_weights,
  scale_input); tied stages share one emb, one ln, one head and, after the first, one proj, so
  their parameters are named emb.0, proj.0, proj.1, ln.0, head.0;
- loading: every checkpoint tensor whose name (minus a "speculator." prefix) is a parameter is
  copied into it, shapes checked as vLLM's default weight loader asserts; other names are ignored;
- the maths of `generate_proposals`: z = emb_i(last token); x = proj_i(state) + z * (ew / sw);
  state = GELU(ln_i(x)) with ln = x * rsqrt(mean(x^2) + 1e-6) * weight + bias; logits = head_i(state).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


class MeanFreeNorm(nn.Module):  # MLPSpeculatorLayerNorm, elementwise_scale_and_shift=True
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.empty(d)), nn.Parameter(torch.empty(d)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) + self.bias


class VLLMMLPSpeculator(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        n, V, H = config["n_predict"], config["vocab_size"], config["emb_dim"]
        d = config["inner_dim"] or H
        assert not config.get("scale_input"), "speclab never exports scale_input"
        if config["tie_weights"]:
            assert n > 1, "vLLM refuses tied weights with one stage"
            emb, proj_tied, head, ln = nn.Embedding(V, d), nn.Linear(d, d, bias=False), \
                nn.Linear(d, V, bias=False), MeanFreeNorm(d)
            self.emb, self.head, self.ln = (nn.ModuleList([m] * n) for m in (emb, head, ln))
            self.proj = nn.ModuleList([nn.Linear(H, d, bias=False)] + [proj_tied] * (n - 1))
        else:
            self.emb = nn.ModuleList(nn.Embedding(V, d) for _ in range(n))
            self.proj = nn.ModuleList(nn.Linear(H if i == 0 else d, d, bias=False) for i in range(n))
            self.head = nn.ModuleList(nn.Linear(d, V, bias=False) for _ in range(n))
            self.ln = nn.ModuleList(MeanFreeNorm(d) for _ in range(n))
        self.n_predict = n
        self.state_weight = 0.5 ** (0.5 / n)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) * (d / 2))

    @classmethod
    def from_export(cls, path: str | Path) -> "VLLMMLPSpeculator":
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == "mlp_speculator"
        model = cls(config)
        params = dict(model.named_parameters())
        loaded = set()
        for name, tensor in load_file(str(path / "model.safetensors")).items():
            param = params.get(name.replace("speculator.", ""))
            if param is None:
                continue  # vLLM skips names it has no parameter for (speclab's d2t/t2d)
            assert param.shape == tensor.shape, f"{name}: checkpoint {tuple(tensor.shape)}, vLLM {tuple(param.shape)}"
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(name)
        assert loaded == set(params), f"vLLM would leave {sorted(set(params) - loaded)} uninitialised"
        return model.eval()

    @torch.no_grad()
    def stage_logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] (the target's state), tokens [B, n] (the token each stage reads)
        -> logits [B, n, V]: stage i's logits with the chain fed these tokens."""
        state, out = hidden, []
        for i in range(self.n_predict):
            z = self.emb[i](tokens[:, i])
            x = self.proj[i](state) + z * (self.emb_weight / self.state_weight)
            state = F.gelu(self.ln[i](x))
            out.append(self.head[i](state))
        return torch.stack(out, 1)
