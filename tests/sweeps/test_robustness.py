"""Hardening: each probe of an adversarial or careless user, kept as a test so no change reopens it.

Sections follow the probes: code from a checkpoint, launchers, cache races, config values,
exit codes, malformed results, resource failures, JSONL errors, the dashboard, the watchdog.
"""

import json
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from test_export import TINY_TARGET_CONFIG, make_speculator_run
from test_sweeps_run import SMALLEST, TINY

from speclab.speculator.targets import tiny_llama
from speclab.sweeps import export as export_module
from speclab.sweeps.cli import main
from speclab.sweeps.target_spec import TargetSpecError, parse_target_spec, recorded_target


@pytest.fixture(scope="module")
def tiny_target():
    return tiny_llama(seed=0)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


# --- 1. nothing from a checkpoint or export is instantiated or evaluated --------------------


class _TouchOnUnpickle:
    """A pickle payload: unpickling it opens (creates) the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _attacks(tmp_path) -> dict:
    """Crafted target descriptions, each with the file whose existence or contents would show it ran."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    payload = tmp_path / "payload.pkl"
    payload.write_bytes(pickle.dumps(_TouchOnUnpickle(tmp_path / "pickle-ran")))
    interp = "${oc.create:{_target_: builtins.open, file: '" + str(victim) + "', mode: w}}"
    return {
        "interpolation": {**TINY_TARGET_CONFIG, "dtype": interp},
        "interpolated_torch_load": {**TINY_TARGET_CONFIG, "device": "${oc.create:{_target_: torch.load, f: '"
                                    + str(payload) + "', weights_only: false}}"},
        "open": {"_target_": "builtins.open", "file": str(victim), "mode": "w"},
        "copyfile": {"_target_": "shutil.copyfile", "src": str(victim), "dst": str(tmp_path / "copied")},
        "torch_load": {"_target_": "torch.load", "f": str(payload), "weights_only": False},
        "nested": {**TINY_TARGET_CONFIG, "dtype": {"_target_": "builtins.open", "file": str(victim), "mode": "w"}},
        "partial": {**TINY_TARGET_CONFIG, "_partial_": True},
        "module_attribute": {"_target_": "speclab.speculator.targets.shutil.rmtree", "path": str(tmp_path)},
        "not_a_builder": {"_target_": "speclab.speculator.targets.convert_gguf", "gguf": "a", "out_dir": "b"},
        "list": [TINY_TARGET_CONFIG],
    }


def _nothing_ran(tmp_path) -> None:
    assert (tmp_path / "victim.txt").read_text() == "precious"
    assert not (tmp_path / "copied").exists() and not (tmp_path / "pickle-ran").exists()


def _plant(run_dir, target_config) -> None:
    config_file = run_dir / "checkpoints" / "speculator" / "config.json"
    meta = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**meta, "target_config": target_config}))


ATTACKS = [
    "interpolation", "interpolated_torch_load", "open", "copyfile", "torch_load", "nested", "partial",
    "module_attribute", "not_a_builder", "list"]


@pytest.mark.parametrize("attack", ATTACKS)
def test_eval_refuses_a_crafted_target_and_runs_nothing(tmp_path, tiny_target, capsys, attack):
    runs = tmp_path / "runs"
    make_speculator_run(runs, "good", tiny_target)
    _plant(runs / "good", _attacks(tmp_path)[attack])
    assert main(["eval", str(runs / "good"), "--limit", "1", "--max-new-tokens", "2"]) == 2
    assert "refusing" in _one_error_line(capsys) or attack == "list"
    _nothing_ran(tmp_path)


@pytest.mark.parametrize("attack", ["interpolation", "copyfile", "torch_load"])
def test_bench_refuses_a_crafted_target_and_runs_nothing(tmp_path, tiny_target, capsys, attack):
    runs = tmp_path / "runs"
    make_speculator_run(runs, "good", tiny_target)
    _plant(runs / "good", _attacks(tmp_path)[attack])
    assert main(["bench", "--speculator", str(runs / "good"), "--limit", "1", "--max-new-tokens", "2"]) == 2
    assert "refusing" in _one_error_line(capsys)
    _nothing_ran(tmp_path)


@pytest.mark.parametrize("attack", ["interpolation", "open", "torch_load", "nested"])
def test_export_builds_the_live_target_only_from_a_valid_description(tmp_path, attack):
    meta = {"family": "eagle", "target_config": _attacks(tmp_path)[attack]}  # eagle needs the live target
    with pytest.raises(TargetSpecError, match="refusing"):
        export_module.live_target_info(meta)
    _nothing_ran(tmp_path)


def test_overrides_are_typed_and_cannot_interpolate(tmp_path, tiny_target):
    runs = tmp_path / "runs"
    make_speculator_run(runs, "good", tiny_target)
    checkpoint = runs / "good" / "checkpoints" / "speculator"
    assert recorded_target(checkpoint, ["target.seed=5"]).kwargs["seed"] == 5
    with pytest.raises(TargetSpecError, match="'seed'"):
        recorded_target(checkpoint, ["target.seed=five"])
    with pytest.raises(TargetSpecError, match="interpolations"):
        recorded_target(checkpoint, ["target.dtype=${oc.env:HOME}"])
    with pytest.raises(TargetSpecError, match="'command'"):
        recorded_target(checkpoint, ["target.command=rm"])


def test_a_valid_description_builds_the_recorded_target():
    spec = parse_target_spec({**TINY_TARGET_CONFIG, "seed": 3, "init_std": 1})  # a whole number for a float
    assert spec.as_config() == {**TINY_TARGET_CONFIG, "seed": 3, "init_std": 1}
    assert spec.build().name == "tiny-llama-seed3"


def test_cli_bench_and_export_do_not_import_one_another():
    import ast
    from pathlib import Path

    import speclab.sweeps.cli as cli

    folder = Path(cli.__file__).parent
    for name, forbidden in {"bench.py": {"cli", "export"}, "export.py": {"cli", "bench"}}.items():
        tree = ast.parse((folder / name).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert not imported & forbidden, (name, imported & forbidden)


# --- 2. every launcher works: joblib's workers start the supervisor's children ----------------


def _supervised_in_a_loky_worker(i):
    from speclab.training.supervisor import SupervisorConfig, supervise

    run_dir = Path(tempfile.mkdtemp())
    out = supervise(_trivial_attempt, (i,), run_dir, SupervisorConfig(max_restarts=0, backoff_s=0))
    return out.status, out.reason


def _trivial_attempt(i):
    return {"steps": i}


def test_the_supervisor_starts_children_from_a_joblib_worker():
    from joblib import Parallel, delayed

    # before: every child died on "cannot find context for 'loky'" (the inherited start method)
    outcomes = Parallel(n_jobs=2, backend="loky")(delayed(_supervised_in_a_loky_worker)(i) for i in range(2))
    assert outcomes == [("completed", None)] * 2


def test_quick_sweep_through_the_joblib_launcher(tmp_path):
    env = {**os.environ, "SPECLAB_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-c", "from speclab.sweeps.cli import main; raise SystemExit(main())", "sweep", "quick",
           "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"runs_dir={runs}", *TINY, *SMALLEST]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in runs.rglob("result.json")]
    assert sorted((r["speculator"]["family"], r["status"]) for r in results) == [
        ("draft_lm", "completed"), ("mlp", "completed")], [r.get("error") for r in results]


# --- 3. concurrent cache builds: one writer, the other reuses, every row right ----------------


def _race_examples(n=48):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        T = 8 + (7 * i) % 29
        out.append({"input_ids": torch.randint(0, 300, (T,), generator=g).tolist(), "loss_mask": [0] * 3 + [1] * (T - 3)})
    return out


def _build_features_after(barrier, cache, queue):
    import speclab.training.features as features

    torch.set_num_threads(1)
    writes = []
    real_write = features._write_feature_store
    features._write_feature_store = lambda *a, **k: (writes.append(1), real_write(*a, **k))
    target = tiny_llama(seed=0)
    barrier.wait()  # both processes ask for the same missing cache at once
    store = features.build_feature_store(target, _race_examples(), "race", cache, batch_size=4, progress=False)
    queue.put((len(writes), os.stat(store.path / "hidden.npy").st_ino))


def _race(target_fn, *args):
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=target_fn, args=(barrier, *args, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    return [queue.get(timeout=5) for _ in procs]


def test_two_processes_building_one_feature_cache(tmp_path, tiny_target):
    from speclab.training.features import open_feature_store

    cache = tmp_path / "features"
    reports = _race(_build_features_after, cache)
    assert sorted(w for w, _ in reports) == [0, 1]  # one writer; the other waited and reused its store
    assert len({inode for _, inode in reports}) == 1  # both read the very same published file
    (final,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert not [p for p in cache.iterdir() if ".tmp" in p.name]  # no work folder left
    store = open_feature_store(final)
    for i, e in enumerate(_race_examples()):  # every token row, against a fresh forward
        fresh = tiny_target(torch.tensor([e["input_ids"]]), logits_for="none").hidden[0]
        torch.testing.assert_close(store.example(i)["hidden"], fresh, rtol=1e-5, atol=1e-5)  # padding: a few ulps


def _build_data_after(barrier, cache, source, queue):
    from speclab.training import data as data_module

    torch.set_num_threads(1)
    target = tiny_llama(seed=0)
    cfg = data_module.DataConfig(source="jsonl", path=str(source), num_prompts=0, heldout_size=1)
    barrier.wait()
    bundle = data_module.build_dataset(target, cfg, cache, progress=False)
    queue.put((bundle.from_cache, [list(r["input_ids"]) for r in bundle.train]))


def test_two_processes_building_one_data_cache(tmp_path):
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                       {"role": "assistant", "content": f"answer {i}"}]}) + "\n"
                              for i in range(40)))
    reports = _race(_build_data_after, tmp_path / "data", source)
    assert sorted(from_cache for from_cache, _ in reports) == [False, True]  # built once, reused once
    assert reports[0][1] == reports[1][1] and len(reports[0][1]) == 39
