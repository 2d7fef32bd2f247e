"""A test oracle: vLLM's `Medusa` (vllm/model_executor/models/medusa.py) rebuilt from its published
source in plain torch (vLLM installs on no CPU machine).

As vLLM does it: built from config.json (hidden_size, vocab_size, num_heads, num_hidden_layers,
truncated_vocab_size, medusa_fc_bias, original_lm_head); head i is `num_hidden_layers` residual
blocks x + SiLU(W x + b) on the target's last hidden state, then its lm_head (one shared lm_head,
read from lm_heads.0.weight, when original_lm_head); loading keeps only names it has parameters
for, `token_map` included when truncated_vocab_size < vocab_size; a token outside token_map
gets logit -inf.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


class VLLMMedusa(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        H, K, B = config["hidden_size"], config["num_heads"], config["num_hidden_layers"]
        bias = config.get("medusa_fc_bias", False)
        self.blocks = nn.ModuleList(nn.ModuleDict({"layers": nn.ModuleList(nn.Linear(H, H, bias=bias)
                                                                           for _ in range(B))}) for _ in range(K))
        self.vocab_size, self.truncated = config["vocab_size"], config["truncated_vocab_size"]
        if config.get("original_lm_head"):
            self.lm_head = nn.Linear(H, self.truncated, bias=False)
        else:
            self.lm_heads = nn.ModuleList(nn.Linear(H, self.truncated, bias=False) for _ in range(K))
        self.shared = bool(config.get("original_lm_head"))
        self.token_map = None

    @classmethod
    def from_export(cls, path: str | Path) -> "VLLMMedusa":
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == "medusa"
        model = cls(config)
        params, loaded = dict(model.named_parameters()), set()
        for name, tensor in load_file(str(path / "model.safetensors")).items():
            name = name.replace("medusa_heads.", "")
            if name == "token_map":
                if model.truncated < model.vocab_size:
                    model.token_map = tensor
                continue
            if model.shared and name == "lm_heads.0.weight":
                name = "lm_head.weight"
            if name not in params:
                continue
            assert params[name].shape == tensor.shape, f"{name}: {tuple(tensor.shape)} vs {tuple(params[name].shape)}"
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        assert loaded == set(params), f"vLLM would leave {sorted(set(params) - loaded)} uninitialised"
        assert model.truncated == model.vocab_size or model.token_map is not None
        return model.eval()

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, H] -> [B, K, V]
        out = []
        for i, block in enumerate(self.blocks):
            x = hidden
            for layer in block["layers"]:
                x = x + F.silu(layer(x))
            head = self.lm_head if self.shared else self.lm_heads[i]
            logits = head(x)
            if self.token_map is not None:
                full = torch.full((*logits.shape[:-1], self.vocab_size), -torch.inf)
                full[..., self.token_map] = logits
                logits = full
            out.append(logits)
        return torch.stack(out, 1)
