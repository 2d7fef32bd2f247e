"""Every shipped sweep runs once on the tiny target at the smallest budget; resume skips
completed runs and reruns failed ones; successive halving records its decisions.

All sweeps share one runs directory, as a user's would, so a candidate that two sweeps
share (arch's `mlp` and arch_x_size's `mlp_small`) trains once: resume at work.
"""

import json
import time
from pathlib import Path

import pytest

from speclab.sweeps.cli import main
from speclab.sweeps.run_rows import load_rows
from speclab.sweeps.sweep import available_sweeps
from speclab.sweeps.table import BASELINE_FAMILIES

TINY = ["target=tiny", "training=smoke", "eval=smoke", "data.num_prompts=12", "data.max_response_tokens=24",
        "data.max_prompt_tokens=96", "data.prompt_sampling_budget=8", "data.heldout_size=2", "data.gen_batch_size=6",
        "threads=1"]
SMALLEST = ["training.max_steps=2", "eval.max_new_tokens=6", "eval.humaneval_prompts=1", "eval.heldout_prompts=1"]
# Sweep-specific budgets: the fewest rungs / trials that still exercise the search. Halving's
# first rung (2 steps) repeats arch_x_size's runs, so resume skips it; eta 4 promotes 3 of 12.
EXTRA = {"halving": ["hydra.sweeper.min_budget=2", "hydra.sweeper.rungs=2", "hydra.sweeper.eta=4"],
         "search": ["hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.n_startup_trials=1"],
         # one budget (a command-line value replaces the sweep's grid) x every recipe x every family
         "data_scaling": ["data.max_tokens=200", "eval.heldout_prompts=0"],
         # the demo's and the full recipe's token budgets, cut to the tiny target's
         "demo": ["data.max_tokens=200"], "smollm2_full": ["data.max_tokens=200"],
         # one cell of the block drafters' grid (its crossing: test_sweep_configs.py)
         "parallel": ["data.max_tokens=200", "speculator=dflash", "speculator.block_size=4", "speculator.num_layers=1",
                      "speculator.intermediate_size=32"]}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECLAB_CACHE", str(root / "cache"))
    mp.setenv("WANDB_MODE", "disabled")
    mp.chdir(root)
    yield root, root / "runs"
    mp.undo()


def sweep(name, runs, *extra):
    return main(["sweep", name, f"runs_dir={runs}", *TINY, *SMALLEST, *EXTRA.get(name, []), *extra])


@pytest.fixture(scope="module")
def all_sweeps(env):
    root, runs = env
    seconds = {}
    for name in available_sweeps():
        start = time.time()
        assert sweep(name, runs) == 0, name
        seconds[name] = time.time() - start
    return root, runs, seconds


def results_of(sweep_dir):
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.rglob("result.json"))]


def test_every_sweep_completes_its_runs(all_sweeps):
    _, runs, _ = all_sweeps
    for name in available_sweeps():
        sweep_dir = runs / f"sweep-{name}"
        marker = "optimization_results.yaml" if name == "search" else "multirun.yaml"  # Optuna writes its own
        assert (sweep_dir / marker).is_file(), name
        jobs = [d for d in sweep_dir.iterdir() if (d / ".hydra").is_dir()]
        assert jobs, name
        for job in jobs:  # each job either ran (result.json) or found its twin (resumed.json)
            assert (job / "result.json").is_file() or (job / "resumed.json").is_file(), job
    statuses = {r["run_id"]: r["status"] for r in load_rows(runs)}
    assert statuses and set(statuses.values()) == {"completed"}, statuses


def test_arch_covers_every_family_and_shared_candidates_train_once(all_sweeps):
    from speclab.speculator.families import REGISTRY

    _, runs, _ = all_sweeps
    assert {r["speculator"]["family"] for r in results_of(runs / "sweep-arch")} == set(REGISTRY)
    # arch ran before arch_x_size (alphabetical): every `<family>_small` candidate is arch's run
    skipped = list((runs / "sweep-arch_x_size").glob("*/resumed.json"))
    assert len(skipped) == len(REGISTRY) - len(BASELINE_FAMILIES)  # the baselines have no candidates
    assert {r["speculator"]["family"] for r in results_of(runs / "sweep-arch_x_size")} == set(REGISTRY)


def test_every_sweep_scored_the_baselines_on_its_own_prompts(all_sweeps):
    _, runs, _ = all_sweeps
    for name in available_sweeps():
        sweep_dir = runs / f"sweep-{name}"
        baselines = {r["speculator"]["family"]: r for r in results_of(sweep_dir) if r["run_id"].split("/")[-1].startswith("baseline-")}
        assert set(baselines) == set(BASELINE_FAMILIES), name
        learned = [r for r in results_of(sweep_dir) if r["speculator"]["family"] not in BASELINE_FAMILIES]
        for baseline in baselines.values():
            assert baseline["status"] == "completed" and baseline["speculator"]["params"] == 0
            assert baseline["train"]["steps"] == 0 and baseline["lossless"]["mismatches"] == 0
            for run in learned:  # the same eval settings and data, hence the same prompts
                assert baseline["config"]["eval"] == run["config"]["eval"], name
                if run["config"]["eval"]["heldout_prompts"]:  # data_scaling sweeps the data: it scores no held-out prompts
                    assert baseline["config"]["data"] == run["config"]["data"], name
    # the arch sweep's own ngram and suffix jobs found the baselines done and were skipped
    arch_skipped = [json.loads(p.read_text())["completed_run"] for p in (runs / "sweep-arch").glob("*/resumed.json")]
    assert sorted(Path(p).name for p in arch_skipped) == [f"baseline-{f}" for f in sorted(BASELINE_FAMILIES)]


def test_halving_records_and_prints_its_promotions(all_sweeps, capsys):
    _, runs, _ = all_sweeps
    record = json.loads((runs / "sweep-halving" / "halving.json").read_text())
    first, second = record["rungs"]
    assert first["budget"] == 2 and second["budget"] == 8 and record["eta"] == 4
    promoted = [r for r in first["runs"] if r["promoted"]]
    assert len(promoted) == len(first["runs"]) // 4
    # the promoted are the best measured of the first rung, and exactly the second rung's candidates
    values = sorted((r["value"] for r in first["runs"] if r["value"] is not None), reverse=True)
    assert sorted((r["value"] for r in promoted), reverse=True) == values[: len(promoted)]
    assert sorted(map(tuple, (r["overrides"] for r in second["runs"]))) == sorted(map(tuple, (r["overrides"] for r in promoted)))
    assert record["winner"]["value"] == max(r["value"] for r in second["runs"])
    assert sweep("halving", runs) == 0  # rerun: everything skipped, decisions shown again
    out = capsys.readouterr().out
    assert "successive halving by speedup" in out and "promoted" in out and "winner:" in out


def test_data_scaling_trains_every_recipe_and_family_to_its_token_budget(all_sweeps):
    _, runs, _ = all_sweeps
    learned = [r for r in results_of(runs / "sweep-data_scaling") if r["train"]["steps"]]  # not the baselines
    recipes = {(r["speculator"]["family"], r["config"]["data"]["source"], len(r["train"]["stages"])) for r in learned}
    assert recipes == {(f, source, stages) for f in ("mlp", "hydra", "eagle3", "dflash", "dflash2", "dspark")
                       for source, stages in (("code_prompts", 1), ("code_corpus", 1), ("code_prompts", 2))}
    assert len(learned) == 18 and {r["status"] for r in learned} == {"completed"}
    for r in learned:
        assert r["data"]["max_tokens"] == 200 and r["data"]["assistant_tokens"] >= 200
        assert r["data"]["cache"]["tok_s"] > 0 and all(c["tok_s"] for c in r["data"]["feature_cache"])
        if len(r["train"]["stages"]) == 2:  # two_stage: the corpus first, then the self-distilled responses
            assert [s["cache"]["loss_tokens"] == s["cache"]["tokens"] for s in r["data"]["stages"]] == [True, False]
    assert len({json.dumps(r["config"]["eval"], sort_keys=True) for r in learned}) == 1  # one eval set for all


def test_search_ran_its_optuna_trials(all_sweeps):
    _, runs, _ = all_sweeps
    jobs = [d for d in (runs / "sweep-search").iterdir() if (d / ".hydra").is_dir()]
    assert len(jobs) == 2
    assert (runs / "sweep-search" / "optimization_results.yaml").is_file()


def test_rerun_skips_completed_runs_and_reruns_failed_or_missing(all_sweeps, capsys):
    _, runs, seconds = all_sweeps
    quick = runs / "sweep-quick"
    # quick's two candidates are arch's mlp and draft_lm: it found them done and pointed at them
    twins = [Path(json.loads(p.read_text())["completed_run"]) for p in sorted(quick.glob("*/resumed.json"))]
    assert sorted(json.loads((t / "result.json").read_text())["speculator"]["family"] for t in twins) == ["draft_lm", "mlp"]
    before = {p: p.read_bytes() for p in runs.rglob("result.json")}
    start = time.time()
    assert sweep("quick", runs) == 0
    resumed_s = time.time() - start
    print(f"quick sweep with everything done: {seconds['quick']:.1f} s, again {resumed_s:.1f} s")
    assert {p: p.read_bytes() for p in runs.rglob("result.json")} == before  # nothing rerun or rewritten
    assert capsys.readouterr().out.count("skipped") >= 2
    # a failed run and a missing one (killed before its result.json) run again, in quick's own dirs
    failed, missing = twins
    record = json.loads((failed / "result.json").read_text())
    (failed / "result.json").write_text(json.dumps({**record, "status": "failed", "error": "RuntimeError: simulated"}))
    (missing / "result.json").unlink()
    assert sweep("quick", runs) == 0
    rerun = [json.loads(p.read_text()) for p in quick.glob("*/result.json") if not p.parent.name.startswith("baseline-")]
    assert sorted(r["status"] for r in rerun) == ["completed", "completed"]
    assert json.loads((failed / "result.json").read_text())["status"] == "failed"  # records are never rewritten
