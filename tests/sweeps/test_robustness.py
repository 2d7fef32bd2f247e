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
import threading
from pathlib import Path

import pytest
import torch
from test_export import TINY_TARGET_CONFIG, make_speculator_run
from test_sweeps_run import SMALLEST, TINY

from speclab.speculator.target.builders import tiny_llama
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
        "module_attribute": {"_target_": "speclab.speculator.target.builders.shutil.rmtree", "path": str(tmp_path)},
        "not_a_builder": {"_target_": "speclab.speculator.target.builders.convert_gguf", "gguf": "a", "out_dir": "b"},
        "former_module_attribute": {"_target_": "speclab.speculator.targets.shutil.rmtree", "path": str(tmp_path)},
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
    "module_attribute", "not_a_builder", "former_module_attribute", "list"]


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


def test_bench_names_the_fix_when_directories_follow_one_speculator_flag(tmp_path, tiny_target, capsys):
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        make_speculator_run(runs, name, tiny_target)
    assert main(["bench", "--speculator", str(runs / "a"), str(runs / "b"), "--limit", "1"]) == 2
    line = _one_error_line(capsys)
    assert str(runs / "b") in line and "its own --speculator" in line and "bad override" not in line
    assert main(["bench", "--speculator", str(runs / "a"), "dtype=fp32", "--limit", "1"]) == 2
    assert "--speculator" not in _one_error_line(capsys)  # not a path: no such hint


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
    learned = sorted((r["speculator"]["family"], r["status"]) for r in results
                     if r["speculator"]["family"] in ("mlp", "draft_lm"))  # beside the training-free baselines
    assert learned == [("draft_lm", "completed"), ("mlp", "completed")], [r.get("error") for r in results]


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
    features._write_feature_store = lambda *a, **k: (writes.append(1), real_write(*a, **k))[1]  # counted, result kept
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


# --- 4. config values are checked before any work ---------------------------------------------


def _speclab(args, tmp_path, timeout=600, **popen):
    env = {**os.environ, "SPECLAB_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-c", "from speclab.sweeps.cli import main; raise SystemExit(main())", *args]
    if popen:
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("override, message", [
    ("training.batch_size=-1", "training.batch_size=-1; valid: an integer >= 1"),  # before: hung 3 x 900 s
    ("training.batch_size=0", "training.batch_size=0; valid: an integer >= 1"),  # before: failed after the data
    ("eval.k=0", "eval.k=0; valid: an integer >= 1"),
    ("training.max_steps=0", "training.max_steps=0; valid: an integer >= 1 (or -1)"),
    ("data.prompt_top_p=1.5", "data.prompt_top_p=1.5; valid: a number > 0 and <= 1"),
    ("training.watchdog.min_window=100", "min_window=100 exceeds training.watchdog.window"),
])
def test_a_bad_config_value_is_one_line_before_any_work(tmp_path, override, message):
    proc = _speclab(["train", f"runs_dir={tmp_path / 'runs'}", *TINY, override], tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "cache").exists()  # no data or target was built


def test_every_shipped_default_passes_the_checks():
    from hydra import compose, initialize_config_module

    from speclab.sweeps.config_check import check_config

    with initialize_config_module("speclab.configs", version_base=None):
        for overrides in ([], ["target=tiny", "training=smoke", "eval=smoke"], *[[f"faults={f}"] for f in FAULTS]):
            check_config(compose("config", overrides=overrides))


FAULTS = sorted(p.stem for p in (Path(__file__).parents[2] / "configs" / "faults").glob("*.yaml"))


# --- 5. a sweep with failed runs exits non-zero and names them ---------------------------------


def test_a_sweep_whose_runs_failed_exits_1_and_lists_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    assert main(["sweep", "quick", f"runs_dir={runs}", *TINY, "training.batch_size=0"]) == 1  # before: 0
    err = capsys.readouterr().err
    assert "2 run(s) failed" in err
    failed = [r for r in (json.loads(p.read_text()) for p in runs.rglob("result.json")) if r["status"] == "failed"]
    assert len(failed) == 2  # the two candidates (training-free baselines need no batch size)
    assert all(r["run_id"] in err and "training.batch_size=0" in r["error"] for r in failed)


# --- 6. readers skip and flag one malformed result; NaN/Inf are written as null ----------------


def _break(kind, root):
    bad = root / "bad"
    bad.mkdir(parents=True)
    record = json.loads((root / "good" / "result.json").read_text())
    text = {
        "per_position_int": lambda: json.dumps({**record, "acceptance": {**record["acceptance"], "per_position": 5}}),
        "nan_speedup": lambda: json.dumps(record).replace('"speedup": 1.4', '"speedup": NaN'),
        "inf_speedup": lambda: json.dumps(record).replace('"speedup": 1.4', '"speedup": Infinity'),
        "list": lambda: "[]",
        "string_speedup": lambda: json.dumps({**record, "throughput": {"speedup": "fast"}}),
        "section_is_a_list": lambda: json.dumps({**record, "train": [1, 2]}),
        "empty": lambda: "",
    }[kind]()
    assert text != json.dumps(record)  # the damage took
    (bad / "result.json").write_text(text)


MALFORMED = ["per_position_int", "nan_speedup", "inf_speedup", "list", "string_speedup", "section_is_a_list", "empty"]


@pytest.mark.parametrize("kind", MALFORMED)
def test_one_malformed_result_is_flagged_and_the_rest_still_read(tmp_path, tiny_target, capsys, kind):
    from speclab.sweeps.dashboard import data

    root = tmp_path / "runs"
    make_speculator_run(root, "good", tiny_target, speedup=1.4)
    _break(kind, root)
    state = json.loads(json.dumps(data.state(root), allow_nan=False))  # the page's payload stays strict JSON
    by_id = {r["run_dir"]: r for r in state["runs"]}
    assert by_id["good"]["status"] == "completed" and by_id["good"]["speedup"] == 1.4
    assert by_id["bad"]["status"] in ("malformed", "unreadable") and by_id["bad"]["error"]
    assert main(["runs", "--runs", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)  # strict JSON too: no NaN leaks into the listing
    assert {r["run_dir"]: r["status"] for r in rows}["bad"] in ("malformed", "unreadable")
    assert main(["runs", "--runs", str(root)]) == 0 and "good" in capsys.readouterr().out
    out = tmp_path / "export"
    assert main(["export", "--best", "--out", str(out), "--runs", str(root)]) == 0
    assert json.loads((out / "export.json").read_text())["run_id"] == "good"


@pytest.mark.parametrize("halving", ["", "[]", '{"rungs": 5}', '{"metric": "speedup", "eta": 2, "rungs": [{"runs": '
                                     '[{"value": NaN}]}], "winner": null}'])
def test_a_bad_halving_record_does_not_blank_the_dashboard(tmp_path, tiny_target, halving):
    import http.client

    from speclab.sweeps.dashboard.server import make_server

    root = tmp_path / "runs"
    make_speculator_run(root, "sweep/0", tiny_target, speedup=1.4)
    (root / "sweep" / "multirun.yaml").write_text("hydra: {}\n")
    (root / "sweep" / "0" / ".hydra").mkdir()
    (root / "sweep" / "halving.json").write_text(halving)
    server = make_server(root, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/api/state")
        response = conn.getresponse()
        assert response.status == 200  # before: NaN in halving.json made json.dumps raise, the page went blank
        state = json.loads(response.read())
        assert [r["run_id"] for r in state["runs"]] == ["sweep/0"] and len(state["sweeps"]) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_nan_and_inf_are_written_as_null(tmp_path):
    from speclab.sweeps.results import write_json_atomic

    path = write_json_atomic(tmp_path / "x.json", {"loss": float("nan"), "rates": [float("inf"), 0.5]})
    assert json.loads(path.read_text()) == {"loss": None, "rates": [None, 0.5]}  # strict JSON: parses anywhere


# --- 7. resource failures are named; SIGTERM fails the run like Ctrl-C; dead runs show dead ---


def test_a_full_disk_is_a_one_line_error_naming_the_path_and_bytes(tmp_path, tiny_target, monkeypatch):
    import shutil as shutil_module

    from speclab.kernels.util import cache_lock
    from speclab.training.features import build_feature_store

    usage = shutil_module.disk_usage(tmp_path)
    monkeypatch.setattr(cache_lock.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(cache_lock.CacheSpaceError) as caught:
        build_feature_store(tiny_target, _race_examples(4), "full", tmp_path / "features", progress=False)
    needed = sum(len(e["input_ids"]) for e in _race_examples(4)) * tiny_target.hidden_size * 4
    message = str(caught.value)
    assert "hidden.npy" in message and f"{needed:,} bytes needed" in message and "\n" not in message
    assert not [p for p in (tmp_path / "features").iterdir() if not p.name.endswith(".lock")]  # nothing half-built


def test_blocks_are_reserved_so_a_disk_filled_meanwhile_fails_loudly(tmp_path, tiny_target, monkeypatch):
    import errno

    from speclab.kernels.util import cache_lock
    from speclab.training.features import build_feature_store

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_lock.os, "posix_fallocate", full)  # before: pages mapped sparse, SIGBUS at a write
    with pytest.raises(cache_lock.CacheSpaceError, match="bytes needed"):
        build_feature_store(tiny_target, _race_examples(4), "full", tmp_path / "features", progress=False)


def test_sigterm_writes_a_failed_result_like_sigint(tmp_path):
    import signal
    import time

    runs = tmp_path / "runs"
    proc = _speclab(["train", f"runs_dir={runs}", "run_name=term", *TINY, "training.max_steps=50", "faults=hang"],
                    tmp_path, popen=True)
    heartbeat = runs / "term" / "heartbeat.json"
    deadline = time.time() + 600
    while time.time() < deadline and not (heartbeat.is_file() and '"training"' in heartbeat.read_text()):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    result = json.loads((runs / "term" / "result.json").read_text())  # before: no result.json at all
    assert result["status"] == "failed" and "SIGTERM" in result["error"]


def test_a_run_whose_process_is_gone_shows_as_dead(tmp_path):
    import socket

    from speclab.sweeps.dashboard import data

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for name, pid in (("dead", int(ended.stdout)), ("alive", os.getpid())):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / "process.json").write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")  # the two as one sweep's jobs
    state = data.state(tmp_path)
    assert {r["run_dir"]: r["status"] for r in state["runs"]} == {"dead": "dead", "alive": "running"}  # before: both running
    (sweep,) = state["sweeps"]
    assert (sweep["running"], sweep["failed"]) == (1, 1)


# --- 8. a prompt longer than the target's context is refused, naming the context ---------------


@pytest.mark.parametrize("runtime", ["lean", "hf"])
def test_an_over_long_prompt_is_refused_naming_the_context(runtime):
    """Before: a 1,900-token prompt ran silently past the context (4.64x at acceptance 1.00)."""
    from speclab.eval.engine import generate_plain, generate_speculative
    from speclab.speculator.base import TargetInfo
    from speclab.speculator.families import build_speculator

    target = tiny_llama(seed=0, runtime=runtime)
    context = target.context_length
    too_long = torch.zeros(1, context - 4, dtype=torch.long)
    with pytest.raises(ValueError, match=f"exceeds {target.name}'s context of {context} tokens"):
        generate_plain(target, too_long, 8)
    speculator = build_speculator("mlp", {}, TargetInfo.of(target))
    with pytest.raises(ValueError, match=r"\+ 5 draft positions exceeds"):
        generate_speculative(target, speculator, torch.zeros(1, context - 12, dtype=torch.long), 8, 4)
    assert len(generate_plain(target, torch.zeros(1, context - 8, dtype=torch.long), 8).tokens) <= 8  # fits exactly


# --- 10. the dashboard answers only requests for itself, and drops idle clients -----------------


@pytest.fixture
def dashboard(tmp_path):
    from speclab.sweeps.dashboard.server import make_server

    (tmp_path / "runs").mkdir()
    server = make_server(tmp_path / "runs", port=0, idle_timeout_s=0.5)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("host, code", [
    ("127.0.0.1:{port}", 200), ("localhost:{port}", 200), ("[::1]:{port}", 200),
    ("evil.example:{port}", 403),  # a rebinding page's own name: before, 200 with the whole state
    ("127.0.0.1:1", 403), ("10.1.2.3:{port}", 403), ("", 403),
])
def test_the_host_header_must_name_the_bound_address(dashboard, host, code):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", dashboard, timeout=10)
    conn.putrequest("GET", "/api/state", skip_host=True)
    if host:
        conn.putheader("Host", host.format(port=dashboard))
    conn.endheaders()
    assert conn.getresponse().status == code


def test_an_idle_client_is_disconnected(dashboard):
    import socket
    import time

    with socket.create_connection(("127.0.0.1", dashboard), timeout=10) as sock:
        start = time.time()
        assert sock.recv(1) == b""  # the server closed it (before: held open forever)
        assert time.time() - start < 5


# --- 9. malformed JSONL data names the file and the line ----------------------------------------


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a", "response": "b"}\n{"prompt": "c", "response": \n', "chats.jsonl:2: not valid JSON"),
    ('{"prompt": "a", "response": "b"}\n\n[1, 2]\n', "chats.jsonl:3: expected a JSON object per line, got list"),
    ("", "chats.jsonl is empty: a jsonl data file needs one JSON object per line"),  # before: "...jsonl: "
    ("\n  \n", "chats.jsonl is empty"),
])
def test_bad_jsonl_data_names_the_file_and_line(tmp_path, tiny_target, content, message):
    from speclab.training.data import DataConfig, build_dataset

    path = tmp_path / "chats.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")) as caught:
        build_dataset(tiny_target, DataConfig(source="jsonl", path=str(path), num_prompts=0), tmp_path / "cache",
                      progress=False)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_bad_prompts_file_names_the_line(tmp_path):
    from speclab.eval.prompts import load_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="prompts.jsonl:2: not valid JSON"):
        load_prompts(path)
    path.write_text("")
    with pytest.raises(ValueError, match="holds no prompts"):
        load_prompts(path)


# --- 12. the watchdog guards from the first steps; every shipped fault default trips -------------

# What each shipped fault is for: the supervisor restarts the process, or the watchdog rolls back.
FAULT_TARGETS = {"exception": "restarts", "sigkill": "restarts", "hang": "restarts", "corrupt_checkpoint": "restarts",
                 "nan_loss": "rollbacks", "spike": "rollbacks"}


def _default_watchdog() -> list[str]:
    """The tiny smoke budget, but the watchdog exactly as configs/training/default.yaml ships it."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("speclab.configs", version_base=None):
        shipped = compose("config").training.watchdog
    return [f"training.watchdog.{key}={value}" for key, value in shipped.items()]


def test_every_fault_config_has_a_declared_target():
    assert set(FAULTS) - {"none"} == set(FAULT_TARGETS)


@pytest.mark.parametrize("kind", sorted(FAULT_TARGETS))
def test_every_fault_default_trips_what_it_targets(tmp_path, kind):
    from speclab.training.fault_matrix import run_tiny, tiny_config

    cfg = tiny_config(f"faults={kind}", "training.max_steps=16", *_default_watchdog())
    out = run_tiny(cfg, tmp_path / kind, tmp_path / "cache")  # the fault fires at its shipped at_step
    assert out.status == "completed", out.reason
    assert len(out.train["faults"]) == 1 and out.train["faults"][0]["step"] == cfg["faults"]["at_step"]
    assert out.train[FAULT_TARGETS[kind]] == 1, out.train  # before: spike at step 7 gave 0 rollbacks
    if kind == "spike":
        (rollback,) = out.train["rollback_log"]
        assert cfg["faults"]["at_step"] <= rollback["onset"] < cfg["faults"]["at_step"] + cfg["faults"]["spike_steps"]


@pytest.mark.parametrize("seed", range(3))
def test_no_false_trips_on_clean_tiny_runs(tmp_path, seed):
    from speclab.training.fault_matrix import run_tiny, tiny_config

    cfg = tiny_config("training.max_steps=40", f"seed={seed}", f"data.seed={seed}", *_default_watchdog())
    out = run_tiny(cfg, tmp_path / "clean", tmp_path / "cache")
    assert out.status == "completed" and out.train["rollbacks"] == 0


def test_an_early_spike_cannot_poison_the_baseline():
    from speclab.training.watchdog import SpikeDetector, WatchdogConfig

    detector = SpikeDetector(WatchdogConfig())  # min_window 10: the mean/std rule is not armed yet
    losses = [4.0, 3.9, 3.9, 3.8, 3.8, 3.7] + [38.0] * 5 + [3.6] * 5  # the run: x10 at steps 7-11
    got = [t for step, loss in enumerate(losses, 1) if (t := detector.update(step, loss))]
    assert got and (got[0].step, got[0].onset) == (9, 7)
    assert max(detector.window) < 5  # none of the spiky losses entered the baseline


def test_a_literal_builder_argument_takes_only_its_values(monkeypatch):
    from typing import Literal

    import speclab.speculator.target.builders as targets
    from speclab.speculator.target import FrozenTarget

    def pick(mode: Literal["a", "b"] = "a") -> FrozenTarget:
        return mode

    pick.__module__ = targets.__name__
    monkeypatch.setattr(targets, "pick", pick, raising=False)
    builder = "speclab.speculator.target.builders.pick"
    assert parse_target_spec({"_target_": builder, "mode": "b"}).build() == "b"
    with pytest.raises(TargetSpecError, match="not one of"):
        parse_target_spec({"_target_": builder, "mode": "c"})


def test_a_target_recorded_under_the_builders_former_module_is_the_same_builder():
    spec = parse_target_spec({"_target_": "speclab.speculator.targets.tiny_llama", "seed": 3})
    assert spec.builder == "speclab.speculator.target.builders.tiny_llama" and spec.kwargs == {"seed": 3}
    with pytest.raises(TargetSpecError, match="refusing target _target_ 'speclab.speculator.targets.shutil.rmtree'"):
        parse_target_spec({"_target_": "speclab.speculator.targets.shutil.rmtree"})
