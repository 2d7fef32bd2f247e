"""Test oracles: SGLang's `LlamaForCausalLMEagle3` (python/sglang/srt/models/llama_eagle3.py) and
TensorRT-LLM's `Eagle3ForCausalLM` (tensorrt_llm/_torch/models/modeling_speculative.py), rebuilt
from their published source in plain torch (neither installs on a CPU machine).

As each engine does it:
- built from config.json: hidden_size, heads, head_dim, intermediate_size, num_hidden_layers,
  rms_norm_eps, rope_theta, vocab_size, draft_vocab_size, target_hidden_size; fc is
  [hidden_size, 3 x target_hidden_size];
- loaded by the engine's rules. SGLang: a name it has a parameter for (after the `model.` prefix
  and fusing q/k/v into qkv_proj, gate/up into gate_up_proj) is loaded, any other is skipped
  silently; d2t becomes hot_token_id = d2t + arange. TensorRT-LLM: `layers.X.*` is renamed
  `midlayer[.X].*`, everything but lm_head is prefixed `model.`; d2t is an int32 parameter;
  names without a parameter are ignored. Both take the target's embedding when the draft is as
  wide as the target (SGLang's set_embed, TensorRT-LLM's embed_tokens = None), else the draft's;
- the target layers it captures: SGLang's layers_to_capture = [id + 1 for id in the config's
  eagle_config.eagle_aux_hidden_state_layer_ids], the residual stream entering that decoder layer
  (HF hidden_states[id + 1]); TensorRT-LLM's eagle3_layers_to_capture = the output of decoder layer
  id (the same HF hidden_states[id + 1]);
- run with the engine's maths: the first layer norms the embedding (input_layernorm) and the
  carried hidden (hidden_norm), attends over their concatenation (q/k/v read 2 x hidden_size),
  the residual is the un-normed hidden; RMSNorm(x, residual) adds first; later TensorRT-LLM layers
  add the residual back in and norm it with hidden_norm; SGLang's later layers start their
  residual from the previous layer's MLP output (a quirk the export refuses); logits =
  lm_head(norm(h + residual)) over the draft vocabulary, the carried hidden is h + residual (pre-norm);
- TensorRT-LLM's EAGLE-3.1 options (Eagle3DraftModel): eagle_config.norm_before_fc norms the
  captured layers with model.input_norm before fc (apply_eagle3_fc), and the config's norm_output
  (or eagle_config.return_hidden_post_norm) carries norm(h + residual) instead. SGLang's
  llama_eagle3.py has neither (the export refuses both there).

Drafting is driven as the engine drafts (its KV cache of committed positions, then a chain):
step p after committed position t reads token x_{t+1+p} at position t + p, attends to step 0's
keys at positions <= t and to its own chain's keys (teacher-forced here to compare every step).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_neox(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:  # x [T, h, dh]
    dh = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh)
    freqs = positions.float()[:, None] * inv[None]  # [T, dh/2]
    cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class EngineEagle3:
    """The parts both engines share: config, fused projections, a Llama layer's maths."""

    engine = ""

    def __init__(self, config: dict):
        self.config = config
        self.D, self.L = config["hidden_size"], config["num_hidden_layers"]
        self.heads, self.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        self.dh = config.get("head_dim") or self.D // self.heads
        self.eps, self.theta = config["rms_norm_eps"], config.get("rope_theta", 10000.0)
        self.H = config.get("target_hidden_size", self.D)
        self.V = config["vocab_size"]
        self.N = config.get("draft_vocab_size") or self.V
        self.params: dict[str, torch.Tensor] = {}
        self.embed: torch.Tensor | None = None
        self.input_norm = False  # a norm over the fused target layers before fc (TensorRT-LLM's norm_before_fc)
        self.carry_post_norm = False  # the next step reads the final norm's output (TensorRT-LLM's norm_output)

    def _layer_params(self, prefix: str, first: bool, input_norm: bool) -> dict[str, tuple]:
        d_in = 2 * self.D if first else self.D
        qkv = (self.heads + 2 * self.kv_heads) * self.dh
        I = self.config["intermediate_size"]
        shapes = {f"{prefix}.self_attn.qkv_proj.weight": (qkv, d_in),
                  f"{prefix}.self_attn.o_proj.weight": (self.D, self.heads * self.dh),
                  f"{prefix}.mlp.gate_up_proj.weight": (2 * I, self.D),
                  f"{prefix}.mlp.down_proj.weight": (self.D, I),
                  f"{prefix}.hidden_norm.weight": (self.D,),
                  f"{prefix}.post_attention_layernorm.weight": (self.D,)}
        if input_norm:
            shapes[f"{prefix}.input_layernorm.weight"] = (self.D,)
        return shapes

    def _load_fused(self, shapes: dict, name: str, tensor: torch.Tensor) -> bool:
        """q/k/v into qkv_proj, gate/up into gate_up_proj, at the shard offsets the engines use."""
        q, kv, I = self.heads * self.dh, self.kv_heads * self.dh, self.config["intermediate_size"]
        shards = {".q_proj": (".qkv_proj", 0, q), ".k_proj": (".qkv_proj", q, kv), ".v_proj": (".qkv_proj", q + kv, kv),
                  ".gate_proj": (".gate_up_proj", 0, I), ".up_proj": (".gate_up_proj", I, I)}
        for part, (fused, start, size) in shards.items():
            if part in name:
                name = name.replace(part, fused)
                if name not in shapes:
                    return False
                param = self.params.setdefault(name, torch.full(shapes[name], float("nan")))
                assert tensor.shape == (size, shapes[name][1]), f"{name}{part}: {tuple(tensor.shape)}"
                param[start : start + size] = tensor
                return True
        return False

    def _check_loaded(self, shapes: dict) -> None:
        missing = sorted(set(shapes) - set(self.params))
        assert not missing, f"{self.engine} would leave {missing} uninitialised"
        for name, shape in shapes.items():
            assert tuple(self.params[name].shape) == shape, f"{name}: {tuple(self.params[name].shape)} vs {shape}"
            assert not self.params[name].isnan().any(), f"{self.engine} would leave part of {name} uninitialised"

    # --- maths -----------------------------------------------------------------------

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return x @ self.params[name].T

    def norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.params[name], self.eps)

    def attention(self, prefix: str, x: torch.Tensor, positions: torch.Tensor, cache: dict, step: int) -> torch.Tensor:
        """x [T, d_in] at positions [T]; step 0 keeps its keys as the committed cache, a chain
        step attends to cache[<= t] and to the chain's keys at t (the engine's draft KV cache)."""
        T = x.shape[0]
        q, k, v = self.linear(f"{prefix}.self_attn.qkv_proj.weight", x).split(
            [self.heads * self.dh, self.kv_heads * self.dh, self.kv_heads * self.dh], -1)
        q = rope_neox(q.view(T, self.heads, self.dh), positions, self.theta)
        k = rope_neox(k.view(T, self.kv_heads, self.dh), positions, self.theta)
        v = v.view(T, self.kv_heads, self.dh)
        rep = self.heads // self.kv_heads
        if step == 0:
            cache[prefix] = {"k": k, "v": v, "chain": []}
        else:
            cache[prefix]["chain"].append((k, v))
        entry = cache[prefix]
        kp, vp = entry["k"].repeat_interleave(rep, 1), entry["v"].repeat_interleave(rep, 1)  # [T, h, dh]
        scale = self.dh ** -0.5
        prefix_scores = torch.einsum("thd,shd->ths", q, kp) * scale  # [T, h, T]
        visible = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
        prefix_scores = prefix_scores.masked_fill(~visible[:, None, :], float("-inf"))
        chain_k = [ck.repeat_interleave(rep, 1) for ck, _ in entry["chain"]]
        chain_v = [cv.repeat_interleave(rep, 1) for _, cv in entry["chain"]]
        chain_scores = [(q * ck).sum(-1, keepdim=True) * scale for ck in chain_k]  # [T, h, 1] each
        probs = torch.cat([prefix_scores, *chain_scores], -1).softmax(-1)
        out = torch.einsum("ths,shd->thd", probs[..., :T], vp)
        for j, cv in enumerate(chain_v):
            out = out + probs[..., T + j : T + j + 1] * cv
        return self.linear(f"{prefix}.self_attn.o_proj.weight", out.reshape(T, self.heads * self.dh))

    def mlp(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.linear(f"{prefix}.mlp.gate_up_proj.weight", x).chunk(2, -1)
        return self.linear(f"{prefix}.mlp.down_proj.weight", F.silu(gate) * up)

    def first_layer(self, prefix: str, embeds, hidden, positions, cache, step):
        residual = hidden
        x = torch.cat([self.norm(f"{prefix}.input_layernorm.weight", embeds),
                       self.norm(f"{prefix}.hidden_norm.weight", hidden)], -1)
        attn = self.attention(prefix, x, positions, cache, step)
        residual = attn + residual  # RMSNorm(x, residual): add, then norm
        return self.mlp(prefix, self.norm(f"{prefix}.post_attention_layernorm.weight", residual)), residual

    def regular_layer(self, prefix: str, hidden, positions, cache, step):
        residual = hidden
        attn = self.attention(prefix, self.norm(f"{prefix}.hidden_norm.weight", hidden), positions, cache, step)
        residual = attn + residual
        return self.mlp(prefix, self.norm(f"{prefix}.post_attention_layernorm.weight", residual)), residual

    # --- the engine's draft ----------------------------------------------------------

    def capture_ids(self) -> list[int]:
        """HF hidden_states indices of the captured target layers (both engines: id + 1)."""
        return [i + 1 for i in self.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def body(self, embeds, hidden, positions, cache, step) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def fc(self, features: torch.Tensor) -> torch.Tensor:
        if self.input_norm:
            features = self.norm("model.input_norm.weight", features)
        return self.linear("model.fc.weight", features)

    def step(self, tokens, hidden, positions, cache, step) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (draft logits [T, N], the carried hidden [T, D]: pre-norm, or the norm's output)."""
        embeds = self.embed[tokens]
        out, residual = self.body(embeds, hidden, positions, cache, step)
        normed = self.norm("model.norm.weight", out + residual)
        return self.linear("lm_head.weight", normed), normed if self.carry_post_norm else out + residual


class SGLangEagle3(EngineEagle3):
    engine = "SGLang"

    @classmethod
    def from_export(cls, path: str | Path, target_embed: torch.Tensor) -> "SGLangEagle3":
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        assert "LlamaForCausalLMEagle3" in config["architectures"]
        model = cls(config)
        shapes = {"model.embed_tokens.weight": (model.V, model.D), "model.fc.weight": (model.D, 3 * model.H),
                  "model.norm.weight": (model.D,), "lm_head.weight": (model.N, model.D),
                  **model._layer_params("model.midlayer", first=True, input_norm=True)}
        for i in range(1, model.L):  # BasicDecoderLayer: no input_layernorm
            shapes.update(model._layer_params(f"model.additional_layers.{i - 1}", first=False, input_norm=False))
        model.hot_token_id = None
        for name, tensor in load_file(str(path / "model.safetensors")).items():
            if "d2t" in name:
                model.hot_token_id = tensor + torch.arange(tensor.shape[0])
                continue
            if "t2d" in name:
                continue
            fused = name if name in shapes else f"model.{name}"
            if model._load_fused(shapes, fused, tensor):
                continue
            param = name if name in shapes else f"model.{name}"
            if param in shapes:
                assert tuple(tensor.shape) == shapes[param], f"{param}: {tuple(tensor.shape)} vs {shapes[param]}"
                model.params[param] = tensor.float()
        model._check_loaded(shapes)
        # set_embed: the target's embedding is shared unless the draft is of another width
        model.embed = model.params["model.embed_tokens.weight"] if model.H != model.D else target_embed.float()
        return model

    def body(self, embeds, hidden, positions, cache, step):
        out, residual = self.first_layer("model.midlayer", embeds, hidden, positions, cache, step)
        for i in range(1, self.L):
            out, residual = self.regular_layer(f"model.additional_layers.{i - 1}", out, positions, cache, step)
        return out, residual

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.hot_token_id is None else self.hot_token_id[draft_ids]


class TRTLLMEagle3(EngineEagle3):
    engine = "TensorRT-LLM"

    @classmethod
    def from_export(cls, path: str | Path, target_embed: torch.Tensor) -> "TRTLLMEagle3":
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        model = cls(config)
        # Eagle3DraftModel: _norm_before_fc from eagle_config, _return_hidden_post_norm from eagle_config's
        # return_hidden_post_norm or the config's norm_output
        eagle_config = config.get("eagle_config", {})
        model.input_norm = bool(eagle_config.get("norm_before_fc", False))
        model.carry_post_norm = bool(eagle_config.get("return_hidden_post_norm", False) or config.get("norm_output", False))
        mid = ["model.midlayer"] if model.L == 1 else [f"model.midlayer.{i}" for i in range(model.L)]
        shapes = {"model.fc.weight": (model.D, 3 * model.H), "model.norm.weight": (model.D,),
                  "lm_head.weight": (model.N, model.D)}
        if model.input_norm:
            shapes["model.input_norm.weight"] = (3 * model.H,)
        for i, prefix in enumerate(mid):  # next_layer_regular: only the first reads [embeds; hidden]
            shapes.update(model._layer_params(prefix, first=i == 0, input_norm=i == 0))
        if model.H != model.D:
            shapes["model.embed_tokens.weight"] = (model.V, model.D)
        if model.N != model.V:
            shapes["model.d2t"] = (model.N,)
        for name, tensor in load_file(str(path / "model.safetensors")).items():
            name = re.sub(r"^layers\.0\.", "midlayer.", name) if model.L == 1 else \
                re.sub(r"^layers\.(\d+)\.", r"midlayer.\1.", name)
            name = name if "lm_head" in name else f"model.{name}"
            if model._load_fused(shapes, name, tensor):
                continue
            if name in shapes:
                assert tuple(tensor.shape) == shapes[name], f"{name}: {tuple(tensor.shape)} vs {shapes[name]}"
                model.params[name] = tensor.to(torch.int32) if name == "model.d2t" else tensor.float()
        model._check_loaded(shapes)
        model.mid = mid
        model.embed = model.params["model.embed_tokens.weight"] if model.H != model.D else target_embed.float()
        return model

    def body(self, embeds, hidden, positions, cache, step):
        out, residual = self.first_layer(self.mid[0], embeds, hidden, positions, cache, step)
        for prefix in self.mid[1:]:
            out, residual = self.regular_layer(prefix, out + residual, positions, cache, step)
        return out, residual

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        d2t = self.params.get("model.d2t")
        return draft_ids if d2t is None else draft_ids + d2t[draft_ids].long()


ORACLES = {"sglang_eagle3": SGLangEagle3, "trtllm_eagle3": TRTLLMEagle3}


@torch.no_grad()
def engine_draft_logits(model: EngineEagle3, target, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The engine's draft logits [T - 1 - p, N] at each step p over one sequence [1, T]."""
    T = input_ids.shape[1]
    hs = target.model(input_ids, output_hidden_states=True).hidden_states
    captured = model.capture_ids()
    assert all(i < len(hs) - 1 for i in captured), f"{model.engine} captures decoder layers {captured}: past the target"
    hidden = model.fc(torch.cat([hs[i][0].float() for i in captured], -1))  # [T, D]
    cache, out = {}, []
    positions = torch.arange(T)
    for p in range(steps):
        tokens = F.pad(input_ids[0, 1 + p :], (0, 1 + p))  # x_{t+1+p} at t
        logits, hidden = model.step(tokens, hidden, positions + p, cache, p)
        out.append(logits[: T - 1 - p])
    return out
