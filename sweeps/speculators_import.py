"""A checkpoint saved by vLLM's speculators (`Eagle3DraftModel`, `PEagleDraftModel`: config.json
+ model.safetensors, no speclab.json) as the speclab module that computes its draft logits.

config.json is data: the fields read are checked against what speclab's layers compute
(Llama layers, RMSNorm eps 1e-6, plain rotary, no extra input norms), and a checkpoint that
asks for anything else is refused with the field named, never approximated.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from speclab.speculator.base import Speculator, TargetInfo
from speclab.speculator.families import build_speculator

KINDS = ("eagle3", "peagle")  # speculators_model_type -> the speclab family of that name
EPS = 1e-6  # speclab's draft layers' RMSNorm eps
# The speculators tensors speclab has no module for: the verifier's own (never saved by
# speculators, dropped if present) and the vocabulary mapping (read into vocab.ids).
NOT_WEIGHTS = ("verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d")


def is_speculators_dir(path: Path) -> bool:
    try:
        return json.loads((path / "config.json").read_text()).get("speculators_model_type") in KINDS
    except (OSError, ValueError, AttributeError):
        return False


def from_speculators(path: str | Path, target: TargetInfo) -> Speculator:
    """The speculators checkpoint in `path`, drafting for the live `target` (its depth and
    width: a speculators checkpoint names its verifier, not the layer count speclab checks)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    kind = config["speculators_model_type"]
    params = _params(config, kind, target)
    model = build_speculator(kind, params, TargetInfo(target.vocab_size, target.hidden_size, target.num_layers,
                                                      target.name))
    tensors = load_file(str(path / "model.safetensors"))
    if "d2t" in tensors:  # target id = i + d2t[i]
        model.vocab.ids.copy_(tensors["d2t"] + torch.arange(tensors["d2t"].numel()))
    state = {name: t for name, t in tensors.items() if name not in NOT_WEIGHTS}
    if not model.vocab.full:
        state["vocab.ids"] = model.vocab.ids.clone()
    model.load_state_dict(state, strict=True)
    device = target.embed_weight.device if target.embed_weight is not None else "cpu"
    return model.to(device).eval()


def _params(config: dict, kind: str, target: TargetInfo) -> dict:
    tl = config["transformer_layer_config"]
    refused = [f"{name}={config.get(name)!r}" for name in ("norm_before_residual", "norm_before_fc", "fc_norm")
               if config.get(name)]
    refused += [f"transformer_layer_config.{name}={tl.get(name)!r}" for name, want in (
        ("model_type", "llama"), ("hidden_act", "silu"), ("rms_norm_eps", EPS)) if tl.get(name, want) != want]
    refused += [f"transformer_layer_config.{name}=True" for name in ("attention_bias", "mlp_bias") if tl.get(name)]
    rope = tl.get("rope_parameters") or tl.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        refused.append(f"rope type {rope.get('rope_type', rope.get('type'))!r}")
    heads, width = tl["num_attention_heads"], tl["hidden_size"]
    if tl.get("head_dim", width // heads) != width // heads:
        refused.append(f"transformer_layer_config.head_dim={tl['head_dim']} (speclab's is hidden_size / heads)")
    if refused:
        raise ValueError(f"speculators checkpoint asks for what speclab's {kind} layers do not compute: "
                         + ", ".join(refused))
    vocab, hidden = tl["vocab_size"], config.get("target_hidden_size") or width
    if (vocab, hidden) != (target.vocab_size, target.hidden_size):
        raise ValueError(f"speculators checkpoint drafts for a target of vocab {vocab}, hidden {hidden}; "
                         f"{target.name} has {target.vocab_size}, {target.hidden_size}")
    layer_ids = config.get("eagle_aux_hidden_state_layer_ids")
    if not layer_ids:
        raise ValueError("speculators checkpoint names no eagle_aux_hidden_state_layer_ids (the target layers it reads)")
    draft_vocab = int(config["draft_vocab_size"])
    params = dict(num_layers=tl["num_hidden_layers"], hidden_size=width, num_heads=heads,
                  num_kv_heads=tl.get("num_key_value_heads") or heads, intermediate_size=tl["intermediate_size"],
                  target_layers=[int(i) for i in layer_ids],
                  rope_theta=float(rope.get("rope_theta", tl.get("rope_theta", 10000.0))),
                  draft_vocab_size=0 if draft_vocab == vocab else draft_vocab,
                  embedding="trained" if config.get("embed_requires_grad", kind == "peagle") else "frozen")
    if kind == "eagle3":
        return dict(params, norm_output=bool(config.get("norm_output", False)))
    # norm_output is ignored, as speculators' PEagleDraftModel ignores it: nothing is fed back
    proposals = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return dict(params, block_size=int(proposals[0].get("speculative_tokens", 8)),
                mask_token_id=int(config.get("mask_token_id") if config.get("mask_token_id") is not None else -1))
