"""Export layouts of a speculator checkpoint, and loading any of them back.

Each family with a serving engine is written in that engine's own layout, computing what
speclab measured (docs/serving.md is the table):

- `eagle3` -> vLLM's speculators format: config.json (`speculators_model_type`,
  `speculators_version`, `architectures`, `speculators_config` with the proposal method it
  was scored with and the verifier, `transformer_layer_config`, `draft_vocab_size`,
  `target_hidden_size`, `eagle_aux_hidden_state_layer_ids`) and model.safetensors with the
  names of speculators' `Eagle3DraftModel` (eagle3.py uses them; `vocab.ids` becomes `d2t`/`t2d`).
- `mlp` -> the `mlp_speculator` layout of fms-extras / vLLM's `MLPSpeculator`, speclab's norm
  and draft vocabulary folded into the weights so vLLM's maths computes speclab's (export_mlp.py).
- `draft_lm` -> a plain `LlamaForCausalLM` over the full vocabulary (transformers' assisted
  generation, vLLM's draft-model method).
- `medusa` -> vLLM's `MedusaModel` (`blocks.i.layers.j`, `lm_heads.i`, `token_map`).
- every other family -> speclab's own self-describing layout (config.json + model.safetensors,
  exactly what `load_speculator` reads).

An export its engine could not run as measured (`refusals`) is written in speclab's own layout
instead, and the reasons are logged and recorded in export.json and the model card: never a
directory that fails, or computes something else, once it reaches the engine.

A foreign layout carries `speclab.json` beside it: speclab's checkpoint description (family,
config, target, how it was scored) and how each exported tensor maps back, so
`load_checkpoint` (used by `speclab eval`) rebuilds the module that was measured.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from speclab.speculator.base import Speculator, TargetInfo, build_speculator, load_speculator, speculator_class

from .export_mlp import from_vllm, to_vllm

log = logging.getLogger(__name__)

SPECLAB_META = "speclab.json"  # speclab's description of a foreign-layout export
SPECULATORS_VERSION = "0.1.0"  # the speculators config schema these fields follow
VOCAB_IDS = "vocab.ids"  # speclab's reduced-vocabulary buffer: exported as d2t (+ t2d)
# Target builders of speclab.speculator.targets -> (the verifier's hub id, its HF architecture);
# no hub id: the target exists only in-process, so the export saves it under VERIFIER_DIR.
KNOWN_VERIFIERS = {
    "speclab.speculator.targets.smollm2_from_gguf": ("HuggingFaceTB/SmolLM2-135M-Instruct", "LlamaForCausalLM"),
    "speclab.speculator.targets.tiny_llama": (None, "LlamaForCausalLM"),
}
VERIFIER_DIR = "verifier"
VLLM_EAGLE3_AUX_LAYERS = 3  # vLLM's EAGLE-3 fc reads exactly 3 x target_hidden_size


@dataclasses.dataclass
class ExportContext:
    """What a layout needs besides the speculator."""

    meta: dict  # speclab's config.json of the checkpoint (family, config, target, target_config)
    k: int  # the draft length it was scored with (a tree: its depth)
    tree: dict | None = None  # the eval tree (shape, depth, top_k, budget) when scored with one
    final_dir: Path | None = None  # where the export will live: a saved verifier is named by this path

    @property
    def scored_with(self) -> dict:
        return {"method": "tree", "k": self.k, "tree": self.tree} if self.tree else {"method": "chain", "k": self.k}


def layout_of(family: str) -> str:
    return {"eagle3": "speculators_eagle3", "mlp": "mlp_speculator", "draft_lm": "hf_llama",
            "medusa": "vllm_medusa"}.get(family, "speclab")


def refusals(speculator: Speculator, layout: str) -> list[str]:
    """Why the engine behind `layout` could not run this speculator as speclab measured it."""
    if layout == "speculators_eagle3":
        L, ids = speculator.target_info.num_layers, list(speculator.target_layer_ids)
        out = []
        if len(set(ids)) != VLLM_EAGLE3_AUX_LAYERS:
            out.append(f"vLLM's EAGLE-3 reads exactly {VLLM_EAGLE3_AUX_LAYERS} distinct target layers "
                       f"(its fc is [D, 3 x target_hidden_size]); this draft fuses {ids}")
        if any(i >= L for i in ids):
            out.append(f"target layer {L} was read after the final norm (HF hidden_states[{L}]), but vLLM hands "
                       f"the draft the pre-norm residual stream; train on layers 0..{L - 1}")
        return out
    if layout == "mlp_speculator" and speculator.config.tie_weights and speculator.config.n_predict < 2:
        return ["vLLM's MLPSpeculator refuses tied weights with a single stage (n_predict 1); train untied"]
    if layout == "vllm_medusa" and speculator.config.hidden_size not in (0, speculator.target_info.hidden_size):
        return [f"vLLM's Medusa heads are as wide as the target ({speculator.target_info.hidden_size}) with no input "
                f"projection; this one is {speculator.config.hidden_size} wide"]
    if layout == "hf_llama" and not speculator.vocab.full:
        return [f"a LlamaForCausalLM assistant scores all {speculator.vocab.target_vocab} target tokens, and its "
                f"{speculator.vocab.size}-token head cannot be widened exactly (a bias-free lm_head after RMSNorm "
                "cannot mask a token); train with draft_vocab_size=0"]
    return []


def write_layout(out: Path, speculator: Speculator, ctx: ExportContext) -> tuple[str, list[str]]:
    """Write `speculator` into out/ in its family's serving layout -> (layout, why it fell back)."""
    layout = layout_of(speculator.family)
    reasons = refusals(speculator, layout)
    if reasons:
        log.warning("the %s export cannot be served by its engine, so it is written in speclab's own layout: %s",
                    speculator.family, "; ".join(reasons))
        layout = "speclab"
    if layout == "speclab":
        speculator.save(out, extra={**{key: value for key, value in ctx.meta.items()
                                       if key not in ("family", "config", "target", "params")},
                                    "scored_with": ctx.scored_with})
        return layout, reasons
    tensors, config, mapping = FOREIGN[layout](speculator, ctx, out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    meta = {**ctx.meta, "layout": layout, "scored_with": ctx.scored_with, **mapping}
    (out / SPECLAB_META).write_text(json.dumps(meta, indent=2) + "\n")
    return layout, reasons


def renamed_tensors(speculator: Speculator, rename: Callable[[str], str]) -> tuple[dict, dict]:
    """Unique tensors under exported names, and exported name -> every speclab alias of it.

    Tied parameters (one tensor under several names) are written once, as safetensors
    requires; `vocab.ids` is replaced by d2t and t2d, vLLM's vocabulary mapping.
    """
    tensors, weight_map, seen = {}, {}, {}
    for name, tensor in speculator.state_dict(keep_vars=False).items():
        if name == VOCAB_IDS:
            tensors.update(vocab_tensors(speculator))
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


def vocab_tensors(speculator: Speculator) -> dict[str, torch.Tensor]:
    return {"d2t": speculator.vocab.d2t().cpu().contiguous(),  # [N] draft id -> target id offset
            "t2d": speculator.vocab.t2d().cpu().contiguous()}  # [V] bool: target id is drafted


def mlp_speculator(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    c, target = speculator.config, speculator.target_info
    tensors, inner_dim = to_vllm(speculator)
    if not speculator.vocab.full:  # vLLM skips names it has no parameter for; speclab reloads its vocabulary
        tensors.update(vocab_tensors(speculator))
    config = {
        "architectures": ["MLPSpeculatorPreTrainedModel"],
        "model_type": "mlp_speculator",
        "vocab_size": target.vocab_size,
        "emb_dim": target.hidden_size,
        "inner_dim": inner_dim,  # speclab's + 1 when a reduced vocabulary was expanded (export_mlp.py)
        "n_predict": c.n_predict,
        "top_k_tokens_per_head": [1] * c.n_predict,
        "n_candidates": 1,
        "tie_weights": c.tie_weights,
        "scale_input": False,
        "torch_dtype": _dtype_name(speculator),
    }
    return tensors, config, {"conversion": "vllm_mlp"}


def hf_llama(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """draft_lm as LlamaForCausalLM: body.* -> model.*, head -> lm_head (full vocabulary: `refusals`)."""
    tensors, weight_map = renamed_tensors(
        speculator, lambda name: "lm_head.weight" if name == "head.weight" else "model." + name.removeprefix("body."))
    config = {**speculator.body.config.to_dict(), "architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "tie_word_embeddings": False, "torch_dtype": _dtype_name(speculator)}
    return tensors, config, {"weight_map": weight_map}


def speculators_eagle3(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    c, target = speculator.config, speculator.target_info
    verifier_name, verifier_arch = verifier_of(ctx, target.name, out)
    # eagle3.py already uses speculators' names; d2t/t2d only for a reduced vocabulary, as speculators saves them
    tensors, weight_map = renamed_tensors(speculator, lambda name: name)
    config = {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": speculator.vocab.size,
        "norm_before_residual": False,
        # vLLM sizes fc as 3 x target_hidden_size, so a draft narrower or wider than its target serves
        "target_hidden_size": target.hidden_size,
        # ids into the target's pre-norm residual stream (0: embeddings), as vLLM hands them (refusals)
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
            # speculators defines only the greedy chain proposal: a tree-scored run records its
            # tree in speclab.json and proposes chains of the tree's depth here
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": ctx.k,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": [verifier_arch] if verifier_arch else []},
        },
        "torch_dtype": _dtype_name(speculator),
    }
    return tensors, config, {"weight_map": weight_map}


def vllm_medusa(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """vLLM's Medusa: heads.i.(j+1).linear (after the identity projection) -> blocks.i.layers.j,
    out.linears.i -> lm_heads.i; a reduced vocabulary is vLLM's token_map (-inf elsewhere: exact)."""
    c, target = speculator.config, speculator.target_info

    def rename(name: str) -> str:
        if name.startswith("out.linears."):
            return name.replace("out.linears.", "lm_heads.", 1)
        _, head, block, _, param = name.split(".")  # heads.i.(j+1).linear.{weight,bias}
        return f"blocks.{head}.layers.{int(block) - 1}.{param}"

    tensors, weight_map = renamed_tensors(speculator, rename)
    if not speculator.vocab.full:
        tensors["token_map"] = speculator.vocab.ids.cpu().contiguous()  # [N] target ids, vLLM's name
    config = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size,
        "num_heads": c.num_heads,
        "num_hidden_layers": c.num_blocks,
        "truncated_vocab_size": speculator.vocab.size,
        "medusa_fc_bias": True,  # speclab's residual blocks have a bias
        "original_lm_head": c.output == "shared",  # one output layer for every head
        "torch_dtype": _dtype_name(speculator),
    }
    return tensors, config, {"weight_map": weight_map}


FOREIGN: dict[str, Callable] = {"mlp_speculator": mlp_speculator, "speculators_eagle3": speculators_eagle3,
                                "hf_llama": hf_llama, "vllm_medusa": vllm_medusa}


def verifier_of(ctx: ExportContext, target_name: str, out: Path) -> tuple[str | None, str | None]:
    """The verifier's hub id or local path, and its HF architecture.

    A known target is its hub id; a target that exists only in-process (tiny_llama) is saved
    into the export and named by the export's final path; any other is its recorded
    name_or_path, made absolute when it is a local directory.
    """
    target_config = ctx.meta.get("target_config") or {}
    builder = target_config.get("_target_")
    if builder in KNOWN_VERIFIERS:
        name, arch = KNOWN_VERIFIERS[builder]
        if name is None:
            name = save_verifier(target_config, out, ctx.final_dir)
        return name, arch
    name = target_config.get("name_or_path") or target_name
    if Path(name).is_dir():
        name = str(Path(name).resolve())
    try:  # a local directory or a cached hub id; no network is needed for either
        from transformers import AutoConfig

        archs = AutoConfig.from_pretrained(name, local_files_only=True).architectures or [None]
        return name, archs[0]
    except Exception:  # noqa: BLE001 - unknown is recorded as unknown, never guessed
        return name, None


def save_verifier(target_config: dict, out: Path, final_dir: Path | None) -> str:
    """Save the in-process target (weights, config, tokenizer) as out/verifier; -> its final path."""
    from .target_spec import parse_target_spec

    target = parse_target_spec(target_config, "the checkpoint's target_config").build()  # data, never code
    target.model.save_pretrained(out / VERIFIER_DIR)
    target.tokenizer.save_pretrained(out / VERIFIER_DIR)
    return str(((final_dir or out) / VERIFIER_DIR).resolve())


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
    if not model.vocab.full:  # ids = i + d2t[i], vLLM's convention
        model.vocab.ids.copy_(exported["d2t"] + torch.arange(exported["d2t"].numel()))
    if meta.get("conversion") == "vllm_mlp":
        state = from_vllm(model, exported)
    else:
        state = {alias: exported[name] for name, aliases in meta["weight_map"].items() for alias in aliases}
    if not model.vocab.full:
        state[VOCAB_IDS] = model.vocab.ids.clone()
    model.load_state_dict(state, strict=True)
    device = target.embed_weight.device if target is not None and target.embed_weight is not None else "cpu"
    return model.to(device).eval()


def _with_live_head(family: str, saved: TargetInfo, target: TargetInfo | None) -> TargetInfo:
    """Families that draft through the target's frozen tensors (its LM head) get the live target's."""
    needs = getattr(speculator_class(family), "target_tensors", ())
    if needs and target is None:
        raise ValueError(f"a {family} speculator drafts through its target's {', '.join(needs)}; pass the live target")
    return dataclasses.replace(saved, **{name: getattr(target, name) for name in needs})
