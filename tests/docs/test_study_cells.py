"""docs/results.md's data-scaling tables and the recorded cells they are drawn from cannot drift apart.

docs/study_cells.csv holds every scoring of the study's grid (its runs are spread over
hosts and dates, most no longer on disk); the generated table shows each cell as
"acceptance / speedup", the median and (lowest–highest) where a cell was scored more than
once, and the baselines table the median and range of every baseline scoring. Each is
checked against the other here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from speclab.sweeps.plot_scaling import cells

ROOT = Path(__file__).parents[2]
BUDGETS = {"30k tokens": 30_000, "100k": 100_000, "300k": 300_000, "1M": 1_000_000}
RECIPES = {"self-distilled": "self_distilled", "teacher-forced": "teacher_forced", "two-stage": "two_stage",
           "the self-distilled answers as a `suffix` corpus": "corpus"}
LEARNED = {"self_distilled", "teacher_forced", "two_stage"}
NUMBER = r"(\d+\.\d+)x?(?: \((\d+\.\d+)–(\d+\.\d+)\))?"
RESULTS = ROOT / "docs" / "results.md"


def span(text: str) -> tuple[float, float]:
    """'1.41' -> (1.41, 1.41); '1.11x (1.05–1.17)' -> (1.05, 1.17): the range of the cell's scorings."""
    middle, low, high = re.fullmatch(NUMBER, text).groups()
    return float(low or middle), float(high or middle)


def readme_grid() -> dict[tuple[str, str, int], tuple[tuple[float, float], tuple[float, float]]]:
    """(recipe, family, budget) -> (acceptance range, speedup range) as the results' table prints them."""
    lines = RESULTS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| recipe | family | 30k tokens"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    grid = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = [c.strip() for c in line.strip("|").split("|")]
        recipe = next((key for prefix, key in RECIPES.items() if row[0].startswith(prefix)), None)
        if recipe is None:
            continue  # rows that are not grid cells (the full recipe)
        for column, text in zip(header[2:], row[2:]):
            text = text.replace("*", "")
            if text != "–":
                accepted, speedup = text.split(" / ")
                grid[recipe, row[1].strip("`"), BUDGETS[column]] = (span(accepted), span(speedup))
    return grid


def key_of(cell: dict) -> tuple[str, str, int]:
    """The README's (recipe, family, budget column) of a recorded cell: two_stage's tokens are two budgets."""
    return cell["recipe"], cell["family"], cell["tokens"] // (2 if cell["recipe"] == "two_stage" else 1)


@pytest.fixture(scope="module")
def recorded():
    return cells(ROOT / "docs" / "study_cells.csv")


def test_every_recorded_cell_is_in_the_results_table_within_its_range(recorded):
    grid = readme_grid()
    for cell in recorded[0]:
        (accepted_lo, accepted_hi), (speed_lo, speed_hi) = grid[key_of(cell)]
        assert accepted_lo <= cell["acceptance_length"] <= accepted_hi, cell
        assert speed_lo <= cell["speedup"] <= speed_hi, cell


def test_every_learned_results_cell_is_exactly_its_recorded_scorings(recorded):
    by_cell: dict[tuple, list[dict]] = {}
    for cell in recorded[0]:
        by_cell.setdefault(key_of(cell), []).append(cell)
    for key, (accepted, speedup) in readme_grid().items():
        if key[0] not in LEARNED:
            continue
        scorings = by_cell.get(key)
        assert scorings, f"{key} is in the results' table but not in docs/study_cells.csv"
        lengths, speeds = [c["acceptance_length"] for c in scorings], [c["speedup"] for c in scorings]
        assert accepted == (min(lengths), max(lengths)) and speedup == (min(speeds), max(speeds)), key


def test_the_baseline_ranges_are_those_of_the_recorded_baselines(recorded):
    text = RESULTS.read_text()
    for family in ("suffix", "ngram"):
        found = re.search(rf"^\| `{family}` \| {NUMBER} \| {NUMBER} \| \d+ \|$", text, re.M)
        assert found, family
        _, lo, hi, _, speed_lo, speed_hi = (float(v) if v else None for v in found.groups())
        scored = [b for b in recorded[1] if b["family"] == family]
        assert (lo, hi) == (min(b["acceptance_length"] for b in scored), max(b["acceptance_length"] for b in scored))
        assert (speed_lo, speed_hi) == (min(b["speedup"] for b in scored), max(b["speedup"] for b in scored))
