"""The built-in eval sets of several kinds of task (eval/task_sets.py)."""

import json

import pytest

from speclab.eval.prompts import _parse_line, encode_prompt
from speclab.eval.task_sets import DOC_CHARS, MATH, SETS, builtin_set, chat_prompts, long_context_prompts


def _text(item):
    return json.dumps(item.get("prompt", item.get("messages")), sort_keys=True)


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_set_builds_offline_as_valid_prompt_items(name):
    items = builtin_set(name)
    assert items and all(isinstance(item.get("category"), str) and item["category"] for item in items)
    for item in items:  # what a prompts file line must be
        _parse_line(json.dumps({k: v for k, v in item.items() if k != "id"}), name)


def test_the_kinds_of_task_carry_their_category():
    assert {i["category"] for i in builtin_set("tasks")} == {"long_context", "math", "chat"}
    assert {i["category"] for i in builtin_set("math")} == {"math"} and len(MATH) >= 20
    assert all(len(i["messages"]) >= 3 and i["messages"][-1]["role"] == "user" for i in chat_prompts())


def test_long_context_prompts_hold_a_document_from_the_standard_library():
    items = long_context_prompts()
    zen = next(i for i in items if i["id"] == "long_context/this")
    assert "Beautiful is better than ugly." in zen["prompt"]  # decoded from this.py without importing it
    documents = [i["prompt"][i["prompt"].index("---\n") + 4: i["prompt"].rindex("\n---")] for i in items]
    assert all(400 < len(d) <= DOC_CHARS for d in documents)


def test_the_pilot_split_is_disjoint_from_every_scored_set():
    pilot = {_text(i) for i in builtin_set("pilot")}
    assert builtin_set("pilot")[0]["id"] == "HumanEval/163"
    for name in SETS:
        if name != "pilot":
            assert not pilot & {_text(i) for i in builtin_set(name)}, name


def test_unknown_sets_are_named_with_the_valid_ones():
    with pytest.raises(ValueError, match="unknown prompt set 'maths'; built-in sets: humaneval, general"):
        builtin_set("maths")
    assert len(builtin_set("math", 3)) == 3


def test_chat_items_render_through_the_template(target):
    ids = encode_prompt(target.tokenizer, chat_prompts()[0])
    assert ids.shape[0] == 1 and ids.shape[1] > 20
