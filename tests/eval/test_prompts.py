"""Prompt files, HumanEval's prompts, and their encoding."""

import json

import pytest
import torch

from speclab.eval.prompts import encode_prompt, humaneval_prompts, load_prompts
from speclab.speculator.target.builders import tiny_llama


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_llama().tokenizer


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_prompts_reads_both_shapes_and_skips_blank_lines(tmp_path):
    rows = [{"prompt": "hi", "category": "chat"}, {"messages": [{"role": "user", "content": "yo"}]}]
    path = write_lines(tmp_path / "p.jsonl", [json.dumps(rows[0]), "", json.dumps(rows[1])])
    assert load_prompts(path) == rows


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"text": "hi"}', "exactly one of"),
        ('{"prompt": "a", "messages": []}', "exactly one of"),
        ('{"prompt": 3}', "must be a string"),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": [{"role": "user"}]}', "messages\\[0\\]"),
        ('{"prompt": "a", "category": 1}', "category"),
    ],
)
def test_load_prompts_names_the_bad_line(tmp_path, bad_line, message):
    path = write_lines(tmp_path / "p.jsonl", ['{"prompt": "fine"}', bad_line])
    with pytest.raises(ValueError, match=message) as err:
        load_prompts(path)
    assert f"{path}:2" in str(err.value)


def test_load_prompts_missing_or_empty_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(write_lines(tmp_path / "empty.jsonl", [""]))


def test_humaneval_has_164_prompts():
    prompts = humaneval_prompts()
    assert len(prompts) == 164
    assert prompts[0]["id"] == "HumanEval/0" and prompts[0]["category"] == "humaneval"
    assert prompts[0]["prompt"].lstrip().startswith("from typing import List")
    assert humaneval_prompts(limit=3) == prompts[:3]


def test_encode_prompt_applies_the_chat_template(tokenizer):
    ids = encode_prompt(tokenizer, {"prompt": "What is the capital of France?"})
    assert ids.dtype == torch.long and ids.dim() == 2 and ids.shape[0] == 1
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0].tolist() == tokenizer(text, add_special_tokens=False).input_ids
    # A one-turn "messages" item is the same conversation.
    messages = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
    assert torch.equal(encode_prompt(tokenizer, messages), ids)


def test_encode_prompt_without_chat_template(tokenizer):
    ids = encode_prompt(tokenizer, {"prompt": "def add(a, b):"}, chat_template=False)
    assert ids[0].tolist() == tokenizer("def add(a, b):").input_ids
    with pytest.raises(ValueError, match="chat_template=True"):
        encode_prompt(tokenizer, {"messages": [{"role": "user", "content": "x"}]}, chat_template=False)
    with pytest.raises(ValueError, match="\"prompt\" or \"messages\""):
        encode_prompt(tokenizer, {"text": "x"})
