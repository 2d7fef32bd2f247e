"""Fixtures of the tiny-target decoding tests (engine, sampling, tree)."""

import pytest

from speclab.eval.prompts import encode_prompt
from speclab.speculator.target.builders import tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama()


@pytest.fixture(scope="module")
def prompt(target):
    return encode_prompt(target.tokenizer, {"prompt": "Write a function that returns the sum of a list"})
