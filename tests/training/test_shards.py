"""Data and features built in shards equal a one-process build, bit for bit."""

import json
import subprocess
import sys

import datasets
import numpy as np
import pytest

from speclab.training import data_shards
from speclab.training.data import DataConfig, build_dataset
from speclab.training.features import build_feature_store
from speclab.training.shards import ShardPlan, batches_of, shard_plan

# Two rounds (the budget outgrows round 0), so round 1 dedupes against round 0 in shards too.
CONFIG = dict(num_prompts=6, heldout_size=2, max_prompt_tokens=48, max_response_tokens=24, gen_batch_size=2,
              prompt_sampling_budget=10, system_prompts=["Help with Python."], max_tokens=150)

# A child process: the tiny target, this data config, one shard of the data and of the
# feature pass (the features run over the data's examples, not copied from generation).
CHILD = """
import json, sys
from pathlib import Path
from speclab.speculator.target.builders import tiny_llama
from speclab.training.data import DataConfig, build_dataset
from speclab.training.features import build_feature_store
from speclab.training.shards import shard_plan
cfg = DataConfig(**json.loads(sys.argv[2]))
target = tiny_llama()
bundle = build_dataset(target, cfg, Path(sys.argv[1]) / "data", progress=False)
build_feature_store(target, bundle.train, bundle.fingerprint, Path(sys.argv[1]) / "features", batch_size=2,
                    progress=False, shards=shard_plan(cfg.shards, cfg.shard))
"""


def build_in(root, processes: int) -> None:
    """The data and features under `root`, built by `processes` processes, one shard each."""
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(root),
                                  json.dumps({**CONFIG, "shards": processes, "shard": k if processes > 1 else None})])
                for k in range(processes)]
    assert [c.wait(timeout=300) for c in children] == [0] * processes


def only_dir(folder):
    (entry,) = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return entry


def assert_same_data(a, b):
    for name in ("heldout.jsonl", "hidden.npy"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ta, tb = datasets.load_from_disk(str(a / "train")), datasets.load_from_disk(str(b / "train"))
    assert ta["input_ids"] == tb["input_ids"] and ta["loss_mask"] == tb["loss_mask"]
    ma, mb = (json.loads((p / "meta.json").read_text()) for p in (a, b))
    assert ma["growth"] == mb["growth"] and ma["lengths"] == mb["lengths"] and ma["round_ends"] == mb["round_ends"]
    assert ma["growth"]["rounds"] >= 2


def test_two_processes_build_the_data_and_features_one_process_builds(tmp_path):
    build_in(tmp_path / "one", 1)
    build_in(tmp_path / "two", 2)
    a, b = only_dir(tmp_path / "one" / "data"), only_dir(tmp_path / "two" / "data")
    assert a.name == b.name  # shards are not part of the fingerprint: one cache
    assert_same_data(a, b)
    fa, fb = only_dir(tmp_path / "one" / "features"), only_dir(tmp_path / "two" / "features")
    for name in ("offsets.npy", "input_ids.npy", "loss_mask.npy", "hidden.npy"):
        assert (fa / name).read_bytes() == (fb / name).read_bytes(), name
    assert not list((tmp_path / "two" / "features").glob("*.shards/shard-*"))  # merged shards are dropped


def test_a_stopped_sharded_build_resumes_shard_by_shard(target, tmp_path, monkeypatch):
    """One process building both shards of every round stops in the middle of a round: the
    rerun answers only the shards that were not published, and the result is the
    one-process build."""
    cfg = DataConfig(**CONFIG)
    one = build_dataset(target, cfg, tmp_path / "one", progress=False)
    calls, real = [], data_shards.answer

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # round 1, shard 1
            raise RuntimeError("stopped")
        return real(*args, **kwargs)
    monkeypatch.setattr(data_shards, "answer", failing)
    sharded = DataConfig(**{**CONFIG, "shards": 2})
    with pytest.raises(RuntimeError, match="stopped"):
        build_dataset(target, sharded, tmp_path / "two", progress=False)
    calls.clear()
    monkeypatch.setattr(data_shards, "answer", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    two = build_dataset(target, sharded, tmp_path / "two", progress=False)
    assert len(calls) == 1  # round 0 and round 1's shard 0 were kept
    assert_same_data(one.path, two.path)


def test_a_pass_in_shards_equals_one_pass(target, tmp_path):
    examples = [{"input_ids": list(range(1, 2 + n % 7)), "loss_mask": [1] * (1 + n % 7)} for n in range(9)]
    one = build_feature_store(target, examples, "fp", tmp_path / "one", batch_size=2, progress=False)
    two = build_feature_store(target, examples, "fp", tmp_path / "two", batch_size=2, progress=False,
                              shards=ShardPlan(3))
    assert np.array_equal(one.offsets, two.offsets) and np.array_equal(one.input_ids, two.input_ids)
    assert one.hidden.tobytes() == two.hidden.tobytes()
    assert two.built_now["tokens"] == int(one.offsets[-1])


def test_shard_batches_are_the_one_process_batches():
    order = [4, 0, 3, 1, 2, 6, 5]
    parts = [batches_of(order, 2, k, 3) for k in range(3)]
    assert parts == [[4, 0, 5], [3, 1], [2, 6]]
    assert sorted(i for p in parts for i in p) == sorted(order)


@pytest.mark.parametrize("shards, shard, env, message", [
    (2, 2, {}, "data.shard=2 is outside data.shards=2"),
    (0, None, {}, "data.shards=0"),
    (2, None, {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, "the SLURM array has 4 tasks"),
    (2, None, {"RANK": "3", "WORLD_SIZE": "4"}, "rank 3 of 4"),
])
def test_an_inconsistent_shard_setup_fails_in_one_line(shards, shard, env, message):
    with pytest.raises(ValueError, match=message) as err:
        shard_plan(shards, shard, env)
    assert "\n" not in str(err.value)


def test_a_process_finds_its_shard_in_its_array_task_or_rank():
    assert shard_plan(2, None, {"SLURM_ARRAY_TASK_ID": "11", "SLURM_ARRAY_TASK_MIN": "10",
                                "SLURM_ARRAY_TASK_COUNT": "2"}) == ShardPlan(2, 1)
    assert shard_plan(2, None, {"RANK": "1", "WORLD_SIZE": "2"}) == ShardPlan(2, 1)
    assert shard_plan(2, 0, {"RANK": "1"}) == ShardPlan(2, 0)  # the config wins
    assert shard_plan(2, None, {}) == ShardPlan(2, None)  # one process: builds every shard
    assert shard_plan(1, None, {"RANK": "1", "WORLD_SIZE": "2"}) == ShardPlan(1, None)
    with pytest.raises(ValueError, match="0 <= shard < shards"):
        DataConfig(shards=2, shard=5)
