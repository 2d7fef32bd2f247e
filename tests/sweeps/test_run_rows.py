import re

import pytest

from speclab.sweeps.run_rows import NoEligibleRunError, best, load_rows
from speclab.sweeps.results import EXPORT_MANIFEST, failed_result, new_result, read_result, write_result
from speclab.sweeps.table import format_per_position, format_table


def make_run(runs_dir, name, *, speedup=1.2, acceptance_length=2.0, per_position=(0.6, 0.4),
             mismatches=0, checked=4, status="completed", family="mlp", params=12_345,
             checkpoint=None, weights_sha256=None, per_prompt=None, by_category=None):
    """Write a fake run directory holding only a result.json with the given figures
    (per_prompt: per-prompt speedups, written as records with tokens and seconds)."""
    run_dir = runs_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    if status == "failed":
        result = failed_result(name, {"seed": 0}, RuntimeError("out of memory"),
                               partial={"speculator": {"family": family, "params": params}})
    else:
        result = new_result(name, {"seed": 0})
        result["speculator"] = {"family": family, "params": params}
        result["acceptance"].update(k=len(per_position), mean_acceptance_length=acceptance_length,
                                    acceptance_rate=sum(per_position) / len(per_position),
                                    per_position=list(per_position))
        result["throughput"] = {"baseline_tok_s": 10.0, "spec_tok_s": 10.0 * speedup, "speedup": speedup}
        result["lossless"] = {"checked_prompts": checked, "mismatches": mismatches}
        result["checkpoint"] = checkpoint
        result["final_weights_sha256"] = weights_sha256
        if per_prompt is not None:
            result["eval"] = {"per_prompt": prompt_records(per_prompt)}
        if by_category is not None:
            result["by_category"] = by_category
    write_result(run_dir, result)
    return run_dir


def prompt_records(speedups, plain_seconds=(1.0, 3.0, 2.0, 5.0, 1.5, 4.0)):
    """Per-prompt records (as eval/benchmark.py writes them) with these per-prompt speedups:
    100 tokens each, plain decoding taking a different time on each prompt."""
    return [{"index": i, "key": f"p{i}", "category": "code", "new_tokens": 100, "spec_new_tokens": 100,
             "plain_seconds": plain_seconds[i % len(plain_seconds)],
             "spec_seconds": plain_seconds[i % len(plain_seconds)] / x} for i, x in enumerate(speedups)]


@pytest.fixture
def runs(tmp_path):
    """A sweep-like tree: nested multirun dirs, a failed run and a fast but lossy run."""
    root = tmp_path / "runs"
    make_run(root, "sweep/0", speedup=1.30, acceptance_length=2.1)
    make_run(root, "sweep/1", speedup=1.10, acceptance_length=2.6)
    make_run(root, "sweep/2", status="failed")
    make_run(root, "lossy", speedup=3.0, acceptance_length=4.0, mismatches=2)
    make_run(root, "unchecked", speedup=2.5, acceptance_length=3.5, checked=0)
    return root


def test_load_rows_finds_every_run(runs):
    rows = load_rows(runs)
    assert [r["run_dir"] for r in rows] == ["lossy", "sweep/0", "sweep/1", "sweep/2", "unchecked"]
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["sweep/2"]["status"] == "failed" and "out of memory" in by_id["sweep/2"]["error"]
    assert by_id["sweep/0"]["speedup"] == 1.30 and by_id["sweep/1"]["acceptance_length"] == 2.6
    assert by_id["lossy"]["mismatches"] == 2
    assert [r["result"] for r in rows] == [read_result(runs / r["run_dir"]) for r in rows]


def test_the_rows_follow_the_run_directories(runs):
    load_rows(runs)
    (runs / "lossy" / "result.json").unlink()
    make_run(runs, "late", speedup=1.0)
    ids = {r["run_id"] for r in load_rows(runs)}
    assert "lossy" not in ids and "late" in ids
    assert [p.name for p in runs.iterdir() if p.name.startswith(".")] == []  # reading writes nothing


def test_best_skips_failed_lossy_and_unchecked_runs(runs):
    assert best(runs, "speedup")["run_id"] == "sweep/0"
    assert best(runs, "acceptance_length")["run_id"] == "sweep/1"


def test_best_explains_when_no_run_qualifies(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "a", status="failed")
    make_run(root, "b", mismatches=1)
    with pytest.raises(NoEligibleRunError, match="2 runs: 1 not completed, 1 with lossless mismatches"):
        best(root)
    with pytest.raises(ValueError, match="valid: speedup, acceptance_length"):
        best(root, "final_loss")


def test_an_unreadable_result_is_listed_but_never_best(runs):
    (runs / "broken").mkdir()
    (runs / "broken" / "result.json").write_text("{ truncated")
    rows = {r["run_id"]: r for r in load_rows(runs)}
    assert rows["broken"]["status"] == "unreadable"
    assert best(runs)["run_id"] == "sweep/0"


def test_an_export_inside_the_runs_dir_is_not_a_run(runs):
    export = make_run(runs, "exported", speedup=9.0)
    (export / EXPORT_MANIFEST).write_text("{}")
    assert "exported" not in {r["run_id"] for r in load_rows(runs)}


def test_a_missing_runs_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(tmp_path / "nope")


# --- the runs table ---------------------------------------------------------------------


def test_table_lists_runs_by_speedup_with_their_figures(runs):
    lines = format_table(load_rows(runs)).splitlines()
    header = lines[0].split()
    assert header[:3] == ["run", "family", "params"] and "speedup" in header and "status" in header
    order = [line.split()[0] for line in lines[2:7]]
    # Runs that count first (completed, lossless, measured), then the rest, each by speedup:
    # the lossy 3.0x and the never-checked 2.5x rank below the lossless 1.10x.
    assert order == ["sweep/0", "sweep/1", "lossy", "unchecked", "sweep/2"]
    sweep0 = lines[2 + order.index("sweep/0")]
    for figure in ("12.3K", "2.10", "0.60/0.40", "13.0", "10.0", "1.30x", "4/4", "completed"):
        assert figure in sweep0
    assert "2/4" in lines[2 + order.index("lossy")]  # 2 of 4 prompts matched
    # each run that does not count says why in its own row
    assert "not lossless: 2/4" in lines[2 + order.index("lossy")]
    assert "never checked" in lines[2 + order.index("unchecked")]
    assert "RuntimeError: out of memory" in lines[2 + order.index("sweep/2")]
    assert any("sweep/2: RuntimeError: out of memory" in line for line in lines)


def test_rows_below_the_best_baseline_are_marked(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "ngram", speedup=1.20, family="ngram", params=0)
    make_run(root, "suffix", speedup=1.40, family="suffix", params=0)
    make_run(root, "suffix-lossy", speedup=5.0, family="suffix", params=0, mismatches=1)  # never the bar
    make_run(root, "mlp", speedup=1.30)
    make_run(root, "eagle", speedup=1.50, family="eagle")
    make_run(root, "failed", status="failed")
    lines = {line.split()[0]: line for line in format_table(load_rows(root)).splitlines()[2:8]}
    assert lines["mlp"].rstrip().endswith("below baseline (suffix 1.40x)")
    assert "below" not in lines["eagle"] and lines["eagle"].rstrip().endswith("completed")
    assert lines["ngram"].rstrip().endswith("baseline") and lines["suffix"].rstrip().endswith("baseline")
    assert "below" not in lines["failed"]  # a run that does not count shows its reason instead
    assert list(lines)[:4] == ["eagle", "suffix", "mlp", "ngram"]


@pytest.mark.parametrize("corpus", [300_000, 0, "lots", None])
def test_a_suffix_reading_the_training_data_is_a_candidate_not_the_baseline(tmp_path, corpus):
    root = tmp_path / "runs"
    make_run(root, "suffix", speedup=1.40, family="suffix", params=0)
    with_corpus = make_run(root, "suffix-corpus", speedup=1.80, family="suffix", params=0)
    result = read_result(with_corpus)
    result["config"] = {"speculator": {"family": "suffix", "corpus_tokens": corpus}}
    write_result(with_corpus, result)
    make_run(root, "mlp", speedup=1.60)
    lines = {line.split()[0]: line.rstrip() for line in format_table(load_rows(root)).splitlines()[2:5]}
    if corpus == 300_000:  # the bar stays the paper's drafter; the corpus run is read against it
        assert not lines["suffix-corpus"].endswith("baseline") and "below" not in lines["mlp"]
    else:  # no corpus (or none a reader can trust): the paper's drafter, the bar
        assert lines["suffix-corpus"].endswith("baseline")
        assert lines["mlp"].endswith("below baseline (suffix 1.80x)")
    assert lines["suffix"].endswith("baseline")


def test_a_hybrid_row_says_whether_it_beats_its_parts(tmp_path):
    root = tmp_path / "runs"
    for name, speedup, parts in (("good", 1.9, (1.1, 1.8)), ("weak", 1.7, (1.1, 1.8)), ("odd", 1.7, ("x", 1.8))):
        run_dir = make_run(root, name, speedup=speedup, family="hybrid")
        result = read_result(run_dir)
        result["parts"] = {"learned": {"speedup": parts[0]}, "suffix": {"speedup": parts[1]}}
        write_result(run_dir, result)
    lines = {line.split()[0]: line.rstrip() for line in format_table(load_rows(root)).splitlines()[2:5]}
    assert lines["good"].endswith("beats its parts (learned 1.10x, suffix 1.80x)")
    assert lines["weak"].endswith("parts (learned 1.10x, suffix 1.80x)") and "beats" not in lines["weak"]
    assert "parts" not in lines["odd"]  # a malformed parts block is not shown


def test_the_table_shows_the_method_each_run_chose(tmp_path):
    root = tmp_path / "runs"
    chain, tree = make_run(root, "chain"), make_run(root, "tree", speedup=1.5)
    for run_dir, chosen in ((chain, {"kind": "chain", "k": 3}),
                            (tree, {"kind": "tree", "shape": "dynamic", "depth": 4, "top_k": 2, "budget": 8})):
        result = read_result(run_dir)
        result["method"] = {"chosen": chosen, "candidates": [], "verify_cost_ms": {"1": 1.0}}
        write_result(run_dir, result)
    make_run(root, "fixed", speedup=1.1)
    table = format_table(load_rows(root)).splitlines()
    column = re.split(r"\s{2,}", table[0]).index("method")
    methods = {cells[0]: cells[column] for cells in (re.split(r"\s{2,}", line) for line in table[2:5])}
    assert methods == {"tree": "tree 8 (d4 x2)", "chain": "chain k=3", "fixed": "-"}


def test_per_position_is_compact_and_table_handles_no_runs():
    assert format_per_position([0.712, 0.5, 0.38, 0.271]) == "0.71/0.50/0.38/0.27"
    assert format_per_position([]) == "-"
    assert format_table([]) == "no runs"



# --- winners only where the intervals say so ------------------------------------------------


def test_rows_carry_their_interval_and_whether_the_leader_is_separated(tmp_path):
    root = tmp_path / "runs"
    # close on every prompt: the paired ratio interval holds 1
    make_run(root, "a", speedup=1.80, per_prompt=[1.9, 1.5, 2.1, 1.7, 1.8, 1.9])
    make_run(root, "b", speedup=1.78, per_prompt=[1.85, 1.55, 2.0, 1.75, 1.75, 1.85])
    # slower on every prompt by a tenth or more: separated
    make_run(root, "c", speedup=1.5, per_prompt=[1.6, 1.3, 1.8, 1.4, 1.5, 1.6])
    rows = {r["run_id"]: r for r in load_rows(root)}
    assert rows["a"]["leader"] and not rows["a"]["tied_with_leader"]
    assert rows["b"]["tied_with_leader"] and rows["b"]["vs_leader"]["by"] == "paired"
    assert not rows["c"]["tied_with_leader"] and rows["c"]["vs_leader"]["ci"][1] < 1
    lo, hi = rows["c"]["speedup_ci"]
    assert lo < 1.5 < hi
    table = format_table(list(rows.values()))
    line = {r: next(ln for ln in table.splitlines() if ln.startswith(r + " ")) for r in "abc"}
    assert "leader" in line["a"] and "tied" in line["b"] and "behind" in line["c"]


def test_rows_without_per_prompt_records_compare_by_their_recorded_intervals(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "a", speedup=1.8)
    make_run(root, "b", speedup=1.7)
    for name, ci in (("a", [1.47, 2.02]), ("b", [1.51, 1.91])):
        result = read_result(root / name)
        result["ci"] = {"speedup_total": ci}
        write_result(root / name, result)
    rows = {r["run_id"]: r for r in load_rows(root)}
    assert rows["b"]["speedup_ci"] == [1.51, 1.91]
    assert rows["b"]["tied_with_leader"] and rows["b"]["vs_leader"] == {"tied": True, "by": "intervals"}


def test_below_baseline_only_where_the_interval_says_so(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "ngram", family="ngram", params=0, speedup=1.77, per_prompt=[1.9, 1.5, 2.1, 1.7, 1.8, 1.9])
    make_run(root, "close", speedup=1.72, per_prompt=[1.8, 1.55, 2.0, 1.75, 1.7, 1.85])
    make_run(root, "slow", speedup=1.3, per_prompt=[1.4, 1.1, 1.5, 1.3, 1.3, 1.4])
    table = format_table(load_rows(root))
    assert "tied with baseline (ngram 1.77x)" in next(ln for ln in table.splitlines() if ln.startswith("close"))
    assert "below baseline (ngram 1.77x)" in next(ln for ln in table.splitlines() if ln.startswith("slow"))


def test_runs_by_category(tmp_path, capsys):
    from speclab.sweeps.cli import main

    root = tmp_path / "runs"
    make_run(root, "a", speedup=1.5, by_category={
        "math": {"prompts": 2, "speedup": 1.2, "speedup_ci": [1.1, 1.3], "acceptance_length": 1.8,
                 "acceptance_rate": 0.3},
        "long_context": {"prompts": 3, "speedup": 2.1, "speedup_ci": [1.9, 2.3], "acceptance_length": 3.1,
                         "acceptance_rate": 0.6}})
    make_run(root, "old", speedup=1.4)  # recorded before categories: left out
    assert main(["runs", "--runs", str(root), "--by-category"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["run", "family", "category", "prompts", "speedup", "95%", "CI", "acc.len", "acc.rate"]
    assert out[2].split() == ["a", "mlp", "long_context", "3", "2.10x", "1.90-2.30", "3.10", "0.60"]
    assert out[3].split()[:5] == ["a", "mlp", "math", "2", "1.20x"] and len(out) == 4
