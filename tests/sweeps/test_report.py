"""`report record` turns a runs folder's result.json files into record rows that `render` draws."""

from __future__ import annotations

import csv
import json

import pytest
from test_run_rows import make_run

from speclab.sweeps import report
from speclab.sweeps.results import write_result


def test_record_appends_one_scoring_per_call_in_the_runs_tables_order(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "sweep/0-mlp", speedup=1.30, acceptance_length=2.1)
    base = make_run(runs, "sweep/baseline-ngram", speedup=1.40, acceptance_length=1.8, family="ngram", params=0)
    data = json.loads((base / "result.json").read_text())
    data["ci"] = {"speedup_total": [1.21, 1.55]}
    data["target"] = {"dtype": "bf16"}
    write_result(base, data)

    argv = ["record", "--runs", str(runs), "--name", "demo", "--root", str(tmp_path), "--command", "make demo"]
    assert report.main([*argv, "--scoring", "first"]) == 0
    assert report.main([*argv, "--scoring", "second"]) == 0
    with open(tmp_path / "docs" / "records" / "demo.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(report.RUN_COLUMNS)
    assert [(r["scoring"], r["run"]) for r in rows] == [
        ("first", "sweep/baseline-ngram"), ("first", "sweep/0-mlp"),
        ("second", "sweep/baseline-ngram"), ("second", "sweep/0-mlp")]
    ngram, mlp = rows[:2]
    assert (ngram["speedup"], ngram["ci_low"], ngram["ci_high"], ngram["dtype"]) == ("1.40", "1.21", "1.55", "bf16")
    assert ngram["note"] == "baseline" and mlp["note"] == "below baseline (ngram 1.40x)"
    assert (mlp["params"], mlp["per_position"], mlp["lossless"]) == ("12.3K", "0.60/0.40", "4/4")
    assert ngram["date"] and ngram["machine"] and ngram["command"] == "make demo"

    assert report.main([*argv, "--scoring", "third", "--replace"]) == 0
    with open(tmp_path / "docs" / "records" / "demo.csv", newline="") as f:
        assert {r["scoring"] for r in csv.DictReader(f)} == {"third"}

    medians = report.medians(rows)
    assert "| sweep/0-mlp | mlp | - | 2.10 (2.10–2.10) | 1.30x (1.30–1.30) | 2 | 4/4 |" in medians
    printed = report.printout(rows)
    assert "sweep/baseline-ngram" in printed and "Command: `make demo`." in printed


def test_a_single_scoring_shows_its_interval(tmp_path):
    rows = [dict.fromkeys(report.RUN_COLUMNS, "") | {"scoring": "a", "run": "r", "family": "mlp", "speedup": "1.50",
                                                      "ci_low": "1.20", "ci_high": "1.80", "machine": "cpu"}]
    assert "| 1.50x (1.20–1.80) | 1 |" in report.medians(rows)


def test_a_bad_record_name_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report.main(["record", "--runs", str(tmp_path), "--name", "../x", "--root", str(tmp_path)])
    assert "letters, digits" in capsys.readouterr().err


def engine_bench_report(speedups: list[float]) -> dict:
    """A `bench --engine llama.cpp --json` report with one scoring per speedup of llama.cpp's draft."""
    def row(speedup, length, lossless=(2, 0), **extra):
        return {"tok_s": 100.0 * speedup, "speedup_total": speedup,
                "ci": {"speedup_total": [speedup - 0.1, speedup + 0.1]},
                "acceptance_length": length, "lossless": {"checked_prompts": lossless[0], "mismatches": lossless[1]},
                **extra}

    return {"config": {"target_config": {"dtype": "bf16"}}, "scorings": [
        {"methods": {"speclab plain": row(1.0, 1.0), "speclab eagle3 k=4": row(1.5, 2.5),
                     "llama.cpp plain": row(1.0, 1.0, drafted=0, accepted=0),
                     "llama.cpp draft-eagle3 k=4": row(s, 2.4, drafted=100, accepted=40)},
         "llama_plain_vs_speclab_plain": {"ratio": 0.8, "ci": [0.7, 0.9]}, "plain_tokens_agree": 2, "prompts": 2}
        for s in speedups]}


def test_an_engine_bench_is_recorded_and_drawn_with_its_median_and_range(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(engine_bench_report([1.2, 1.6, 1.4])))
    assert report.main(["record-engine", "--json", str(bench), "--name", "llama_cpp_eagle3", "--root", str(tmp_path),
                        "--command", "speclab bench --engine llama.cpp"]) == 0
    rows = report.read_record(tmp_path / "docs" / "records" / "llama_cpp_eagle3.csv")
    assert len(rows) == 12 and {r["engine"] for r in rows} == {"speclab", "llama.cpp"}
    table = report.engines(rows)
    line = next(line for line in table.splitlines() if "draft-eagle3" in line)
    assert "1.40x (1.20–1.60)" in line and "0.40" in line  # median (range) of 3 scorings; 120 of 300 drafts accepted
    assert "3 scorings in one process" in table and "ran 0.80x (0.80–0.80) speclab's plain tok/s" in table
    assert "2/2 prompts" in table


def test_an_engine_build_is_recorded_from_its_build_record(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "build.json").write_text(json.dumps({"version": "1.0", "tools": ["llama-server"], "jobs": 2,
                                                  "seconds": 265.2, "bin_bytes": 15_768_616, "src_bytes": 175_824_384}))
    argv = ["record-build", "--entry", str(entry), "--root", str(tmp_path),
            "--command", "speclab engine build llama.cpp"]
    assert report.main(argv) == 0 and report.main(argv) == 0  # appended
    rows = report.read_record(tmp_path / "docs" / "records" / "llama_cpp_build.csv")
    assert len(rows) == 2 and (rows[0]["seconds"], rows[0]["bin_mb"], rows[0]["src_mb"]) == ("265.2", "15.8", "175.8")
    assert "265 s (4.4 min)" in report.engine_builds(rows)


def test_a_repeated_bench_is_recorded_as_its_scorings_with_their_standings(tmp_path):
    def row(speedup, length, leader=False, tied=False):
        return {"speedup_total": speedup, "acceptance_length": length,
                "ci": {"speedup_total": [speedup - .2, speedup + .2]},
                "lossless": {"checked_prompts": 6, "mismatches": 0}, "leader": leader, "tied_with_leader": tied}

    bench = {"config": {"target_config": {"dtype": "bf16"}},
             "overall": {"plain": row(1.0, 1.0), "spec_hybrid": row(1.8, 2.6, leader=True),
                         "spec_suffix": row(1.7, 2.3, tied=True)},
             "repeats": {"plain": {"values": [1.0, 1.0, 1.0], "acceptance_lengths": [1, 1, 1],
                                   "standings": ["", "", ""]},
                         "spec_hybrid": {"values": [1.8, 1.6, 1.9], "acceptance_lengths": [2.6, 2.6, 2.6],
                                         "standings": ["leader", "tied", "leader"]},
                         "spec_suffix": {"values": [1.7, 1.75, 1.6], "acceptance_lengths": [2.3, 2.3, 2.3],
                                         "standings": ["tied", "leader", "tied"]}}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert report.main(["record-bench", "--json", str(path), "--name", "demo_repeat", "--root", str(tmp_path),
                        "--command", "speclab bench --repeat 3"]) == 0
    rows = report.read_record(tmp_path / "docs" / "records" / "demo_repeat.csv")
    assert len(rows) == 9
    table = report.repeated(rows)
    hybrid = next(line for line in table.splitlines() if "spec_hybrid" in line)
    assert "1.80x (1.60–1.90)" in hybrid and "1.60–2.00" in hybrid and "leader, tied, leader" in hybrid
    assert "3 scorings in one process" in table
    one = tmp_path / "one.json"
    one.write_text(json.dumps({**bench, "repeats": None}))
    with pytest.raises(SystemExit):
        report.main(["record-bench", "--json", str(one), "--name", "x", "--root", str(tmp_path), "--command", "c"])


def test_a_runtime_bench_report_is_appended_as_a_row_the_runtime_table_draws(tmp_path, capsys):
    # what runtime_bench's --json writes (its int keys become strings in JSON)
    entry = {"bound_ms": 10.0, "lean_ms": {"1": 11.0, "5": 13.2, "8": 16.5},
             "hf_generate_ms_per_token": 44.0, "prefill_ms": {"128": 48.04, "768": 484.66},
             "batched": {"8": {"lean_tok_s": 300.0}, "32": {"lean_tok_s": 612.4}}}
    timed_on = {"cpu": "Some EPYC", "cores": 4, "isa": ["avx2", "avx512f"], "date": "2026-01-02", "threads": 4}
    path = tmp_path / "runtime.json"
    path.write_text(json.dumps({"machine": timed_on, "read_bandwidth_gb_s": 27.04, "dtypes": {"bf16": entry}}))
    argv = ["record-runtime", "--json", str(path), "--root", str(tmp_path), "--command", "runtime_bench"]
    assert report.main(argv) == 0
    rows = report.read_record(tmp_path / "docs" / "records" / "runtime.csv")
    assert len(rows) == 1
    # the machine the report was timed on, not the one recording it
    assert (rows[0]["machine"], rows[0]["cpu_flags"], rows[0]["date"]) == ("Some EPYC (4 cores)", "avx2 avx512f",
                                                                           "2026-01-02")
    assert {k: rows[0][k] for k in ("read_gb_s", "step_ms", "pass5_ms", "pass8_ms", "batch32_tok_s", "generate_ms",
                                   "prefill_tokens", "prefill_ms", "dtype")} == {
        "read_gb_s": "27.0", "step_ms": "11.00", "pass5_ms": "13.20", "pass8_ms": "16.50", "batch32_tok_s": "612",
        "generate_ms": "44.00", "prefill_tokens": "768", "prefill_ms": "484.7", "dtype": "bf16"}
    line = report.runtime(rows).splitlines()[2]
    assert "11.00 (1.10x)" in line and "13.20 (1.20x)" in line and "16.50 (1.50x)" in line
    assert "484.7 (768 tokens)" in line and "4.00x faster" in line

    # a report timed without 8-token passes, prefills or batches leaves those cells empty
    del entry["lean_ms"]["8"], entry["batched"]["32"]
    entry["prefill_ms"] = {}
    path.write_text(json.dumps({"machine": timed_on, "read_bandwidth_gb_s": 27.0, "dtypes": {"bf16": entry}}))
    assert report.main(argv) == 0
    second = report.read_record(tmp_path / "docs" / "records" / "runtime.csv")[1]
    assert (second["pass8_ms"], second["batch32_tok_s"], second["prefill_ms"]) == ("", "", "")
    assert report.runtime([second]).splitlines()[2].count("–") == 3

    with pytest.raises(SystemExit):  # a dtype the report did not time
        report.main([*argv, "--dtype", "fp32"])
    assert "no fp32 figures" in capsys.readouterr().err
    for machine in ({}, [], {**timed_on, "cpu": "x | y\n"}, {**timed_on, "isa": ["avx2`"]}):  # unnamed, or not plain words
        path.write_text(json.dumps({"machine": machine, "read_bandwidth_gb_s": 27.0, "dtypes": {"bf16": entry}}))
        with pytest.raises(SystemExit):
            report.main(argv)
        assert "does not name a cpu" in capsys.readouterr().err
    assert len(report.read_record(tmp_path / "docs" / "records" / "runtime.csv")) == 2
