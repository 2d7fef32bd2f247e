import pytest

from speclab.speculator.target.builders import tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama()
