"""The engine layouts an export is written in (export_formats.py dispatches to them): for each,
the reasons its engine could not run a given speculator as measured (`refusals`), and a writer
-> (tensors under the engine's names, its config.json, how speclab.json maps them back).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Callable

import torch

from speclab.speculator.base import Speculator

from .engines.llama_cpp import LLAMA_CPP_FILE
from .export_mlp import to_vllm
from .target_spec import current_name, parse_target_spec

SPECULATORS_VERSION = "0.1.0"  # the speculators config schema these fields follow
VOCAB_IDS = "vocab.ids"  # speclab's reduced-vocabulary buffer: exported as d2t (+ t2d)
# Target builders of speclab.speculator.target.builders -> (the verifier's hub id, its HF architecture);
# no hub id: the target exists only in-process, so the export saves it under VERIFIER_DIR.
KNOWN_VERIFIERS = {
    "speclab.speculator.target.builders.smollm2_from_gguf": ("HuggingFaceTB/SmolLM2-135M-Instruct", "LlamaForCausalLM"),
    "speclab.speculator.target.builders.tiny_llama": (None, "LlamaForCausalLM"),
}
VERIFIER_DIR = "verifier"
VLLM_EAGLE3_AUX_LAYERS = 3  # vLLM's EAGLE-3 fc reads exactly 3 x target_hidden_size
SPECULATORS_ARCHITECTURES = {"eagle3": "Eagle3Speculator", "peagle": "PEagleSpeculator"}
EAGLE3_AUX_LAYERS = VLLM_EAGLE3_AUX_LAYERS  # as do SGLang's, TensorRT-LLM's (by default) and llama.cpp's
# EAGLE-3 layout -> the engine that serves it (named in its refusals)
EAGLE3_ENGINES = {"speculators_eagle3": "vLLM", "sglang_eagle3": "SGLang", "trtllm_eagle3": "TensorRT-LLM",
                  "llama_cpp_eagle3": "llama.cpp"}
# Engines whose EAGLE-3 hands the next drafted step the state before the final norm (no EAGLE-3.1
# norm_output), and where their source does it
PRE_NORM_CARRY = {"SGLang": "models/llama_eagle3.py hands on the hidden state before its final norm",
                  "llama.cpp": "src/models/eagle3.cpp outputs t_h_nextn before output_norm"}
# A rope table size only: SGLang and TensorRT-LLM read it from the draft's config, and it covers the targets' contexts
DRAFT_MAX_POSITIONS = 32768


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


def refusals(speculator: Speculator, layout: str) -> list[str]:
    """Why the engine behind `layout` could not run this speculator as speclab measured it."""
    if layout in EAGLE3_ENGINES:
        return eagle3_refusals(speculator, EAGLE3_ENGINES[layout])
    if layout == "speculators_peagle":  # P-EAGLE reads the target as EAGLE-3 does, served by vLLM
        return eagle3_refusals(speculator, "vLLM")
    if layout in ("speculators_dflash", "speculators_dflash2", "speculators_dspark", "speculators_xpress",
                  "llama_cpp_dflash", "llama_cpp_dspark"):
        engine = "llama.cpp" if layout.startswith("llama_cpp") else "vLLM"
        L, ids, out = speculator.target_info.num_layers, list(speculator.target_layer_ids), []
        if any(i >= L for i in ids):
            out.append(f"target layer {L} was read after the final norm (HF hidden_states[{L}]), but {engine} hands "
                       f"the draft the pre-norm residual stream; train on layers 0..{L - 1}")
        if speculator.vocab.full and speculator.config.head == "trained":
            out.append("speculators reloads a full-vocabulary DFlash head from the verifier, and this draft trained "
                       "its own; train with head=frozen or a reduced draft_vocab_size")
        if engine == "llama.cpp" and speculator.vocab.full:
            out.append("llama.cpp's converter drops a full-vocabulary draft head and the draft then decodes through "
                       "whatever token table its GGUF holds, which speclab has not checked against its own head; "
                       "train with a reduced draft_vocab_size (its head and d2t are converted)")
        if layout == "speculators_dflash2" and not speculator.vocab.full:
            out.append(f"speculators' DFlash2 drafts over the verifier's whole vocabulary, and this draft's head and "
                       f"selector cover {speculator.vocab.size} of its {speculator.vocab.target_vocab} tokens; train "
                       "with draft_vocab_size=0")
        if layout == "llama_cpp_dspark" and speculator.config.markov_head != "vanilla":
            out.append(f"llama.cpp's converter takes only the vanilla Markov head; this draft has "
                       f"markov_head={speculator.config.markov_head}")
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


def eagle3_refusals(speculator: Speculator, engine: str) -> list[str]:
    """EAGLE-3 as each engine computes it: three distinct pre-norm target layers in ascending
    order (all of them); SGLang's and TensorRT-LLM's layer ids count decoder-layer outputs (id
    i - 1 names speclab's i), so the embeddings (speclab's 0) cannot be named; both replace the
    draft's embedding by the target's when the draft is as wide as the target; SGLang's later
    layers restart the residual stream. Of EAGLE-3.1's options SGLang runs neither, llama.cpp only
    norm_before_fc (its graph always carries the pre-norm state), TensorRT-LLM both, vLLM both
    (norm_output from a release with its PR #46488: docs/serving.md)."""
    c = speculator.config
    L, ids = speculator.target_info.num_layers, list(speculator.target_layer_ids)
    out = []
    if len(set(ids)) != EAGLE3_AUX_LAYERS:
        out.append(f"{engine}'s EAGLE-3 reads exactly {EAGLE3_AUX_LAYERS} distinct target layers "
                   f"(its fc is [D, 3 x target_hidden_size]); this draft fuses {ids}")
    if ids != sorted(ids):
        out.append(f"{engine} concatenates the target layers in ascending order; this draft fuses {ids} in another")
    if any(i >= L for i in ids):
        out.append(f"target layer {L} was read after the final norm (HF hidden_states[{L}]), but {engine} hands "
                   f"the draft the pre-norm residual stream; train on layers 0..{L - 1}")
    if engine in ("SGLang", "TensorRT-LLM"):
        if 0 in ids:
            out.append(f"{engine} names a target layer by the decoder layer whose output it is, so the "
                       "embeddings (layer 0) cannot be named; train on layers 1..L-1")
        if c.hidden_size == speculator.target_info.hidden_size and c.embedding == "trained":
            out.append(f"{engine} replaces the draft's token embedding by the target's when the draft is as wide "
                       "as the target, and this draft trained its own (embedding=trained)")
    if engine in PRE_NORM_CARRY and getattr(c, "norm_output", False):  # peagle's config has no norm_output
        out.append(f"{engine}'s EAGLE-3 carries the pre-norm state to the next drafted step ({PRE_NORM_CARRY[engine]}); "
                   "this draft is EAGLE-3.1 (norm_output), which carries the final norm's output")
    if engine == "SGLang" and c.norm_before_fc:
        out.append("SGLang's EAGLE-3 has no norm over the fused target layers before fc (its loader skips "
                   "input_norm.weight without a word); this draft has norm_before_fc")
    if engine == "llama.cpp" and c.num_layers > 1:
        out.append("llama.cpp's EAGLE-3 has one decoder layer (its converter takes a draft of num_hidden_layers 1, "
                   f"its graph asserts n_layer == 1); this draft has {c.num_layers}")
    if engine == "SGLang" and c.num_layers > 1:
        out.append("SGLang's EAGLE-3 layers after the first restart the residual stream from the previous "
                   f"layer's MLP output (llama_eagle3.py BasicDecoderLayer); this draft has {c.num_layers} layers")
    return out


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
    return _speculators_format(speculator, ctx, out, "eagle3", {
        "norm_output": speculator.config.norm_output,  # EAGLE-3.1: the carried feature is the final norm's output
        "norm_before_fc": speculator.config.norm_before_fc,  # input_norm over the fused target layers
        "embed_requires_grad": speculator.config.embedding == "trained",
    })


def speculators_peagle(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """P-EAGLE: eagle3's format plus `mask_token_id` and the `mask_hidden` tensor; it proposes a block
    of `block_size` (speculators names the depths its `speculative_tokens`)."""
    return _speculators_format(speculator, ctx, out, "peagle", {
        "norm_output": False,  # P-EAGLE feeds nothing back: no drafted position reads another's output
        "norm_before_fc": speculator.config.norm_before_fc,
        "mask_token_id": speculator.mask_token_id,
        "embed_requires_grad": speculator.config.embedding == "trained",
    }, speculative_tokens=speculator.config.block_size)


def llama_layer_fields(c) -> dict:
    """The Llama decoder-layer fields of an EAGLE-3 draft's config (eagle3 / peagle config `c`),
    as every engine's layout states them: speclab's layers are these exactly."""
    return {
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
    }


def _speculators_format(speculator: Speculator, ctx: ExportContext, out: Path, kind: str, extra: dict,
                        speculative_tokens: int | None = None) -> tuple[dict, dict, dict]:
    c, target = speculator.config, speculator.target_info
    verifier_name, verifier_arch = verifier_of(ctx, target.name, out)
    # eagle3.py / peagle.py already use speculators' names; d2t/t2d only for a reduced vocabulary, as speculators saves them
    tensors, weight_map = renamed_tensors(speculator, lambda name: name)
    config = {
        "speculators_model_type": kind,
        "speculators_version": SPECULATORS_VERSION,
        "architectures": [SPECULATORS_ARCHITECTURES[kind]],
        "draft_vocab_size": speculator.vocab.size,
        "norm_before_residual": False,
        **extra,
        # vLLM sizes fc as 3 x target_hidden_size, so a draft narrower or wider than its target serves
        "target_hidden_size": target.hidden_size,
        # ids into the target's pre-norm residual stream (0: embeddings), as vLLM hands them (refusals)
        "eagle_aux_hidden_state_layer_ids": list(speculator.target_layer_ids),
        "transformer_layer_config": {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": target.vocab_size,
            **llama_layer_fields(c),
        },
        "speculators_config": {
            "algorithm": kind,
            # speculators defines only the greedy chain proposal: a tree-scored run records its
            # tree in speclab.json and proposes chains of the tree's depth here
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens or ctx.k,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": [verifier_arch] if verifier_arch else []},
        },
        "torch_dtype": _dtype_name(speculator),
    }
    return tensors, config, {"weight_map": weight_map}


def speculators_dflash(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """dflash.py (dspark.py, xpress.py, dflash2.py) already use speculators' `DFlashDraftModel` (`DSparkDraftModel`,
    `XPressDraftModel`, `DFlash2DraftModel`) names; its layers are Qwen3's
    (q/k norms), so the layer config is a Qwen3Config. The embedding is the verifier's (not
    saved, as speculators saves none); a reduced vocabulary's head and d2t/t2d are."""
    c, target = speculator.config, speculator.target_info
    verifier_name, verifier_arch = verifier_of(ctx, target.name, out)
    tensors, weight_map = renamed_tensors(speculator, lambda name: name)
    kind = speculator.family  # dflash, or dspark / xpress / dflash2 (dflash's config plus their parts')
    config = {
        "speculators_model_type": kind,
        "speculators_version": SPECULATORS_VERSION,
        "architectures": [{"dflash": "DFlashSpeculator", "dspark": "DSparkSpeculator", "xpress": "XPressSpeculator",
                           "dflash2": "DFlash2DraftModel"}[kind]],
        "draft_vocab_size": speculator.vocab.size,
        "block_size": c.block_size,
        "target_hidden_size": target.hidden_size,
        "aux_hidden_state_layer_ids": list(speculator.target_layer_ids),
        "mask_token_id": speculator.mask_token_id,
        # dflash: slot 0 is the pending (bonus) token, slots 1.. draft; dspark: every slot drafts
        "sample_from_anchor": speculator.first_slot == 0,
        "sliding_window_non_causal": False,
        "transformer_layer_config": {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "vocab_size": target.vocab_size,
            "hidden_size": target.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta,
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
        },
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": min(ctx.k, speculator.max_draft_len()),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": [verifier_arch] if verifier_arch else []},
        },
        "torch_dtype": _dtype_name(speculator),
    }
    if kind == "dspark":  # no confidence head: speclab verifies every drafted slot (dspark.py)
        config.update(markov_rank=c.markov_rank, markov_head_type=c.markov_head,
                      enable_confidence_head=False, confidence_head_with_markov=False)
    if kind == "xpress":  # Jacobi passes settle the block in at most block_size - 1 (xpress.py)
        config.update(xpress_rank=c.xpress_rank, xpress_mlp_ratio=c.xpress_mlp_ratio,
                      num_jacobi_passes=c.block_size - 1)
    if kind == "dflash2":
        config.update(conv_kernel_size=c.conv_kernel_size, conv_group_size=c.conv_group_size,
                      selector_rank=c.selector_rank, selector_top_k=c.selector_top_k)
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
        "num_heads": c.n_predict,  # vLLM's Medusa name for the chain length
        "num_hidden_layers": c.num_blocks,
        "truncated_vocab_size": speculator.vocab.size,
        "medusa_fc_bias": True,  # speclab's residual blocks have a bias
        "original_lm_head": c.output == "shared",  # one output layer for every head
        "torch_dtype": _dtype_name(speculator),
    }
    return tensors, config, {"weight_map": weight_map}


def eagle3_llama_config(speculator: Speculator, architecture: str) -> dict:
    """The EAGLE-3 draft's config.json as SGLang and TensorRT-LLM read it (a LlamaConfig with
    draft_vocab_size, target_hidden_size and SpecForge's eagle_config, as published EAGLE-3
    drafts have): their aux layer ids count decoder-layer outputs, speclab's layer i is id i - 1."""
    c, target = speculator.config, speculator.target_info
    return {
        "architectures": [architecture],
        "model_type": "llama",
        **llama_layer_fields(c),  # tie_word_embeddings false: its own lm_head over the draft vocabulary
        "max_position_embeddings": DRAFT_MAX_POSITIONS,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": speculator.vocab.size,
        "target_hidden_size": target.hidden_size,
        # TensorRT-LLM's Eagle3DraftModel reads both EAGLE-3.1 options (SGLang's reads neither: eagle3_refusals)
        "norm_output": c.norm_output,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in speculator.target_layer_ids],
                         "use_aux_hidden_state": True, "norm_before_fc": c.norm_before_fc},
        "torch_dtype": _dtype_name(speculator),
    }


def sglang_eagle3(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """SGLang's `LlamaForCausalLMEagle3` (models/llama_eagle3.py): layers.0.* -> midlayer.* (its
    loader prefixes model. and fuses q/k/v, gate/up; a name it has no parameter for is skipped
    silently, so speclab's names would leave the layer uninitialised); d2t becomes its hot token ids."""
    tensors, weight_map = renamed_tensors(speculator, lambda name: re.sub(r"^layers\.0\.", "midlayer.", name))
    return tensors, eagle3_llama_config(speculator, "LlamaForCausalLMEagle3"), {"weight_map": weight_map}


def trtllm_eagle3(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """TensorRT-LLM's `Eagle3ForCausalLM` (_torch/models/modeling_speculative.py): one layer is
    midlayer.*, several are midlayer.i.*, whose later layers norm their input with hidden_norm
    (`next_layer_regular`: no input_layernorm there)."""
    several = speculator.config.num_layers > 1

    def rename(name: str) -> str:
        match = re.match(r"^layers\.(\d+)\.(.*)$", name)
        if not match:
            return name
        i, rest = int(match[1]), match[2]
        if i > 0 and rest == "input_layernorm.weight":
            rest = "hidden_norm.weight"
        return f"midlayer.{i}.{rest}" if several else f"midlayer.{rest}"

    tensors, weight_map = renamed_tensors(speculator, rename)
    return tensors, eagle3_llama_config(speculator, "LlamaForCausalLMEagle3"), {"weight_map": weight_map}


def llama_cpp_eagle3(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """The speculators format, which llama.cpp's converter reads (its ids count pre-norm layer
    inputs, as vLLM's do); `llama_cpp_gguf` converts it once written. llama.cpp requires the
    draft's context length (`eagle3.context_length`, from max_position_embeddings)."""
    tensors, config, mapping = speculators_eagle3(speculator, ctx, out)
    config["transformer_layer_config"]["max_position_embeddings"] = DRAFT_MAX_POSITIONS
    return tensors, config, mapping




def llama_cpp_block(speculator: Speculator, ctx: ExportContext, out: Path) -> tuple[dict, dict, dict]:
    """dflash and dspark: the speculators format (vLLM's), which llama.cpp's converter reads
    (engines/llama_cpp.convert_draft); `llama_cpp_gguf` converts it once written. llama.cpp requires
    the draft's context length (`dflash.context_length`, from max_position_embeddings)."""
    tensors, config, mapping = speculators_dflash(speculator, ctx, out)
    config["transformer_layer_config"]["max_position_embeddings"] = DRAFT_MAX_POSITIONS
    return tensors, config, mapping


def llama_cpp_gguf(out: Path, speculator: Speculator, ctx: ExportContext) -> None:
    """out/draft.gguf through llama.cpp's own converter (the target's tokenizer and config from
    its HF directory); an HF-directory target is converted too (target.gguf)."""
    from .engines import llama_cpp

    target_dir, target_gguf = _llama_cpp_target(ctx, out)
    engine = llama_cpp.require()
    llama_cpp.convert_draft(engine, speculator.family, out, target_dir, out / "draft.gguf")
    final = (ctx.final_dir or out).resolve()
    k = min(ctx.k, speculator.max_draft_len() or ctx.k)  # a tree-scored run: its depth; a block: at most its drafts
    spec_type = llama_cpp.SPEC_TYPES[speculator.family]
    (out / LLAMA_CPP_FILE).write_text(json.dumps({
        "engine": f"llama.cpp {engine.info['version']} ({llama_cpp.PACKAGE})",
        "draft": "draft.gguf",
        "target_gguf": str(target_gguf),
        "spec_type": spec_type,
        "k": k,
        "serve": " ".join(["llama-server", "-m", str(target_gguf), *llama_cpp.NO_REPACK,
                           *llama_cpp.draft_args(final / "draft.gguf", spec_type, k)]),
    }, indent=2) + "\n")


def _llama_cpp_target(ctx: ExportContext, out: Path) -> tuple[Path, Path]:
    """(the target's HF directory for the converter, the target's GGUF llama.cpp decodes)."""
    from speclab.speculator.target.builders import converted_smollm2_dir, smollm2_gguf_path

    from .engines import llama_cpp

    target_config = ctx.meta.get("target_config") or {}
    builder = current_name(target_config.get("_target_"))
    if builder == "speclab.speculator.target.builders.smollm2_from_gguf":
        return converted_smollm2_dir(), smollm2_gguf_path()  # the shipped Q4_1 GGUF is the target as is
    if builder in KNOWN_VERIFIERS:
        raise ValueError("llama.cpp cannot load the in-process test target: its converter does not recognise the "
                         "tiny tokenizer's BPE pre-tokenizer ('The BPE pre-tokenizer was not recognized'); export a "
                         "SmolLM2 or an HF-directory target for llama.cpp")
    name = target_config.get("name_or_path")
    if not name or not Path(name).is_dir():
        raise ValueError(f"llama.cpp's converter needs the target's HF directory; the target {name!r} is not one")
    gguf = llama_cpp.convert_target(llama_cpp.require(), Path(name), out / "target.gguf")
    return Path(name), (ctx.final_dir or out).resolve() / gguf.name


# layout -> what runs once its files are written
AFTER_WRITE: dict[str, Callable] = {"llama_cpp_eagle3": llama_cpp_gguf, "llama_cpp_dflash": llama_cpp_gguf,
                                    "llama_cpp_dspark": llama_cpp_gguf}

FOREIGN: dict[str, Callable] = {"mlp_speculator": mlp_speculator, "speculators_eagle3": speculators_eagle3,
                                "speculators_peagle": speculators_peagle,
                                "speculators_dflash": speculators_dflash, "speculators_dspark": speculators_dflash,
                                "speculators_xpress": speculators_dflash, "speculators_dflash2": speculators_dflash,
                                "hf_llama": hf_llama,
                                "vllm_medusa": vllm_medusa, "sglang_eagle3": sglang_eagle3,
                                "trtllm_eagle3": trtllm_eagle3, "llama_cpp_eagle3": llama_cpp_eagle3,
                                "llama_cpp_dflash": llama_cpp_block, "llama_cpp_dspark": llama_cpp_block}


def verifier_of(ctx: ExportContext, target_name: str, out: Path) -> tuple[str | None, str | None]:
    """The verifier's hub id or local path, and its HF architecture.

    A known target is its hub id; a target that exists only in-process (tiny_llama) is saved
    into the export and named by the export's final path; any other is its recorded
    name_or_path, made absolute when it is a local directory.
    """
    target_config = ctx.meta.get("target_config") or {}
    builder = current_name(target_config.get("_target_"))
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
    target = parse_target_spec(target_config, "the checkpoint's target_config").build()  # data, never code
    target.model.save_pretrained(out / VERIFIER_DIR)
    target.tokenizer.save_pretrained(out / VERIFIER_DIR)
    return str(((final_dir or out) / VERIFIER_DIR).resolve())


def _dtype_name(speculator: Speculator) -> str:
    return str(next(speculator.parameters()).dtype).removeprefix("torch.")
