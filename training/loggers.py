"""The Lightning loggers of one training run: a CSV log in the run directory, plus wandb.

wandb is offline by default (config `wandb.mode`, which follows $WANDB_MODE when it is
set): the run's files go to `<run_dir>/wandb/` and need no network; `wandb sync` uploads
them later, and `wandb.mode=online` (after `wandb login`) streams them. The run's
resolved config is logged as the wandb config, Lightning's per-step metrics as history,
and `log_final` adds the measured acceptance and speedup to the run's summary.

The wandb run id is derived from the run directory, so the training process (possibly a
child process of the fault supervisor) and the evaluating parent write to the same run.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Mapping

from lightning.pytorch.loggers import CSVLogger, Logger

log = logging.getLogger(__name__)
WANDB_MODES = ("offline", "online", "disabled")


def build_loggers(run_dir: Path, cfg=None) -> list[Logger]:
    """CSV metrics in run_dir/logs/metrics.csv; a WandbLogger unless cfg.wandb.mode is disabled.

    Each training segment (a restarted attempt, or the loop after a rollback) builds new
    loggers, and Lightning's CSV logger starts its file afresh: the earlier segment's
    metrics.csv is kept first as metrics.segment-N.csv (N = 1, 2, ... in order).
    """
    keep_csv_segment(Path(run_dir) / "logs")
    loggers: list[Logger] = [CSVLogger(run_dir, name="logs", version="")]
    settings = wandb_settings(cfg)
    if settings["mode"] != "disabled":
        loggers.append(wandb_logger(Path(run_dir), settings, _plain(cfg)))
    return loggers


def keep_csv_segment(logs: Path) -> Path | None:
    """Move an existing logs/metrics.csv aside to the next free metrics.segment-N.csv."""
    current = logs / "metrics.csv"
    if not current.exists():
        return None
    n = 1
    while (logs / f"metrics.segment-{n}.csv").exists():
        n += 1
    kept = logs / f"metrics.segment-{n}.csv"
    current.rename(kept)
    return kept


def wandb_settings(cfg) -> dict:
    """cfg.wandb as a dict with a checked mode; `disabled` when cfg has no wandb block."""
    block = _plain(_get(cfg, "wandb")) or {}
    mode = block.get("mode") or "disabled"
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb.mode must be one of {WANDB_MODES}, got {mode!r}")
    return {"mode": mode, "project": block.get("project") or "speclab", "entity": block.get("entity"),
            "tags": list(block.get("tags") or [])}


def wandb_run_id(run_dir: Path) -> str:
    """A stable wandb id for a run directory (the same in a child and in its parent)."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def wandb_logger(run_dir: Path, settings: dict, config: Mapping | None) -> Logger:
    from lightning.pytorch.loggers import WandbLogger

    _finish_open_run()  # an earlier experiment of this process (a multirun) must not be reused
    return WandbLogger(save_dir=str(run_dir), name=run_dir.name, id=wandb_run_id(run_dir),
                       project=settings["project"], entity=settings["entity"], tags=settings["tags"],
                       mode=settings["mode"], config=dict(config or {}), resume="allow",
                       log_model=False)


def log_final(run_dir: Path, cfg, result: Mapping[str, Any]) -> None:
    """Add the run's measured acceptance, speedup and lossless check to its wandb summary."""
    settings = wandb_settings(cfg)
    if settings["mode"] == "disabled":
        return
    import wandb

    try:
        run = wandb.run
        if run is None or run.id != wandb_run_id(run_dir):  # training ran in another process
            _finish_open_run()
            run = wandb.init(dir=str(run_dir), id=wandb_run_id(run_dir), name=Path(run_dir).name,
                             project=settings["project"], entity=settings["entity"], tags=settings["tags"],
                             mode=settings["mode"], resume="allow", config=_plain(cfg) or {})
        final = final_metrics(result)
        run.log(final)
        run.summary.update(final)
        run.finish()
    except Exception as exc:  # noqa: BLE001  the logger is a copy: result.json already holds the figures
        # (seen: a sweep whose parent process had started a wandb service got "run ID is in use"
        # when reopening the run its training child had logged to)
        log.warning("wandb: the final metrics of %s were not logged (%s); result.json has them", run_dir,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def final_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The measured figures of result.json, flattened under `final/`."""
    acc, thr, lossless = (result.get(k) or {} for k in ("acceptance", "throughput", "lossless"))
    out = {
        "final/acceptance_length": acc.get("mean_acceptance_length"),
        "final/acceptance_rate": acc.get("acceptance_rate"),
        "final/speedup": thr.get("speedup"),
        "final/spec_tok_s": thr.get("spec_tok_s"),
        "final/baseline_tok_s": thr.get("baseline_tok_s"),
        "final/lossless_mismatches": lossless.get("mismatches"),
        "final/params": (result.get("speculator") or {}).get("params"),
    }
    out.update({f"final/acceptance_pos{i}": rate for i, rate in enumerate(acc.get("per_position") or [])})
    return {key: value for key, value in out.items() if isinstance(value, (int, float))}


def _finish_open_run() -> None:
    import wandb

    if wandb.run is not None:
        wandb.run.finish()


def _get(cfg, key: str):
    if cfg is None:
        return None
    return cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)


def _plain(cfg) -> dict | None:
    """A DictConfig (resolved) or a mapping as a plain dict."""
    if cfg is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra, a dependency
        pass
    return dict(cfg)
