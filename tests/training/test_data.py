import json
import random
from pathlib import Path

import datasets
import pytest
import torch
from omegaconf import OmegaConf

from speclab.speculator.target.builders import tiny_llama
from speclab.training import data as data_module
from speclab.training import data_rounds, data_sources
from speclab.training.data import DataBundle, DataConfig, build_dataset, split_records
from speclab.training.data_config import fields_that_matter
from speclab.training.data_sources import Record

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "data"
USER_HEADER, ASSISTANT_HEADER, END = "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>"


def distill_config(**overrides) -> DataConfig:
    base = dict(num_prompts=4, heldout_size=2, max_prompt_tokens=48, max_response_tokens=8,
                gen_batch_size=8, prompt_sampling_budget=10, system_prompts=["Help with Python."])
    return DataConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def distilled(target, tmp_path_factory) -> DataBundle:
    return build_dataset(target, distill_config(), tmp_path_factory.mktemp("data"), progress=False)


def rows(bundle: DataBundle) -> list[dict]:
    return [dict(r) for r in bundle.train]


def user_text(tokenizer, ids: list[int]) -> str:
    """The user message of a single-turn ChatML example."""
    text = tokenizer.decode(ids)
    return text[text.index(USER_HEADER) + len(USER_HEADER):].split(END)[0]


# --- self-distillation --------------------------------------------------------------------


def test_self_distilled_examples_mask_exactly_the_assistant_reply(target, distilled):
    tok, cfg = target.tokenizer, distill_config()
    assert len(distilled.train) == cfg.num_prompts
    for row in rows(distilled):
        ids, mask = row["input_ids"], row["loss_mask"]
        start = mask.index(1)
        # Everything before the reply is the rendered prompt, ending in the assistant header ...
        prompt = tok.apply_chat_template([{"role": "user", "content": user_text(tok, ids)}],
                                         tokenize=False, add_generation_prompt=True)
        assert tok.decode(ids[:start]) == prompt and prompt.endswith(ASSISTANT_HEADER)
        # ... and everything from it on is the reply: contiguous, closed by the end-of-turn
        # token unless cut at max_response_tokens.
        reply = ids[start:]
        assert mask == [0] * start + [1] * len(reply)
        assert len(reply) == cfg.max_response_tokens or (len(reply) < cfg.max_response_tokens
                                                         and reply[-1] == tok.eos_token_id)
    stats = distilled.stats
    assert stats["examples"] == len(distilled.train)
    assert stats["tokens"] == sum(len(r["input_ids"]) for r in rows(distilled))
    assert stats["assistant_tokens"] == sum(sum(r["loss_mask"]) for r in rows(distilled))
    assert stats["response_gen_tokens"] == stats["assistant_tokens"]
    assert stats["generated_tokens_per_s"] > 0 and stats["prompts_sampled"] >= stats["prompts_kept"]


def test_heldout_prompts_are_user_turns_never_trained_on(target, distilled):
    assert len(distilled.heldout) == 2
    held = set()
    for item in distilled.heldout:
        assert item["category"] == "heldout"
        [turn] = item["messages"]
        assert turn["role"] == "user" and turn["content"]
        held.add(turn["content"])
    trained = {user_text(target.tokenizer, r["input_ids"]) for r in rows(distilled)}
    assert len(trained) == len(distilled.train) and not held & trained


def test_same_seed_same_data_other_seed_other_data(target, distilled, tmp_path):
    again = build_dataset(target, distill_config(), tmp_path / "again", progress=False)
    assert not again.from_cache
    assert again.fingerprint == distilled.fingerprint
    assert rows(again) == rows(distilled) and again.heldout == distilled.heldout
    other = build_dataset(target, distill_config(seed=1), tmp_path / "other", progress=False)
    assert other.fingerprint != distilled.fingerprint
    assert rows(other) != rows(distilled)


def test_second_build_loads_the_cache_without_generating(target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    first = build_dataset(target, distill_config(), progress=False)
    assert first.path == tmp_path / "data" / first.fingerprint and (first.path / "COMPLETE").is_file()

    def no_generation(*args, **kwargs):
        raise AssertionError("generated although the data set is cached")

    monkeypatch.setattr(data_rounds, "sample_prompts", no_generation)
    monkeypatch.setattr(data_rounds, "distill_responses", no_generation)
    second = build_dataset(target, distill_config(), progress=False)
    assert second.from_cache and second.fingerprint == first.fingerprint
    assert rows(second) == rows(first) and second.heldout == first.heldout and second.stats == first.stats
    # A field that cannot change self-distilled data shares the cache.
    assert build_dataset(target, distill_config(text_field="body"), progress=False).from_cache


@pytest.mark.parametrize("damage", ["truncate_arrow", "drop_marker", "edit_heldout"])
def test_damaged_cache_is_rebuilt(target, tmp_path, damage):
    first = build_dataset(target, distill_config(), tmp_path, progress=False)
    expected_rows, expected_heldout = rows(first), first.heldout  # read before the damage
    if damage == "truncate_arrow":
        arrow = next((first.path / "train").glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:100])
    elif damage == "drop_marker":
        (first.path / "COMPLETE").unlink()
    else:
        (first.path / "heldout.jsonl").write_text("{}\n")
    rebuilt = build_dataset(target, distill_config(), tmp_path, progress=False)
    assert not rebuilt.from_cache
    assert rows(rebuilt) == expected_rows and rebuilt.heldout == expected_heldout
    assert build_dataset(target, distill_config(), tmp_path, progress=False).from_cache
    # no temp dirs left (the build lock's file stays: removing it would let two writers lock two files)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [first.fingerprint]


# --- local files ----------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat(user: str, reply: str, *more: str) -> dict:
    turns = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    for i, text in enumerate(more):
        turns.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"messages": turns}


def file_config(source: str, path: Path, **overrides) -> DataConfig:
    return DataConfig(**{"source": source, "path": str(path), "num_prompts": 0, "heldout_size": 1, **overrides})


def masked_text(tokenizer, row: dict) -> str:
    return tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])


def test_jsonl_chats_mask_every_assistant_turn_and_its_end_token(target, tmp_path):
    chats = [chat("add two numbers", "def add(a, b):\n    return a + b", "and three?", "a + b + c"),
             chat("capital of France?", "Paris."),
             chat("Capital of  France?", "It is Paris."),  # the same prompt: dropped as a duplicate
             {"messages": [{"role": "user", "content": "no reply"}]},  # nothing to train on: skipped
             chat("why is the sky blue", "Rayleigh scattering.")]
    path = write_jsonl(tmp_path / "chats.jsonl", chats)
    bundle = build_dataset(target, file_config("jsonl", path, heldout_size=0), tmp_path / "cache", progress=False)
    assert bundle.stats["duplicates_removed"] == 1 and bundle.stats["rows_skipped"] == 1
    masked = sorted(masked_text(target.tokenizer, r) for r in rows(bundle))
    assert masked == sorted([f"def add(a, b):\n    return a + b{END}a + b + c{END}",
                             f"Paris.{END}", f"Rayleigh scattering.{END}"])
    rendered = {c["messages"][0]["content"]: target.tokenizer.apply_chat_template(c["messages"], tokenize=False)
                for c in chats[:2] + chats[4:]}
    for row in rows(bundle):  # all together, the tokens are the whole rendered conversation
        assert target.tokenizer.decode(row["input_ids"]) == rendered[user_text(target.tokenizer, row["input_ids"])]


def test_prompt_response_rows_and_heldout_split(target, tmp_path):
    prompts = [f"question number {i}" for i in range(12)]
    pairs = [{"prompt": p, "response": f"answer {i}"} for i, p in enumerate(prompts)]
    path = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    bundle = build_dataset(target, file_config("jsonl", path, heldout_size=3, num_prompts=5),
                           tmp_path / "cache", progress=False)
    held = [h["messages"] for h in bundle.heldout]
    assert len(held) == 3 and all(m[0]["role"] == "user" and len(m) == 1 for m in held)
    trained = {user_text(target.tokenizer, r["input_ids"]) for r in rows(bundle)}
    assert len(trained) == 5 and trained <= set(prompts)
    assert not trained & {m[0]["content"] for m in held}


def test_split_does_not_depend_on_row_order():
    records = [Record(key=f"prompt {i}", messages=[]) for i in range(30)]
    cfg = DataConfig(heldout_size=5)
    _, heldout, _ = split_records(records, cfg)
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    _, heldout_again, _ = split_records(shuffled, cfg)
    assert [r.key for r in heldout] == [r.key for r in heldout_again]
    _, heldout_other_seed, _ = split_records(records, DataConfig(heldout_size=5, seed=1))
    assert {r.key for r in heldout} != {r.key for r in heldout_other_seed}


def test_text_source_one_example_per_paragraph_loss_on_every_token(target, tmp_path):
    paragraphs = [f"Paragraph {i} says something about the number {i}." for i in range(6)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(paragraphs) + "\n")
    bundle = build_dataset(target, file_config("text", path, heldout_size=2), tmp_path / "cache", progress=False)
    assert len(bundle.train) == 4 and len(bundle.heldout) == 2
    texts = {target.tokenizer.decode(r["input_ids"]).strip() for r in rows(bundle)}
    held = {h["messages"][0]["content"].strip() for h in bundle.heldout}
    assert texts | held == set(paragraphs) and not texts & held
    assert all(set(r["loss_mask"]) == {1} for r in rows(bundle))


def test_parquet_source_and_max_seq_len(target, tmp_path):
    long_prompt = "word " * 200  # longer than max_seq_len: no reply token left, dropped
    pairs = [{"prompt": f"short prompt {i}", "response": "a fairly long reply " * 10} for i in range(4)]
    path = tmp_path / "pairs.parquet"
    datasets.Dataset.from_list(pairs + [{"prompt": long_prompt, "response": "x"}]).to_parquet(str(path))
    bundle = build_dataset(target, file_config("parquet", path, heldout_size=0, max_seq_len=48),
                           tmp_path / "cache", progress=False)
    assert len(bundle.train) == 4 and bundle.stats["dropped_without_loss"] == 1
    assert all(len(r["input_ids"]) == 48 and sum(r["loss_mask"]) > 0 for r in rows(bundle))


def test_editing_the_file_changes_the_fingerprint(target, tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [chat(f"q{i}", "a") for i in range(3)])
    first = build_dataset(target, file_config("jsonl", path), tmp_path / "cache", progress=False)
    write_jsonl(path, [chat(f"q{i}", "b") for i in range(3)])
    second = build_dataset(target, file_config("jsonl", path), tmp_path / "cache", progress=False)
    assert second.fingerprint != first.fingerprint and not second.from_cache


# --- errors -----------------------------------------------------------------------------------


def test_bad_source_lists_the_valid_ones():
    with pytest.raises(ValueError, match="self_distill, code_prompts, jsonl, text, parquet, hub, code_corpus"):
        DataConfig(source="csv")


def test_missing_file_says_so(target, tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl.*does not exist"):
        build_dataset(target, file_config("jsonl", missing), tmp_path / "cache", progress=False)


def test_unknown_columns_name_the_expected_ones(target, tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}] * 3)
    with pytest.raises(ValueError, match="'messages'.*'prompt' \\+ 'response'.*'text'"):
        build_dataset(target, file_config("jsonl", path), tmp_path / "cache", progress=False)


def test_hub_failure_explains_the_offline_way(target, tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(data_sources.datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="some/chats.*data.source=jsonl"):
        build_dataset(target, DataConfig(source="hub", name="some/chats"), tmp_path, progress=False)


def test_too_few_sampled_prompts_says_which_knob_to_turn(target, tmp_path):
    # The random tiny target rarely closes a user turn within 4 tokens.
    cfg = distill_config(max_prompt_tokens=4, prompt_sampling_budget=1.0)
    with pytest.raises(ValueError, match="raise data.max_prompt_tokens or data.prompt_sampling_budget"):
        build_dataset(target, cfg, tmp_path, progress=False)


# --- shipped configs ----------------------------------------------------------------------------


@pytest.mark.parametrize("yaml_file", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_data_yaml_builds_a_config_exposing_every_field_that_matters(yaml_file, tmp_path):
    cfg = OmegaConf.to_container(OmegaConf.load(yaml_file), resolve=True)  # as the runner does
    if cfg.get("path") == "???":  # a file source: the user must name the file
        with pytest.raises(ValueError, match="needs data.path"):
            DataConfig(**cfg)
        cfg["path"] = str(tmp_path / "file")
    data_cfg = DataConfig(**cfg)
    assert data_cfg.source == yaml_file.stem
    # Every field that can change this source's data is in its YAML, so `data.<field>=...`
    # overrides it without a `+`.
    assert set(fields_that_matter(data_cfg)) <= set(cfg.keys())
