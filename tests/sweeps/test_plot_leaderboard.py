"""The leaderboard figure draws exactly the runs that count, from their result.json."""

import pytest

from speclab.sweeps.plot_leaderboard import leaderboard, main
from speclab.sweeps.results import new_result, write_result


def run(root, name, family, speedup, length, mismatches=0):
    result = new_result(name)
    result["speculator"] = {"family": family, "params": 10}
    result["acceptance"].update(mean_acceptance_length=length)
    result["throughput"] = {"baseline_tok_s": 10.0, "spec_tok_s": 10.0 * speedup, "speedup": speedup}
    result["lossless"] = {"checked_prompts": 3, "mismatches": mismatches}
    (root / name).mkdir(parents=True)
    write_result(root / name, result)


def test_counted_runs_best_first_baselines_marked(tmp_path):
    run(tmp_path, "a-mlp", "mlp", 0.8, 1.3)
    run(tmp_path, "b-ngram", "ngram", 1.1, 1.6)
    run(tmp_path, "c-eagle3", "eagle3", 1.4, 2.1)
    run(tmp_path, "d-hydra", "hydra", 2.0, 2.5, mismatches=1)  # not lossless: never drawn
    entries = leaderboard(tmp_path)
    assert [(e["name"], e["baseline"]) for e in entries] == [("c-eagle3", False), ("b-ngram", True), ("a-mlp", False)]
    assert entries[0]["speedup"] == pytest.approx(1.4) and entries[0]["acceptance_length"] == 2.1


def test_svg_names_every_run_and_its_figures(tmp_path):
    run(tmp_path, "runs/x<&>-mlp", "mlp", 0.84, 1.15)
    out = tmp_path / "fig" / "lb.svg"
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    svg = out.read_text()
    assert svg.startswith("<svg") and "x&lt;&amp;&gt;-mlp" in svg and "0.84x" in svg and "1.15" in svg


def test_no_counted_run_is_an_error_not_an_empty_figure(tmp_path):
    run(tmp_path, "a-mlp", "mlp", 0.8, 1.3, mismatches=2)
    with pytest.raises(SystemExit) as exit_:
        main(["--runs", str(tmp_path), "--out", str(tmp_path / "lb.svg")])
    assert exit_.value.code == 2 and not (tmp_path / "lb.svg").exists()


def test_a_record_draws_its_latest_full_scoring_as_the_runs_would(tmp_path):
    from speclab.sweeps import report
    from speclab.sweeps.records import RUN_COLUMNS

    run(tmp_path / "runs", "a-mlp", "mlp", 1.25, 1.5)
    run(tmp_path / "runs", "b-ngram", "ngram", 1.5, 1.75)
    run(tmp_path / "runs", "c-hydra", "hydra", 2.0, 2.5, mismatches=1)  # not lossless: never drawn
    report.append_record(tmp_path / "r.csv", report.record_rows(tmp_path / "runs", "first", "cmd"))
    partial = dict.fromkeys(RUN_COLUMNS, "") | {"scoring": "speeds only", "run": "a-mlp", "speedup": "9.0"}
    report.append_record(tmp_path / "r.csv", [partial])  # not a full scoring: not drawn
    from_runs, from_record = tmp_path / "runs.svg", tmp_path / "record.svg"
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(from_runs), "--title", "t"]) == 0
    assert main(["--record", str(tmp_path / "r.csv"), "--out", str(from_record), "--title", "t"]) == 0
    assert from_record.read_text() == from_runs.read_text()
