"""wandb, offline: a real Lightning fit through build_loggers, then log_final; the offline
run's transaction log (.wandb) must hold the config, per-step metrics and final figures."""

import os
import struct
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from speclab.training.loggers import build_loggers, final_metrics, log_final, wandb_run_id


BLOCK = 32 * 1024  # the .wandb transaction log is LevelDB's log format: 32 KiB blocks
FILE_HEADER = struct.Struct("<4sHB")  # b":W&B", magic 0xBEE1, format version
RECORD_HEADER = struct.Struct("<IHB")  # crc32, payload length, kind (1 full, 2 first, 3 middle, 4 last)


def read_records(run_dir):
    """Every record of the offline run's .wandb file (wandb 0.31 ships no reader of its own)."""
    from wandb.proto import wandb_internal_pb2

    paths = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(paths) == 1, f"expected one offline run's .wandb file, found {paths}"
    data = paths[0].read_bytes()
    ident, magic, version = FILE_HEADER.unpack_from(data)
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic, version)
    records, pos, pending = [], FILE_HEADER.size, b""
    while pos + RECORD_HEADER.size <= len(data):
        if BLOCK - pos % BLOCK < RECORD_HEADER.size:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = RECORD_HEADER.unpack_from(data, pos)
        pos += RECORD_HEADER.size
        if kind == 0 and length == 0:  # zero padding at the end of the written part
            break
        pending += data[pos:pos + length]
        pos += length
        if kind in (1, 4):  # a full record, or the last fragment of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def key(item) -> str:
    """A config/history/summary item's name: `key`, or `nested_key` parts in newer wandb."""
    return item.key or "/".join(item.nested_key)


FIT_AND_LOG = """
import sys
from pathlib import Path

import lightning as L
import torch
from omegaconf import OmegaConf

from speclab.training.loggers import build_loggers, log_final


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


run_dir = Path(sys.argv[1])
cfg = OmegaConf.create({"wandb": {"mode": "offline", "project": "speclab", "entity": None, "tags": ["test"]},
                        "speculator": {"family": "mlp", "inner_dim": 16}})
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2)
trainer = L.Trainer(max_steps=4, logger=build_loggers(run_dir, cfg), log_every_n_steps=1,
                    enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
trainer.fit(Tiny(), loader)
result = {"acceptance": {"mean_acceptance_length": 1.75, "acceptance_rate": 0.25, "per_position": [0.5, 0.25]},
          "throughput": {"speedup": 1.31, "spec_tok_s": 13.1, "baseline_tok_s": 10.0},
          "lossless": {"mismatches": 0}, "speculator": {"params": 1234}}
log_final(run_dir, cfg, result)
"""


def test_offline_run_logs_config_steps_and_final_figures(tmp_path):
    """In a process of its own, as a training run is: wandb keeps process-wide state (its
    service, its current run, logging handlers) that earlier tests of the suite change; with
    them this test once read a .wandb file holding no run record, and never alone."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"} | {"WANDB_SILENT": "true"}
    done = subprocess.run([sys.executable, "-c", FIT_AND_LOG, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    child_log = done.stdout + done.stderr  # shown by the asserts below
    assert done.returncode == 0, child_log
    records = read_records(tmp_path)
    assert {r.run.run_id for r in records if r.HasField("run")} == {wandb_run_id(tmp_path)}
    configs = [r.run.config for r in records if r.HasField("run")] + [r.config for r in records if r.HasField("config")]
    config = {key(item): item.value_json for c in configs for item in c.update}
    assert '"mlp"' in config["speculator"] and "16" in config["speculator"]
    steps = [r.history for r in records if r.HasField("history")]
    losses = [i for h in steps for i in h.item if key(i) == "train/loss"]
    assert len(losses) == 4, f"one loss per training step expected, got {len(losses)}; log: {child_log!r}"
    summary = {key(i): i.value_json for r in records if r.HasField("summary") for i in r.summary.update}
    # log_final turns a wandb failure into a warning (the run must not fail): show it if it happened.
    assert "final/speedup" in summary, f"no final figures in the summary; log: {child_log!r}"
    assert float(summary["final/speedup"]) == pytest.approx(1.31)
    assert float(summary["final/acceptance_length"]) == pytest.approx(1.75)
    assert float(summary["final/acceptance_pos1"]) == pytest.approx(0.25)


def test_disabled_adds_only_the_csv_logger(tmp_path):
    loggers = build_loggers(tmp_path, {"wandb": {"mode": "disabled"}})
    assert [type(x).__name__ for x in loggers] == ["CSVLogger"]
    assert len(build_loggers(tmp_path, None)) == 1


def test_a_bad_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="wandb.mode"):
        build_loggers(tmp_path, {"wandb": {"mode": "sometimes"}})


def test_final_metrics_skip_what_was_not_measured():
    assert final_metrics({"throughput": {"speedup": None}, "acceptance": {"per_position": [0.5]}}) == \
        {"final/acceptance_pos0": 0.5}


def test_a_wandb_failure_at_the_end_never_fails_the_run(tmp_path, monkeypatch, caplog):
    """Seen in a sweep: reopening the run the training child logged to raised "run ID ... is
    in use". result.json already holds the figures, so it is a warning, not a failed run."""
    import wandb

    def refuse(**kwargs):
        raise RuntimeError("run ID 0123 is in use")

    monkeypatch.setattr(wandb, "init", refuse)
    cfg = OmegaConf.create({"wandb": {"mode": "offline", "project": "speclab", "entity": None, "tags": []}})
    log_final(tmp_path, cfg, {"acceptance": {"mean_acceptance_length": 1.5}})
    assert "final metrics" in caplog.text and "is in use" in caplog.text
