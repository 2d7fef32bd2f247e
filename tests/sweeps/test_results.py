import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from speclab.sweeps import results
from speclab.sweeps.results import (
    failed_result,
    find_speculator_checkpoint,
    new_result,
    read_result,
    weights_sha256,
    write_result,
)

# docs/design.md's result.json fields ("add more, never rename these")
DESIGN_FIELDS = {
    "run_id", "status", "error", "config", "speculator", "acceptance", "throughput",
    "lossless", "train", "checkpoint", "final_weights_sha256",
}
DESIGN_SUBFIELDS = {
    "speculator": {"family", "params"},
    "acceptance": {"k", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate",
                   "mean_acceptance_length", "per_position"},
    "throughput": {"baseline_tok_s", "spec_tok_s", "speedup"},
    "lossless": {"checked_prompts", "mismatches"},
    "train": {"steps", "tokens", "wall_s", "final_loss", "restarts", "rollbacks"},
}


def test_new_result_has_every_design_field():
    result = new_result("r1", {"seed": 3})
    assert DESIGN_FIELDS <= set(result)
    for section, fields in DESIGN_SUBFIELDS.items():
        assert fields <= set(result[section]), section
    assert result["run_id"] == "r1" and result["config"] == {"seed": 3}
    assert result["error"] is None and result["throughput"]["speedup"] is None


def test_write_then_read_round_trips_and_leaves_no_temp_file(tmp_path):
    result = new_result("r1")
    result["throughput"]["speedup"] = 1.5
    write_result(tmp_path, result)
    assert read_result(tmp_path) == result
    assert sorted(os.listdir(tmp_path)) == ["result.json"]


def test_crash_mid_write_keeps_the_old_file(tmp_path, monkeypatch):
    old = new_result("old")
    write_result(tmp_path, old)

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(results.os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_result(tmp_path, new_result("new"))
    assert read_result(tmp_path) == old
    assert sorted(os.listdir(tmp_path)) == ["result.json"]  # the temp file was removed


def test_non_finite_numbers_and_tensors_become_strict_json(tmp_path):
    result = new_result("r1")
    result["train"]["final_loss"] = float("nan")
    result["acceptance"]["per_position"] = torch.tensor([0.5, 0.25])
    result["throughput"]["speedup"] = torch.tensor(float("inf"))
    path = write_result(tmp_path, result)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    saved = json.loads(text)
    assert saved["train"]["final_loss"] is None and saved["throughput"]["speedup"] is None
    assert saved["acceptance"]["per_position"] == [0.5, 0.25]


def test_write_result_refuses_an_unknown_status(tmp_path):
    result = new_result("r1")
    result["status"] = "done"
    with pytest.raises(ValueError, match="completed"):
        write_result(tmp_path, result)
    assert not (tmp_path / "result.json").exists()


def test_failed_result_keeps_partial_figures_and_a_one_line_error():
    try:
        raise RuntimeError("loss diverged\nat step 7")
    except RuntimeError as exc:
        result = failed_result("r2", {}, exc, partial={"train": {"steps": 7}})
    assert result["status"] == "failed"
    assert result["error"] == "RuntimeError: loss diverged at step 7"
    assert result["train"]["steps"] == 7 and result["train"]["restarts"] == 0


def test_read_result_names_the_broken_file(tmp_path):
    (tmp_path / "result.json").write_text('{"run_id": ')
    with pytest.raises(ValueError, match="result.json"):
        read_result(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_result(tmp_path / "nowhere")


def _state():
    torch.manual_seed(0)
    return {"w": torch.randn(3, 4), "b": torch.zeros(4), "h": torch.randn(2, 2).to(torch.bfloat16)}


def test_weights_sha256_ignores_key_order_but_sees_values_dtypes_shapes_and_names():
    state = _state()
    reference = weights_sha256(state)
    assert weights_sha256(dict(reversed(list(state.items())))) == reference
    changed = dict(state, w=state["w"].clone())
    changed["w"][1, 2] += 1e-3
    assert weights_sha256(changed) != reference
    assert weights_sha256(dict(state, b=torch.zeros(4, dtype=torch.int32))) != reference  # same bytes
    assert weights_sha256(dict(state, w=state["w"].reshape(4, 3))) != reference  # same bytes
    renamed = {("bias" if k == "b" else k): v for k, v in state.items()}
    assert weights_sha256(renamed) != reference


def test_weights_sha256_survives_a_safetensors_round_trip(tmp_path):
    state = _state()
    save_file(state, tmp_path / "model.safetensors")
    assert weights_sha256(load_file(tmp_path / "model.safetensors")) == weights_sha256(state)
    # a non-contiguous view hashes like its contiguous copy
    t = torch.randn(4, 3)
    assert weights_sha256({"t": t.t()}) == weights_sha256({"t": t.t().contiguous()})


def _fake_checkpoint(directory):
    directory.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, directory / "model.safetensors")
    (directory / "config.json").write_text("{}")


def test_find_speculator_checkpoint_follows_runs_and_exports(tmp_path):
    run = tmp_path / "run"
    _fake_checkpoint(run / "elsewhere")
    result = new_result("run")
    result["checkpoint"] = "elsewhere"
    write_result(run, result)
    assert find_speculator_checkpoint(run) == run / "elsewhere"
    assert find_speculator_checkpoint(run / "elsewhere") == run / "elsewhere"

    standard = tmp_path / "standard"
    _fake_checkpoint(standard / "checkpoints" / "speculator")
    assert find_speculator_checkpoint(standard) == standard / "checkpoints" / "speculator"

    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        find_speculator_checkpoint(tmp_path)


def test_the_result_file_is_readable_by_others(tmp_path):
    path = write_result(tmp_path, new_result("r1"))
    assert path.stat().st_mode & 0o044 == 0o044  # group and others may read a shared run tree
