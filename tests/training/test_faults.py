"""The fault config group: one file per kind, each composing, and fire-once bookkeeping."""

from pathlib import Path
from typing import get_args

import pytest

from speclab.training.fault_matrix import tiny_config
from speclab.training.faults import FAULTS_FILE, FaultConfig, FaultKind, fired

GROUP = Path(__file__).resolve().parents[2] / "configs" / "faults"


def test_the_config_group_mirrors_the_fault_kinds():
    assert {p.stem for p in GROUP.glob("*.yaml")} == set(get_args(FaultKind))


@pytest.mark.parametrize("kind", get_args(FaultKind))
def test_every_fault_config_composes_into_a_fault_config(kind):
    cfg = tiny_config(f"faults='{kind}'")  # quoted: Hydra reads a bare `nan` as a float
    fault = FaultConfig(**cfg["faults"])
    assert fault.kind == kind and fault.repeat == "once"
    assert (fault.at_step > 0) == (kind != "none")


def test_the_default_is_no_fault():
    assert FaultConfig(**tiny_config()["faults"]).kind == "none"


def test_fired_reads_the_runs_ledger(tmp_path):
    assert fired(tmp_path) == []
    (tmp_path / FAULTS_FILE).write_text('[{"kind": "sigkill", "step": 3}]')
    assert fired(tmp_path)[0]["kind"] == "sigkill"
