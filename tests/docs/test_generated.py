"""Every generated table and figure is what its record renders, and the front page stays short.

A table between `<!-- table:NAME -->` markers in README.md or docs/results.md is written by
`python -m speclab.sweeps.report render` from its record; a hand edit fails here.
"""

from __future__ import annotations

import re

import shutil
from pathlib import Path

from speclab.sweeps import report

ROOT = Path(__file__).parents[2]
README_LINES = 120


def test_every_generated_table_equals_what_render_writes():
    assert report.stale_blocks(ROOT) == [], "run `python -m speclab.sweeps.report render`"


def test_each_page_has_its_generated_tables():
    found = {m["name"] for page in report.PAGES for m in report.BLOCK.finditer((ROOT / page).read_text())}
    assert found == set(report.TABLES)
    assert "table:demo" in (ROOT / "README.md").read_text()


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_LINES


def copy_of_the_docs(tmp_path: Path) -> Path:
    for page in report.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    shutil.copytree(ROOT / "docs" / "records", tmp_path / "docs" / "records")
    for path in ("docs/study_cells.csv", *report.FIGURES):
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def _edit_first_speedup(text: str, shape: str) -> str:
    """The first speedup printed as `shape` (e.g. "{}x") raised by 0.10: a hand edit."""
    pattern = re.escape(shape).replace(re.escape("{}"), r"(\d+\.\d\d)")
    match = re.search(pattern, text)
    assert match, shape
    edited = shape.format(f"{float(match.group(1)) + 0.1:.2f}")
    return text[: match.start()] + edited + text[match.end():]


def test_a_hand_edited_figure_fails_the_check_and_render_restores_it(tmp_path):
    root = copy_of_the_docs(tmp_path)
    readme = root / "README.md"
    original = readme.read_text()
    readme.write_text(_edit_first_speedup(original, "{}x"))
    assert report.stale_blocks(root) == ["README.md: demo"]
    assert report.main(["render", "--check", "--root", str(root)]) == 1
    assert report.main(["render", "--root", str(root)]) == 0
    assert readme.read_text() == original


def test_a_hand_edited_figure_file_fails_the_check_and_render_redraws_it(tmp_path):
    root = copy_of_the_docs(tmp_path)
    (figure,) = report.FIGURES
    original = (root / figure).read_text()
    (root / figure).write_text(_edit_first_speedup(original, ">{}x<"))
    assert report.stale_blocks(root) == [figure]
    report.main(["render", "--root", str(root)])
    assert (root / figure).read_text() == original


def test_render_is_idempotent(tmp_path):
    root = copy_of_the_docs(tmp_path)
    report.main(["render", "--root", str(root)])
    files = [*report.PAGES, *report.FIGURES]
    once = {path: (root / path).read_text() for path in files}
    report.main(["render", "--root", str(root)])
    assert once == {path: (root / path).read_text() for path in files}


def test_spread_shows_one_figure_its_interval_or_the_median_and_range():
    assert report.spread([1.5]) == "1.50"
    assert report.spread([1.5], unit="x", ci=(1.2, 1.8)) == "1.50x (1.20–1.80)"
    assert report.spread([1.2, 1.9, 1.5], unit="x") == "1.50x (1.20–1.90)"
    assert report.spread([None]) == "–"
