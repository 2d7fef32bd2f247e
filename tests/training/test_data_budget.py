"""Token budgets (data.max_tokens), mined code prompts, chunked corpora, and caches that grow.

A bigger budget appends rounds to the cached data (and rows to the feature cache) instead of
rebuilding them, and what it appends is exactly what a build in one go would have made.
"""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from speclab.eval.prompts import HUMANEVAL_FILE, HUMANEVAL_PACKAGE
from speclab.training import data as data_module
from speclab.training import features
from speclab.training.code_source import default_roots, mine_prompts
from speclab.training.data import DataConfig, build_dataset
from speclab.training.data_cache import read_bundle
from speclab.training.data_sources import normalise
from speclab.training.features import build_feature_store

USER_HEADER, END = "<|im_start|>user\n", "<|im_end|>"


def humaneval_tasks() -> list[dict]:
    import importlib.util

    root = Path(importlib.util.find_spec(HUMANEVAL_PACKAGE).submodule_search_locations[0])
    with gzip.open(root / HUMANEVAL_FILE, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def defined_names(stub: str) -> str:
    return stub.split("def ", 1)[1].split("(", 1)[0]


def rows(bundle) -> list[dict]:
    return [dict(r) for r in bundle.train]


def user_text(tokenizer, ids) -> str:
    text = tokenizer.decode(ids)
    return text[text.index(USER_HEADER) + len(USER_HEADER):].split(END)[0]


# --- mined prompts --------------------------------------------------------------------------


def test_humaneval_functions_in_the_source_are_never_mined(tmp_path):
    """All 164 HumanEval prompts, made into a module: mined without the exclusion, none with it."""
    tasks = humaneval_tasks()
    assert len(tasks) == 164
    for t in tasks:
        (tmp_path / f"task_{t['task_id'].split('/')[1]}.py").write_text(t["prompt"] + "    pass\n")
    (tmp_path / "other.py").write_text('def shuffle_words(text: str) -> str:\n    """Return the words of text '
                                       'in a seeded random order, joined by single spaces."""\n    pass\n')
    entry_points = {t["entry_point"] for t in tasks}
    unguarded = list(mine_prompts([tmp_path], seed=0))
    assert len({defined_names(p) for p in unguarded} & entry_points) > 100  # the test can fail
    guarded = list(mine_prompts([tmp_path], seed=0, exclude=[t["prompt"] for t in tasks]))
    assert [defined_names(p) for p in guarded] == ["shuffle_words"]


def test_prompts_mined_from_the_installed_source_overlap_no_humaneval_prompt():
    tasks = humaneval_tasks()
    mined = []
    for prompt in mine_prompts(default_roots(), seed=0, exclude=[t["prompt"] for t in tasks]):
        mined.append(prompt)
        if len(mined) == 400:
            break
    assert len(mined) == 400 and len({normalise(p) for p in mined}) == 400  # deduplicated
    assert not {defined_names(p) for p in mined} & {t["entry_point"] for t in tasks}
    humaneval = {normalise(t["prompt"]) for t in tasks}
    assert not any(normalise(p) in h or h in normalise(p) for p in mined for h in humaneval)
    assert all(p.startswith("def ") and '"""' in p for p in mined)  # signature + docstring, no body


def code_config(**overrides) -> DataConfig:
    base = dict(source="code_prompts", num_prompts=6, heldout_size=2, mix=0.5, max_prompt_tokens=48,
                max_response_tokens=8, gen_batch_size=8, prompt_sampling_budget=10, max_seq_len=2048,
                system_prompts=["Ask about history."])
    return DataConfig(**{**base, **overrides})


def test_code_prompts_mix_mined_and_sampled_and_keep_the_heldout_split_apart(target, tmp_path):
    tasks = humaneval_tasks()
    bundle = build_dataset(target, code_config(), tmp_path, progress=False, exclude=[t["prompt"] for t in tasks])
    train = [user_text(target.tokenizer, r["input_ids"]) for r in rows(bundle)]
    heldout = [h["messages"][-1]["content"] for h in bundle.heldout]
    assert len(train) == 6 and len(heldout) == 2
    assert not {normalise(p) for p in train} & {normalise(p) for p in heldout}
    mined = [p for p in train + heldout if p.startswith("def ")]
    assert bundle.stats["prompts_mined"] == 4 == len(mined)  # mix 0.5 of the 8 prompts of round 0
    assert not {defined_names(p) for p in mined} & {t["entry_point"] for t in tasks}


# --- budgets and appending ------------------------------------------------------------------


@pytest.fixture
def python_folder(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(12):
        body = "\n".join(f"    value_{j} = {i} * {j} + len('module {i}')" for j in range(12))
        (folder / f"mod_{i}.py").write_text(f'"""Module {i}."""\n\n\ndef compute_{i}(x):\n{body}\n    return x\n')
    return folder


def corpus_config(folder, **overrides) -> DataConfig:
    return DataConfig(**{"source": "code_corpus", "path": str(folder), "num_prompts": 2, "heldout_size": 1,
                         "max_seq_len": 128, **overrides})


def test_a_bigger_budget_appends_rounds_equal_to_a_build_in_one_go(target, tmp_path, python_folder, monkeypatch):
    rounds = []
    real = data_module.next_round
    monkeypatch.setattr(data_module, "next_round", lambda t, cfg, growth, *a: rounds.append(growth.rounds) or
                        real(t, cfg, growth, *a))
    cache = tmp_path / "cache"
    small = build_dataset(target, corpus_config(python_folder, max_tokens=1500), cache, progress=False)
    first_rounds = small.stats["cache"]["rounds"]
    assert small.stats["assistant_tokens"] >= 1500 and first_rounds > 1
    big = build_dataset(target, corpus_config(python_folder, max_tokens=4000), cache, progress=False)
    assert not big.from_cache and big.fingerprint == small.fingerprint and big.path == small.path
    assert rounds == list(range(big.stats["cache"]["rounds"]))  # each round built once: appended, not rebuilt
    assert big.built_now["examples"] == big.stats["cache"]["examples"] - small.stats["cache"]["examples"] > 0
    assert rows(big)[: len(small.train)] == rows(small) and big.heldout == small.heldout
    at_once = build_dataset(target, corpus_config(python_folder, max_tokens=4000), tmp_path / "other", progress=False)
    assert rows(at_once) == rows(big) and at_once.stats["cache"]["rounds"] == big.stats["cache"]["rounds"]
    again = build_dataset(target, corpus_config(python_folder, max_tokens=1500), cache, progress=False)
    assert again.from_cache and rows(again) == rows(small)
    # the shortest prefix reaching the budget
    loss = [sum(r["loss_mask"]) for r in rows(again)]
    assert sum(loss) >= 1500 > sum(loss[:-1])
    # no budget: round 0, as a build without one makes it, however far budgets grew the cache
    unbudgeted = build_dataset(target, corpus_config(python_folder), cache, progress=False)
    assert unbudgeted.from_cache and rows(unbudgeted) == rows(
        build_dataset(target, corpus_config(python_folder), tmp_path / "fresh", progress=False))
    assert len(unbudgeted.train) < len(small.train)


def test_a_build_stopped_mid_way_keeps_its_finished_rounds(target, tmp_path, python_folder, monkeypatch):
    real, built = data_module.next_round, []

    def failing_at_round_2(t, cfg, growth, *args):
        if growth.rounds == 2:
            raise KeyboardInterrupt  # killed in the middle of round 2
        built.append(growth.rounds)
        return real(t, cfg, growth, *args)

    monkeypatch.setattr(data_module, "next_round", failing_at_round_2)
    cache, cfg = tmp_path / "cache", corpus_config(python_folder, max_tokens=4000)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(target, cfg, cache, progress=False)
    assert built == [0, 1]
    (kept,) = [d for d in cache.iterdir() if not d.name.startswith(".")]  # nothing half-written beside it
    kept_examples = len(read_bundle(kept, kept.name)[0])
    assert kept_examples > 0
    monkeypatch.setattr(data_module, "next_round", lambda t, cfg, growth, *a: built.append(growth.rounds) or
                        real(t, cfg, growth, *a))
    resumed = build_dataset(target, cfg, cache, progress=False)
    assert built[2] == 2  # rounds 0 and 1 were kept, not built again
    at_once = build_dataset(target, cfg, tmp_path / "other", progress=False)
    assert rows(resumed) == rows(at_once) and resumed.stats["cache"]["rounds"] == at_once.stats["cache"]["rounds"]
    assert resumed.built_now["examples"] == resumed.stats["cache"]["examples"] - kept_examples > 0


def test_self_distilled_rounds_append_like_a_build_in_one_go(target, tmp_path):
    cfg = dict(num_prompts=3, heldout_size=1, max_prompt_tokens=48, max_response_tokens=8, gen_batch_size=8,
               prompt_sampling_budget=10, system_prompts=["Help with Python."])
    small = build_dataset(target, DataConfig(**cfg, max_tokens=30), tmp_path / "a", progress=False)
    big = build_dataset(target, DataConfig(**cfg, max_tokens=60), tmp_path / "a", progress=False)
    at_once = build_dataset(target, DataConfig(**cfg, max_tokens=60), tmp_path / "b", progress=False)
    assert big.stats["cache"]["rounds"] > small.stats["cache"]["rounds"] > 1
    assert rows(big)[: len(small.train)] == rows(small) and rows(big) == rows(at_once)
    prompts = [user_text(target.tokenizer, r["input_ids"]) for r in rows(big)]
    assert len({normalise(p) for p in prompts}) == len(prompts)  # no prompt twice across rounds
    assert not {normalise(p) for p in prompts} & {normalise(h["messages"][-1]["content"]) for h in big.heldout}


def test_every_cache_reports_tokens_bytes_seconds_and_rate(target, tmp_path, python_folder):
    bundle = build_dataset(target, corpus_config(python_folder, max_tokens=1000), tmp_path, progress=False)
    cache = bundle.stats["cache"]
    trained = sum(len(r["input_ids"]) for r in rows(bundle))
    assert bundle.stats["tokens"] == trained and cache["tokens"] >= trained  # the last round may overshoot the budget
    assert cache["bytes"] > 4 * cache["tokens"] and cache["seconds"] > 0
    assert cache["tok_s"] == pytest.approx(cache["tokens"] / cache["seconds"], rel=1e-2)
    store = build_feature_store(target, bundle.train, bundle.fingerprint, tmp_path / "features", progress=False)
    report = features.cache_report(store)
    assert report["tokens"] == trained and report["bytes"] > report["tokens"] * 4 * target.hidden_size
    assert report["seconds"] > 0 and report["tok_s"] > 0


# --- chunked corpora ------------------------------------------------------------------------


def test_chunked_text_is_every_token_of_each_file_in_max_seq_len_pieces(target, tmp_path):
    docs = [" ".join(f"word{i}-{j}" for j in range(150)) for i in range(4)]
    for i, doc in enumerate(docs):
        (tmp_path / f"doc{i}.txt").write_text(doc + "\n\nsecond paragraph of the file\n")
    cfg = DataConfig(source="text", path=str(tmp_path), text_split="chunk", max_seq_len=64, heldout_size=1)
    bundle = build_dataset(target, cfg, tmp_path / "cache", progress=False)
    ids = [r["input_ids"] for r in rows(bundle)]
    assert all(len(x) <= 64 for x in ids) and max(len(x) for x in ids) == 64
    assert all(all(r["loss_mask"]) for r in rows(bundle))
    joined = target.tokenizer.decode([t for x in ids for t in x])
    trained = [d for d in docs if d in joined]
    assert len(trained) == 3  # three documents trained, whole; one held out
    assert bundle.heldout[0]["messages"][0]["content"] in docs  # its opening paragraph


def test_code_corpus_holds_out_whole_files(target, tmp_path, python_folder):
    bundle = build_dataset(target, corpus_config(python_folder, num_prompts=0), tmp_path, progress=False)
    text = target.tokenizer.decode([t for r in rows(bundle) for t in r["input_ids"]])
    held = bundle.heldout[0]["messages"][0]["content"]
    assert held.startswith('"""Module ') and held not in text  # its module docstring is never trained on
    assert sum(f'"""Module {i}."""' in text for i in range(12)) == 11


# --- the feature cache grows too ------------------------------------------------------------


def synthetic(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 300, (5 + i,), generator=g).tolist(), "loss_mask": [1] * (5 + i)}
            for i in range(n)]


def test_the_feature_cache_appends_only_the_new_examples(target, tmp_path, monkeypatch):
    data = synthetic(6)
    small = build_feature_store(target, data[:3], "fp", tmp_path, batch_size=2, progress=False, layer_ids=[1])
    computed = []
    real = features._target_passes
    monkeypatch.setattr(features, "_target_passes", lambda t, ids, *a, **k: computed.append(len(ids)) or
                        real(t, ids, *a, **k))
    big = build_feature_store(target, data, "fp", tmp_path, batch_size=2, progress=False, layer_ids=[1])
    assert computed == [3] and len(big) == 6  # one pass over the three new examples, layer 1 included
    new_tokens = int(big.offsets[-1] - small.offsets[-1])
    assert features.cache_report(big)["built_now"]["tokens"] == new_tokens  # this call's work, not the cache's
    assert features.cache_report(small)["built_now"]["tokens"] == 2 * int(small.offsets[-1])  # hidden + layer pass
    fresh = build_feature_store(target, data, "other", tmp_path, batch_size=2, progress=False, layer_ids=[1])
    for i in range(6):
        a, b = big.example(i, [1]), fresh.example(i, [1])
        torch.testing.assert_close(a["hidden"], b["hidden"], rtol=1e-5, atol=1e-5)  # batching differs: ulps
        torch.testing.assert_close(a["layers"], b["layers"], rtol=1e-5, atol=1e-5)
    passes = len(computed)
    head = build_feature_store(target, data[:3], "fp", tmp_path, batch_size=2, progress=False, layer_ids=[1])
    assert len(head) == 3 and np.array_equal(head.input_ids, small.input_ids) and len(computed) == passes
    assert head.bytes_per_token == big.bytes_per_token
    assert features.cache_report(head)["tokens"] == int(big.offsets[-1])
    assert "built_now" not in features.cache_report(head)  # reused whole: nothing computed


# --- self-distilled features come from the generation ---------------------------------------


def distilled(max_tokens: int) -> DataConfig:
    return DataConfig(num_prompts=3, heldout_size=1, max_prompt_tokens=48, max_response_tokens=8, gen_batch_size=8,
                      prompt_sampling_budget=10, system_prompts=["Help with Python."], max_tokens=max_tokens)


def test_self_distilled_features_are_the_generations_hidden_states_not_a_second_pass(target, tmp_path, monkeypatch):
    small = build_dataset(target, distilled(30), tmp_path / "data", progress=False)
    assert small.hidden.shape == (small.stats["tokens"], target.hidden_size)
    real = features._target_passes
    monkeypatch.setattr(features, "_target_passes", lambda *a, **k: pytest.fail("the target ran a feature pass"))
    first = build_feature_store(target, small.train, small.fingerprint, tmp_path / "features", progress=False,
                                generated=small.hidden)
    whole_file = np.load(small.path / "hidden.npy", mmap_mode="r").shape == small.hidden.shape
    assert ((first.path / "hidden.npy").stat().st_ino == (small.path / "hidden.npy").stat().st_ino) == whole_file
    big = build_dataset(target, distilled(60), tmp_path / "data", progress=False)  # appends rounds, and their rows
    grown = build_feature_store(target, big.train, big.fingerprint, tmp_path / "features", progress=False,
                                generated=big.hidden)
    bf16 = build_feature_store(target, big.train, big.fingerprint, tmp_path / "features", dtype="bf16",
                               progress=False, generated=big.hidden)
    report = features.cache_report(grown)
    assert report["from_generation"] and report["tokens"] == big.stats["tokens"] > small.stats["tokens"]
    assert report["built_now"] == {"tokens": 0, "seconds": report["built_now"]["seconds"],
                                   "copied": big.stats["tokens"] - small.stats["tokens"]}
    monkeypatch.setattr(features, "_target_passes", real)
    passed = build_feature_store(target, big.train, big.fingerprint, tmp_path / "passed", progress=False)
    assert features.cache_report(passed)["built_now"]["tokens"] == big.stats["tokens"]
    for i in range(len(big.train)):
        torch.testing.assert_close(grown.example(i)["hidden"], passed.example(i)["hidden"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bf16.example(i)["hidden"], passed.example(i)["hidden"], rtol=2**-8, atol=1e-5)


def test_data_generated_without_the_lean_runtime_has_features_from_a_pass(tmp_path):
    from speclab.speculator.target.builders import tiny_llama

    bundle = build_dataset(tiny_llama(runtime="hf"), distilled(20), tmp_path / "data", progress=False)
    assert bundle.hidden is None and not (bundle.path / "hidden.npy").exists()
