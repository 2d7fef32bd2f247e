"""A checkpoint saved by vLLM's speculators library (config.json + model.safetensors, no
speclab.json beside it) read into the speclab family that computes the same draft:
`load_checkpoint` falls back to it, so `speclab eval` scores a draft trained elsewhere.
Readable: `eagle3` (and EAGLE-3.1's `norm_output`; `norm_before_fc` for both), `peagle`, `dflash`, `dflash2`, `dspark`, `xpress`.

config.json is data from a stranger: only the fields below are read, each checked, and
nothing in it names code to run. A checkpoint asking for maths speclab's layers do not
compute (another norm placement, attention biases, a sliding window, another rope) is
refused with the field named, never approximated.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from speclab.speculator.base import Speculator, TargetInfo
from speclab.speculator.families import build_speculator

# Tensors speculators keeps for training or reloads from the verifier: never the draft's own.
VERIFIER_TENSORS = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight", "t2d")
DROPPED = ("confidence_head.",)  # dspark's acceptance estimate: it changes no draft
EAGLE_KINDS = ("eagle3", "peagle")  # speculators_model_type -> the speclab family of that name
EPS = 1e-6  # speclab's draft layers' RMSNorm eps
# The speculators tensors speclab has no module for: the verifier's own (never saved by
# speculators, dropped if present) and the vocabulary mapping (read into vocab.ids).
NOT_WEIGHTS = ("verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d")


def is_speculators_checkpoint(path: Path) -> bool:
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return "speculators_model_type" in json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError, AttributeError):
        return False


def load_speculators_checkpoint(path: str | Path, target: TargetInfo) -> Speculator:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    kind = config.get("speculators_model_type")
    if kind in EAGLE_KINDS:
        return _eagle(path, config, target)
    if kind not in CONFIGS:
        raise ValueError(f"{path}: speculators model type {kind!r} has no speclab family that reads it "
                         f"(readable: {sorted([*EAGLE_KINDS, *CONFIGS])})")
    return _block_drafter(path, config, kind, target)


def _block_drafter(path: Path, config: dict, kind: str, target: TargetInfo) -> Speculator:
    family, options = CONFIGS[kind](config, target, path)
    tensors = load_file(str(path / "model.safetensors"))
    draft_vocab = _int(config, "draft_vocab_size", path)
    options["draft_vocab_size"] = 0 if draft_vocab == target.vocab_size else draft_vocab
    model = build_speculator(family, options, target)
    state = {name: t for name, t in tensors.items()
             if name not in VERIFIER_TENSORS and name != "d2t" and not name.startswith(DROPPED)}
    if not model.vocab.full:
        d2t = tensors.get("d2t")
        if d2t is None or d2t.numel() != draft_vocab:
            raise ValueError(f"{path}: a {draft_vocab}-token draft vocabulary needs d2t [{draft_vocab}]")
        state["vocab.ids"] = d2t.long() + torch.arange(draft_vocab)
    if "lm_head.weight" not in state and model.vocab.full:
        state["lm_head.weight"] = model.lm_head.weight.detach().clone()  # the verifier's, as speculators reloads it
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: tensors do not match a {family} draft of this shape "
                         f"(missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]})")
    return model.eval()


def _dspark(config: dict, target: TargetInfo, path: Path) -> tuple[str, dict]:
    """dflash's fields plus the Markov head's; a confidence head is left out (it estimates
    acceptance and changes no draft: dspark.py)."""
    if not isinstance(config.get("markov_rank"), int) or config["markov_rank"] < 1:
        raise ValueError(f"{path}: a dspark without a Markov head (markov_rank {config.get('markov_rank')!r}) "
                         "drafts as dflash, whose slot 0 drafts nothing; speclab's dspark needs markov_rank >= 1")
    if config.get("markov_head_type", "vanilla") not in ("vanilla", "gated"):
        raise ValueError(f"{path}: speclab's dspark computes the vanilla and gated Markov heads, "
                         f"not {config['markov_head_type']!r}")
    _, options = _dflash(dict(config, sample_from_anchor=False), target, path)
    if config.get("sample_from_anchor", True) is not True:
        raise ValueError(f"{path}: speclab's dspark drafts from every slot (sample_from_anchor true)")
    return "dspark", dict(options, markov_rank=config["markov_rank"], markov_head=config.get("markov_head_type", "vanilla"))


def _xpress(config: dict, target: TargetInfo, path: Path) -> tuple[str, dict]:
    """dflash's fields plus the refiner's; its Jacobi pass count is the engine's (speclab runs
    passes until the block settles: xpress.py)."""
    _, options = _dflash(config, target, path)
    return "xpress", dict(options, xpress_rank=_int(config, "xpress_rank", path),
                          xpress_mlp_ratio=_int(config, "xpress_mlp_ratio", path))


def _dflash2(config: dict, target: TargetInfo, path: Path) -> tuple[str, dict]:
    """dflash's fields plus the convolutions' and the selector's (over the whole vocabulary)."""
    _, options = _dflash(config, target, path)
    return "dflash2", dict(options, **{key: _int(config, key, path) for key in
                                       ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")})


def _dflash(config: dict, target: TargetInfo, path: Path) -> tuple[str, dict]:
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{path}: config.json has no transformer_layer_config")
    refused = [name for name, ok in (
        ("sample_from_anchor", config.get("sample_from_anchor", False) is False),
        ("attention_bias", layer.get("attention_bias", False) is False),
        ("a sliding window", not layer.get("layer_types") or set(layer["layer_types"]) == {"full_attention"}),
        ("hidden_act", layer.get("hidden_act", "silu") == "silu"),
    ) if not ok]
    if refused:
        raise ValueError(f"{path}: speclab's dflash does not compute {', '.join(refused)} as this checkpoint sets it")
    if _int(layer, "hidden_size", path) != target.hidden_size:
        raise ValueError(f"{path}: a {layer['hidden_size']}-wide draft for a {target.hidden_size}-wide target")
    rope = layer.get("rope_theta", (layer.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    return "dflash", {
        "block_size": _int(config, "block_size", path),
        "num_layers": _int(layer, "num_hidden_layers", path),
        "num_heads": _int(layer, "num_attention_heads", path),
        "num_kv_heads": _int(layer, "num_key_value_heads", path),
        "head_dim": _int(layer, "head_dim", path),
        "intermediate_size": _int(layer, "intermediate_size", path),
        "target_layers": [int(i) for i in config.get("aux_hidden_state_layer_ids") or []],
        "mask_token": _int(config, "mask_token_id", path),
        "rope_theta": float(rope),
        "rms_norm_eps": float(layer.get("rms_norm_eps", 1e-6)),
    }


CONFIGS = {"dflash": _dflash, "dflash2": _dflash2, "dspark": _dspark, "xpress": _xpress}


def _int(section: dict, key: str, path: Path) -> int:
    value = section.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{path}: config.json field {key!r} must be an integer, not {value!r}")
    return value


def _flag(section: dict, key: str) -> bool:
    """A true/false option (absent: false); a string such as "false" is refused, not read as true."""
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"speculators config.json field {key!r} must be true or false, not {value!r}")
    return value


# --- eagle3 and peagle ---------------------------------------------------------------------

def _eagle(path: Path, config: dict, target: TargetInfo) -> Speculator:
    """The speculators checkpoint in `path`, drafting for the live `target` (its depth and
    width: a speculators checkpoint names its verifier, not the layer count speclab checks)."""
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
    refused = [f"{name}={config.get(name)!r}" for name in ("norm_before_residual", "fc_norm")
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
                  embedding="trained" if config.get("embed_requires_grad", kind == "peagle") else "frozen",
                  norm_before_fc=_flag(config, "norm_before_fc"))
    if kind == "eagle3":
        return dict(params, norm_output=_flag(config, "norm_output"))
    # norm_output is ignored, as speculators' PEagleDraftModel ignores it: nothing is fed back
    proposals = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return dict(params, block_size=int(proposals[0].get("speculative_tokens", 8)),
                mask_token_id=int(config.get("mask_token_id") if config.get("mask_token_id") is not None else -1))
