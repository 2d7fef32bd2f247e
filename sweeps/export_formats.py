"""Export layouts of a speculator checkpoint, and loading any of them back.

Each family with a serving engine is written in that engine's own layout, computing what
speclab measured (docs/serving.md is the table):

- `eagle3` -> vLLM's speculators format: config.json (`speculators_model_type`,
  `speculators_version`, `architectures`, `speculators_config` with the proposal method it
  was scored with and the verifier, `transformer_layer_config`, `draft_vocab_size`,
  `target_hidden_size`, `eagle_aux_hidden_state_layer_ids`) and model.safetensors with the
  names of speculators' `Eagle3DraftModel` (eagle3.py uses them; `vocab.ids` becomes `d2t`/`t2d`),
  `norm_output` for EAGLE-3.1.
- `dflash`, `dspark` -> the speculators format of `DFlashDraftModel` / `DSparkDraftModel`;
  `xpress`, `dflash2` -> the same format of `XPressDraftModel` / `DFlash2DraftModel`, which
  speculators loads and no engine is known to serve (CLIENT_ONLY: written by default, never
  counted servable).
- `peagle` -> the same format as speculators' `PEagleDraftModel` (`speculators_model_type: peagle`,
  `mask_token_id`, the `mask_hidden` tensor beside eagle3's).
- `mlp` -> the `mlp_speculator` layout of fms-extras / vLLM's `MLPSpeculator`, speclab's norm
  and draft vocabulary folded into the weights so vLLM's maths computes speclab's (export_mlp.py).
- `draft_lm` -> a plain `LlamaForCausalLM` over the full vocabulary (transformers' assisted
  generation, vLLM's draft-model method).
- `medusa` -> vLLM's `MedusaModel` (`blocks.i.layers.j`, `lm_heads.i`, `token_map`).
- `eagle3` under `--engine sglang` -> SGLang's `LlamaForCausalLMEagle3` (`midlayer.*`, a LlamaConfig
  with `draft_vocab_size`, `target_hidden_size`, `eagle_config`); under `--engine trtllm` ->
  TensorRT-LLM's `Eagle3ForCausalLM` (`midlayer[.i].*`, the same config); `eagle3`, `dflash` and
  `dspark` under `--engine llama.cpp` -> the speculators format beside a GGUF draft converted by
  llama.cpp's own converter.
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

import torch
from safetensors.torch import load_file, save_file

from speclab.speculator.base import Speculator, TargetInfo
from speclab.speculator.families import build_speculator, load_speculator, speculator_class

from .checkpoint_meta import SPECLAB_META, checkpoint_meta
from .engine_layouts import AFTER_WRITE, FOREIGN, VOCAB_IDS, ExportContext, refusals
from .export_mlp import from_vllm
from .speculators_import import is_speculators_checkpoint, load_speculators_checkpoint

__all__ = ["ENGINES", "ENGINE_LAYOUTS", "ExportContext", "SPECLAB_META", "checkpoint_meta", "layout_of", "load_checkpoint",
           "write_layout"]

log = logging.getLogger(__name__)



ENGINES = ("vllm", "sglang", "trtllm", "llama.cpp")  # `speclab export --engine`; vLLM is the default
# engine -> family -> its layout; a family missing under an engine has no layout for it
ENGINE_LAYOUTS = {
    "vllm": {"eagle3": "speculators_eagle3", "peagle": "speculators_peagle", "dflash": "speculators_dflash",
             "dspark": "speculators_dspark", "mlp": "mlp_speculator",
             "draft_lm": "hf_llama", "medusa": "vllm_medusa"},
    "sglang": {"eagle3": "sglang_eagle3"},
    "trtllm": {"eagle3": "trtllm_eagle3"},
    "llama.cpp": {"eagle3": "llama_cpp_eagle3", "dflash": "llama_cpp_dflash", "dspark": "llama_cpp_dspark"},
}
# Families written in a client's format that no engine is known to serve: the default export
# (`--engine vllm`) writes them so (speculators' own from_pretrained loads them), but a run of
# theirs is not servable (export.servable) and `--best` exports it beside a servable one.
CLIENT_ONLY = {"dflash2": "speculators_dflash2", "xpress": "speculators_xpress"}


def layout_of(family: str, engine: str = "vllm") -> str:
    """The family's layout for `engine`; speclab's own where vLLM has none. Another engine
    without a layout for the family is refused rather than silently given speclab's."""
    if engine not in ENGINE_LAYOUTS:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    layouts = ENGINE_LAYOUTS[engine]
    if engine != "vllm" and family not in layouts:
        raise ValueError(f"{engine} has no layout for the {family} family (it has one for: {', '.join(layouts)})")
    return layouts.get(family) or (CLIENT_ONLY.get(family, "speclab") if engine == "vllm" else "speclab")


def write_layout(out: Path, speculator: Speculator, ctx: ExportContext,
                 engine: str = "vllm") -> tuple[str, list[str]]:
    """Write `speculator` into out/ in its family's layout for `engine` -> (layout, why it fell back)."""
    layout = layout_of(speculator.family, engine)
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
    if layout in AFTER_WRITE:  # llama.cpp: its converter reads the written export
        AFTER_WRITE[layout](out, speculator, ctx)
    return layout, reasons


# --- loading any layout back -------------------------------------------------------------


def load_checkpoint(path: str | Path, target: TargetInfo | None = None) -> Speculator:
    """A speculator from a speclab checkpoint, from any export layout above, or from a checkpoint
    speculators saved (eagle3, peagle, dflash, dspark, xpress: speculators_import.py)."""
    path = Path(path)
    if not (path / SPECLAB_META).is_file():
        if is_speculators_checkpoint(path):  # trained by speculators itself, not exported by speclab
            if target is None:
                raise ValueError(f"{path} is a speculators checkpoint: pass the live target to read it")
            return load_speculators_checkpoint(path, target)
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
