"""The fingerprint of a speculator's weights, shared by checkpoints, result.json and export."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import torch


def weights_sha256(state_dict: Mapping[str, Any]) -> str:
    """sha256 over a state dict: each tensor's name, dtype, shape and raw bytes, by sorted name.

    Equal for the model in memory and for the same weights reloaded from safetensors, so
    an export can prove it ships the weights that were measured, and a resumed run can
    prove it ends where an uninterrupted one does.
    """
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is a {type(tensor).__name__}, not a tensor")
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        # Viewing as bytes works for every dtype, bf16 included (numpy has no bf16).
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        header = f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{list(tensor.shape)}|{len(raw)}"
        digest.update(header.encode())
        digest.update(raw)
    return digest.hexdigest()
