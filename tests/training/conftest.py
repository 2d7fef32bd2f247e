import pytest

from speclab.speculator.targets import tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama()
