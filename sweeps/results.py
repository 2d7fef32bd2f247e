"""result.json: the record a run leaves behind, written atomically as its last act.

Run directories are the only record (every results table is read from them), so a
result.json must never be seen half-written: it is written to a temporary file in the
same directory, fsynced, renamed over the old one, and the directory entry is fsynced.

The fields are docs/design.md's (its "result.json" section: add more, never rename these).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from speclab.kernels.util.cache_lock import write_atomic

RESULT_FILE = "result.json"
PROCESS_FILE = "process.json"  # {pid, host} of the process running the run, until result.json exists
STATUSES = ("completed", "failed")
# A directory holding this file is an export of some run, not a run: the index skips it
# even when it lies under the runs directory.
EXPORT_MANIFEST = "export.json"
# Where the lead's runner saves the speculator inside a run directory (result.json's
# `checkpoint` field normally names it); also the two files a speculator checkpoint holds.
SPECULATOR_SUBDIR = Path("checkpoints") / "speculator"
SPECULATOR_FILES = ("model.safetensors", "config.json")
MAX_ERROR_CHARS = 500  # `error` is one line; a whole traceback belongs in the logs
# mkstemp/mkdtemp create owner-only entries; results on a shared filesystem must stay
# readable by the rest of the team (the dashboard, other users' exports).
SHARED_FILE_MODE = 0o644
SHARED_DIR_MODE = 0o755


def new_result(run_id: str, config: Mapping[str, Any] | None = None) -> dict:
    """A result skeleton with every docs/design.md field, counters at 0 and measures at None."""
    return {
        "run_id": run_id,
        "status": "completed",
        "error": None,
        "config": dict(config or {}),
        "speculator": {"family": None, "params": 0},
        "acceptance": {
            "k": 0,
            "num_drafts": 0,
            "num_draft_tokens": 0,
            "num_accepted_tokens": 0,
            "acceptance_rate": None,
            "mean_acceptance_length": None,
            "per_position": [],
        },
        "throughput": {"baseline_tok_s": None, "spec_tok_s": None, "speedup": None},
        "lossless": {"checked_prompts": 0, "mismatches": 0},
        "train": {"steps": 0, "tokens": 0, "wall_s": 0.0, "final_loss": None, "restarts": 0, "rollbacks": 0},
        "checkpoint": None,
        "final_weights_sha256": None,
    }


def failed_result(
    run_id: str,
    config: Mapping[str, Any] | None,
    error: BaseException | str,
    partial: Mapping[str, Any] | None = None,
) -> dict:
    """A failed run's record: the skeleton, whatever was measured before the failure
    (`partial`, merged one level deep), status "failed" and a one-line error."""
    result = new_result(run_id, config)
    for key, value in (partial or {}).items():
        if isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key].update(value)
        else:
            result[key] = value
    result["status"] = "failed"
    result["error"] = one_line_error(error)
    return result


def one_line_error(error: BaseException | str) -> str:
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    else:
        text = str(error)
    text = " ".join(text.split())  # newlines and runs of spaces -> single spaces
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


# --- reading and writing ------------------------------------------------------------------


def write_result(run_dir: str | Path, result: Mapping[str, Any]) -> Path:
    """Atomically write `run_dir/result.json`; returns its path."""
    status = result.get("status")
    if status not in STATUSES:
        raise ValueError(f"result status {status!r} is not one of {list(STATUSES)}")
    if not result.get("run_id"):
        raise ValueError("result has no run_id")
    return write_json_atomic(Path(run_dir) / RESULT_FILE, result)


def read_result(run_dir: str | Path) -> dict:
    path = Path(run_dir) / RESULT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(result, dict):
        raise ValueError(f"{path} holds a JSON {type(result).__name__}, not an object")
    return result


# result.json's schema as readers rely on it: section -> field -> accepted kinds. A field may be
# absent (older runs), but one present with another type makes the record malformed.
_NUMBER, _COUNT, _TEXT = "a finite number or null", "a whole number >= 0", "a string or null"
RESULT_SCHEMA: dict[str, dict[str, str]] = {
    "speculator": {"family": _TEXT, "params": _COUNT},
    "acceptance": {"k": _COUNT, "num_drafts": _COUNT, "num_draft_tokens": _COUNT, "num_accepted_tokens": _COUNT,
                   "acceptance_rate": _NUMBER, "mean_acceptance_length": _NUMBER,
                   "per_position": "a list of finite numbers"},
    "throughput": {"baseline_tok_s": _NUMBER, "spec_tok_s": _NUMBER, "speedup": _NUMBER},
    "lossless": {"checked_prompts": _COUNT, "mismatches": _COUNT},
    "train": {"steps": _COUNT, "tokens": _COUNT, "final_loss": _NUMBER, "restarts": _COUNT, "rollbacks": _COUNT},
}


def _fits(value: Any, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == _NUMBER:
        return value is None or (number and math.isfinite(value))
    if kind == _COUNT:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == _TEXT:
        return value is None or isinstance(value, str)
    return isinstance(value, list) and all(_fits(v, _NUMBER) and v is not None for v in value)


def result_problem(result: Any) -> str | None:
    """Why `result` is not a result.json readers can use (None: it is one)."""
    if not isinstance(result, dict):
        return f"holds a JSON {type(result).__name__}, not an object"
    if not isinstance(result.get("run_id"), str) or not result["run_id"]:
        return "run_id is not a non-empty string"
    if result.get("status") not in STATUSES:
        return f"status {result.get('status')!r} is not one of {list(STATUSES)}"
    for key in ("error", "checkpoint", "final_weights_sha256"):
        if not _fits(result.get(key), _TEXT):
            return f"{key} is not {_TEXT}"
    for section, fields in RESULT_SCHEMA.items():
        block = result.get(section, {})
        if not isinstance(block, dict):
            return f"{section} is not an object"
        for name, kind in fields.items():
            if name in block and not _fits(block[name], kind):
                return f"{section}.{name} = {json.dumps(block[name], default=str)[:40]} is not {kind}"
    return None


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write strict JSON so that a reader sees the old file or the new one, never a mix."""
    text = json.dumps(_finite(data), indent=2, default=_json_default, allow_nan=False) + "\n"
    return write_atomic(path, text.encode(), SHARED_FILE_MODE)


def _finite(value: Any) -> Any:
    """NaN/inf -> None: strict JSON, readable by any tool (a diverged loss is already
    told by status and error)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    """Paths, tensors and numpy values, which metrics code often hands over."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and numpy scalars
        return _finite(value.tolist())
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


# --- the speculator checkpoint of a run ----------------------------------------------------


def is_speculator_checkpoint(path: str | Path) -> bool:
    return all((Path(path) / name).is_file() for name in SPECULATOR_FILES)


def find_speculator_checkpoint(path: str | Path) -> Path:
    """A speculator checkpoint directory, given it, a run directory or an export directory.

    A run directory is followed through result.json's `checkpoint` field, else through
    the standard `checkpoints/speculator/` location.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory")
    if is_speculator_checkpoint(path):
        return path
    candidates = []
    if (path / RESULT_FILE).is_file():
        checkpoint = read_result(path).get("checkpoint")
        if checkpoint:
            candidates.append(path / checkpoint)
    candidates.append(path / SPECULATOR_SUBDIR)
    for candidate in candidates:
        if is_speculator_checkpoint(candidate):
            return candidate
    raise FileNotFoundError(
        f"{path} holds no speculator checkpoint: expected {' + '.join(SPECULATOR_FILES)} in it, "
        f"in result.json's `checkpoint` directory, or in {SPECULATOR_SUBDIR}/"
    )


# --- weights fingerprint -----------------------------------------------------------------


def weights_sha256(state_dict: Mapping[str, Any]) -> str:
    """sha256 of a state dict (see speclab.kernels.util.digest)."""
    # Imported here, so that `speclab runs` does not pay torch's import time.
    from speclab.kernels.util.digest import weights_sha256 as digest

    return digest(state_dict)
