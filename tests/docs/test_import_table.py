"""docs/design.md's import table, enforced: no module imports a room above its own, and no
modules import one another in a circle (imports inside functions count: they only delay
the circle). The checker is import_table.py beside this file; its rules are its ROOMS."""

from pathlib import Path

from import_table import ROOMS, check, cycles, docs_table, upward

ROOT = Path(__file__).resolve().parents[2]


def test_no_upward_import():
    problems = upward(ROOT)
    assert not problems, "\n".join(problems)


def test_no_import_cycle():
    found = cycles(ROOT)
    assert not found, "\n".join(found)


def test_docs_table_is_the_checked_table():
    documented = docs_table((ROOT / "docs" / "design.md").read_text())
    assert documented == {room: frozenset(allowed) for room, allowed in ROOMS.items()}


def _plant(tree: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for room in ROOMS:
        (tree / room).mkdir(parents=True, exist_ok=True)
        (tree / room / "__init__.py").touch()
    return tree


def test_checker_fails_on_a_planted_upward_import(tmp_path):
    tree = _plant(tmp_path, {
        "training/losses.py": "import torch\n",
        "eval/engine.py": "def f():\n    from speclab.training.losses import kl\n",  # inside a function
        "kernels/verify.py": "from ..speculator import base\n",  # relative
        "speculator/base.py": "",
        "speculator/target/frozen.py": "from speclab.speculator import base\n",  # a sub-room looking up
    })
    assert sorted(upward(tree)) == [
        "eval/engine.py:2: imports speclab.training.losses (training/); "
        "rule: eval/ may import speculator, speculator/target, kernels",
        "kernels/verify.py:1: imports speclab.speculator.base (speculator/); "
        "rule: kernels/ may import nothing of the project",
        "speculator/target/frozen.py:1: imports speclab.speculator.base (speculator/); "
        "rule: speculator/target/ may import kernels",
    ]
    assert cycles(tree) == []


def test_checker_fails_on_a_planted_circle(tmp_path):
    tree = _plant(tmp_path, {
        "sweeps/a.py": "from .b import x\n",
        "sweeps/b.py": "import os\n\n\ndef g():\n    from speclab.sweeps import c\n",
        "sweeps/c.py": "from . import a\n",
        "sweeps/d.py": "from .a import y\n",  # imports into the circle, not part of it
    })
    assert upward(tree) == []
    assert cycles(tree) == [
        "cycle: speclab.sweeps.a -> speclab.sweeps.b -> speclab.sweeps.c -> speclab.sweeps.a  "
        "(sweeps/a.py:1, sweeps/b.py:5, sweeps/c.py:1)"
    ]
    assert len(check(tree)) == 1


def test_a_downward_import_passes(tmp_path):
    tree = _plant(tmp_path, {
        "speculator/target/frozen.py": "from speclab.kernels import verify\n",
        "kernels/verify.py": "import torch\n",
        "speculator/mlp.py": "from .target.frozen import FrozenTarget\nfrom speclab.kernels.verify import v\n",
        "sweeps/cli.py": "from speclab.training import losses\nfrom speclab.eval import engine\n",
        "training/losses.py": "", "eval/engine.py": "",
    })
    assert check(tree) == []
