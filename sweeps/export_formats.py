"""Export layouts of a speculator checkpoint, and loading any of them back.

- `eagle3` -> vLLM's speculators format: config.json (`speculators_model_type`,
  `speculators_version`, `architectures`, `speculators_config` with the proposal method
  and the verifier, `transformer_layer_config`, `draft_vocab_size`,
  `eagle_aux_hidden_state_layer_ids`) and model.safetensors with the names of speculators'
  `Eagle3Speculator` (eagle3.py already uses them; `vocab.ids` becomes `d2t`/`t2d`).
- `mlp` -> the `mlp_speculator` layout of fms-extras / vLLM's `MLPSpeculator`: config.json
  (`model_type: mlp_speculator`, emb_dim, inner_dim, n_predict, ...) and weights
  `emb.i`, `proj.i`, `ln.i`, `head.i` (speclab's `norm.i` is fms's `ln.i`).
- every other family -> speclab's own self-describing layout (config.json + model.safetensors,
  exactly what `load_speculator` reads).

A foreign layout carries `speclab.json` beside it: speclab's checkpoint description (family,
config, target) and the map from each exported tensor name to speclab's names, so
`load_checkpoint` (used by `speclab eval`) rebuilds the very module that was measured.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from speclab.speculator.base import Speculator, TargetInfo, build_speculator, load_speculator, speculator_class

SPECLAB_META = "speclab.json"  # speclab's description of a foreign-layout export
SPECULATORS_VERSION = "0.1.0"  # the speculators config schema these fields follow
VOCAB_IDS = "vocab.ids"  # speclab's reduced-vocabulary buffer: exported as d2t (+ t2d)
# Target builders of speclab.speculator.targets -> (the verifier's hub id, its HF architecture)
KNOWN_VERIFIERS = {
    "speclab.speculator.targets.smollm2_from_gguf": ("HuggingFaceTB/SmolLM2-135M-Instruct", "LlamaForCausalLM"),
    "speclab.speculator.targets.tiny_llama": (None, "LlamaForCausalLM"),
}


def layout_of(family: str) -> str:
    return {"eagle3": "speculators_eagle3", "mlp": "mlp_speculator"}.get(family, "speclab")


def write_layout(out: Path, speculator: Speculator, meta: dict, k: int) -> str:
    """Write `speculator` into out/ in its family's layout; returns the layout's name.

    meta is speclab's config.json of the checkpoint (family, config, target, target_config).
    """
    layout = layout_of(speculator.family)
    if layout == "speclab":
        speculator.save(out, extra={key: value for key, value in meta.items()
                                    if key not in ("family", "config", "target", "params")})
        return layout
    rename, config = FOREIGN[layout](speculator, meta, k)
    tensors, weight_map = renamed_tensors(speculator, rename)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / SPECLAB_META).write_text(json.dumps({**meta, "layout": layout, "weight_map": weight_map}, indent=2) + "\n")
    return layout


def renamed_tensors(speculator: Speculator, rename: Callable[[str], str]) -> tuple[dict, dict]:
    """Unique tensors under exported names, and exported name -> every speclab alias of it.

    Tied parameters (one tensor under several names) are written once, as safetensors
    requires; `vocab.ids` is replaced by d2t and t2d, vLLM's vocabulary mapping.
    """
    tensors, weight_map, seen = {}, {}, {}
    for name, tensor in speculator.state_dict(keep_vars=False).items():
        if name == VOCAB_IDS:
            tensors["d2t"] = speculator.vocab.d2t().contiguous()  # [N] draft id -> target id offset
            tensors["t2d"] = speculator.vocab.t2d().contiguous()  # [V] bool: target id is drafted
            continue
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key in seen:  # an alias of a tensor already written
            weight_map[seen[key]].append(name)
            continue
        exported = rename(name)
        seen[key] = exported
        weight_map[exported] = [name]
        tensors[exported] = tensor.detach().cpu().contiguous()
    return tensors, weight_map


def mlp_speculator(speculator: Speculator, meta: dict, k: int) -> tuple[Callable, dict]:
    c, target = speculator.config, speculator.target_info
    config = {
        "architectures": ["MLPSpeculatorPreTrainedModel"],
        "model_type": "mlp_speculator",
        "vocab_size": target.vocab_size,
        "emb_dim": target.hidden_size,
        "inner_dim": c.inner_dim,
        "n_predict": c.n_predict,
        "top_k_tokens_per_head": [1] * c.n_predict,
        "n_candidates": 1,
        "tie_weights": c.tie_weights,
        "scale_input": False,
        "torch_dtype": _dtype_name(speculator),
        # Not part of the stock layout: speclab drafts a reduced vocabulary when this is
        # smaller than vocab_size (head.i has draft_vocab_size rows; d2t/t2d map them).
        "draft_vocab_size": speculator.vocab.size,
    }
    return (lambda name: name.replace("norm.", "ln.", 1) if name.startswith("norm.") else name), config


def speculators_eagle3(speculator: Speculator, meta: dict, k: int) -> tuple[Callable, dict]:
    c, target = speculator.config, speculator.target_info
    verifier_name, verifier_arch = verifier_of(meta.get("target_config") or {}, target.name)
    config = {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": speculator.vocab.size,
        "norm_before_residual": False,
        "target_hidden_size": target.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(speculator.target_layer_ids),
        "transformer_layer_config": {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": target.vocab_size,
            "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.hidden_size // c.num_heads,
            "rms_norm_eps": 1e-6,
            "rope_theta": c.rope_theta,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        },
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": [verifier_arch] if verifier_arch else []},
        },
        "torch_dtype": _dtype_name(speculator),
    }
    return (lambda name: name), config  # eagle3.py already uses speculators' names


FOREIGN: dict[str, Callable] = {"mlp_speculator": mlp_speculator, "speculators_eagle3": speculators_eagle3}


def verifier_of(target_config: dict, target_name: str) -> tuple[str | None, str | None]:
    """The verifier's hub id (or local path) and HF architecture, as far as they are known."""
    builder = target_config.get("_target_")
    if builder in KNOWN_VERIFIERS:
        name, arch = KNOWN_VERIFIERS[builder]
        return name or target_name, arch
    name = target_config.get("name_or_path") or target_name
    try:  # a local directory or a cached hub id; no network is needed for either
        from transformers import AutoConfig

        archs = AutoConfig.from_pretrained(name, local_files_only=True).architectures or [None]
        return name, archs[0]
    except Exception:  # noqa: BLE001 - unknown is recorded as unknown, never guessed
        return name, None


def _dtype_name(speculator: Speculator) -> str:
    return str(next(speculator.parameters()).dtype).removeprefix("torch.")


# --- loading any layout back -------------------------------------------------------------


def checkpoint_meta(path: str | Path) -> dict:
    """speclab's description of a checkpoint: its config.json, or an export's speclab.json."""
    path = Path(path)
    meta_file = path / SPECLAB_META if (path / SPECLAB_META).is_file() else path / "config.json"
    return json.loads(meta_file.read_text())


def load_checkpoint(path: str | Path, target: TargetInfo | None = None) -> Speculator:
    """A speculator from a speclab checkpoint or from any export layout above."""
    path = Path(path)
    if not (path / SPECLAB_META).is_file():
        return load_speculator(path, target)
    meta = checkpoint_meta(path)
    saved = TargetInfo(**meta["target"])
    if target is not None and (target.vocab_size, target.hidden_size) != (saved.vocab_size, saved.hidden_size):
        raise ValueError(f"{path} was trained for target {saved.name}, not {target.name}")
    model = build_speculator(meta["family"], meta["config"], _with_live_head(meta["family"], saved, target))
    exported = load_file(str(path / "model.safetensors"))
    state = {alias: exported[name] for name, aliases in meta["weight_map"].items() for alias in aliases}
    if "d2t" in exported:  # ids = i + d2t[i], vLLM's convention
        state[VOCAB_IDS] = exported["d2t"] + torch.arange(exported["d2t"].numel())
    model.load_state_dict(state, strict=True)
    device = target.embed_weight.device if target is not None and target.embed_weight is not None else "cpu"
    return model.to(device).eval()


def _with_live_head(family: str, saved: TargetInfo, target: TargetInfo | None) -> TargetInfo:
    """Families that draft through the target's frozen tensors (its LM head) get the live target's."""
    needs = getattr(speculator_class(family), "target_tensors", ())
    if needs and target is None:
        raise ValueError(f"a {family} speculator drafts through its target's {', '.join(needs)}; pass the live target")
    return dataclasses.replace(saved, **{name: getattr(target, name) for name in needs})
