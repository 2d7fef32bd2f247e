"""The data-scaling figure and table: a point per counted learned run, read from result.json."""

from speclab.sweeps.plot_scaling import main, points, recipe_of
from speclab.sweeps.results import new_result, write_result


def run(root, name, family, tokens, length, speedup=1.2, stages=None, source="code_prompts", mismatches=0):
    config = {"data": {"source": source}, "training": {"stages": stages or []}}
    result = new_result(name, config)
    result["status"] = "completed"
    result["speculator"] = {"family": family, "params": 0 if family in ("ngram", "suffix") else 10}
    result["acceptance"].update(k=2, mean_acceptance_length=length, per_position=[length - 1, 0.0])
    result["throughput"] = {"baseline_tok_s": 10.0, "spec_tok_s": 10 * speedup, "speedup": speedup}
    result["lossless"] = {"checked_prompts": 4, "mismatches": mismatches}
    result["train"] = {"wall_s": 30.0}
    blocks = [{"assistant_tokens": t, "build_seconds": 5.0} for t in tokens]
    result["data"] = {**blocks[-1], "feature_cache": [{"seconds": 7.0}]}
    if len(blocks) > 1:
        result["data"]["stages"] = blocks
    (root / name).mkdir(parents=True)
    write_result(root / name, result)


def test_recipes_are_read_from_the_resolved_config():
    assert recipe_of({"training": {"stages": [{"data": {}}]}, "data": {"source": "code_prompts"}}) == "two_stage"
    assert recipe_of({"training": {"stages": []}, "data": {"source": "code_corpus"}}) == "teacher_forced"
    assert recipe_of({"training": {}, "data": {"source": "self_distill"}}) == "self_distilled"


def test_points_sum_every_stage_and_skip_runs_that_do_not_count(tmp_path):
    run(tmp_path, "sd-30k", "mlp", [30_000], 1.3)
    run(tmp_path, "ts", "mlp", [30_000, 30_500], 1.4, stages=[{"data": {}}, {"data": {}}])
    run(tmp_path, "lossy", "mlp", [100_000], 3.0, mismatches=1)
    run(tmp_path, "suffix", "suffix", [0], 2.2, speedup=1.7)
    learned, baselines = points(tmp_path)
    assert [(p["run"], p["recipe"], p["tokens"]) for p in learned] == [("sd-30k", "self_distilled", 30_000),
                                                                      ("ts", "two_stage", 60_500)]
    assert learned[1]["data_s"] == 5.0 + 5.0 + 7.0 and learned[1]["train_s"] == 30.0
    assert baselines == [{"family": "suffix", "acceptance_length": 2.2, "speedup": 1.7}]


def test_the_figure_and_table_carry_every_point(tmp_path, capsys):
    for tokens, length in ((30_000, 1.3), (100_000, 1.45)):
        run(tmp_path / "runs", f"sd-{tokens}", "mlp", [tokens], length)
    out = tmp_path / "fig.svg"
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(out), "--markdown"]) == 0
    svg = out.read_text()
    assert svg.count("<circle") == 2 and "self_distilled · mlp" in svg and "1e4" in svg and "1e5" in svg
    table = capsys.readouterr().out
    assert "| self_distilled | mlp | 100,000 | 1.45 |" in table and "| 30,000 |" in table


def test_no_learned_run_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["--runs", str(tmp_path / "empty")]) == 1
    assert "no counted learned runs" in capsys.readouterr().err


def test_several_runs_dirs_make_one_grid_and_a_baseline_scored_twice_is_a_band(tmp_path, capsys):
    run(tmp_path / "a", "sd-30k", "hydra", [30_000], 1.4)
    run(tmp_path / "a", "suffix-a", "suffix", [0], 2.2, speedup=1.6)
    run(tmp_path / "b", "sd-300k", "hydra", [300_000], 1.5)
    run(tmp_path / "b", "suffix-b", "suffix", [0], 2.3, speedup=1.8)
    out = tmp_path / "fig.svg"
    assert main(["--runs", str(tmp_path / "a"), "--runs", str(tmp_path / "b"), "--out", str(out)]) == 0
    svg = out.read_text()
    assert svg.count("<circle") == 2 and svg.count("<polyline") == 1  # one line through both sweeps' points
    assert svg.count("<rect") == 1 and "suffix 1.60-1.80x" in svg  # the band
    assert main(["--runs", str(tmp_path / "a"), "--runs", str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err


CELLS = """recipe,family,budget,acceptance_length,speedup,date,host
self_distilled,mlp,30000,1.29,1.14,2026-12-01,a
two_stage,mlp,30000,1.37,1.21,2026-12-01,a
self_distilled,hydra,30000,1.41,1.05,2026-12-02,b
self_distilled,hydra,30000,1.41,1.17,2026-12-03,b
baseline,suffix,0,2.17,1.68,2026-12-01,a
baseline,suffix,0,2.31,1.79,2026-12-02,b
"""


def test_recorded_cells_are_drawn_with_the_runs_a_two_stage_cell_at_its_stages_sum(tmp_path, capsys):
    from speclab.sweeps.plot_scaling import cells
    path = tmp_path / "cells.csv"
    path.write_text(CELLS)
    learned, baselines = cells(path)
    assert [(p["recipe"], p["family"], p["tokens"], p["speedup"]) for p in learned] == [
        ("self_distilled", "hydra", 30_000, 1.05), ("self_distilled", "hydra", 30_000, 1.17),
        ("self_distilled", "mlp", 30_000, 1.14), ("two_stage", "mlp", 60_000, 1.21)]
    assert [b["acceptance_length"] for b in baselines] == [2.17, 2.31]
    run(tmp_path / "runs", "sd-100k", "mlp", [100_000], 1.57)
    out = tmp_path / "fig.svg"
    assert main(["--cells", str(path), "--runs", str(tmp_path / "runs"), "--out", str(out), "--markdown"]) == 0
    svg = out.read_text()
    assert svg.count("<circle") == 5 and svg.count("<polyline") == 3  # the run joins the recorded mlp line
    assert "suffix 1.68-1.79x" in svg and "2026-12-03 b: 1.41, 1.17x" in svg
    assert svg.count('stroke-dasharray="2 3"') == 2  # two_stage dotted: its line and its legend
    assert "| two_stage | mlp | 60,000 | 1.37 |" in capsys.readouterr().out


def test_a_bad_cells_file_names_its_line_and_draws_nothing(tmp_path, capsys):
    path, out = tmp_path / "cells.csv", tmp_path / "fig.svg"
    header = CELLS.splitlines()[0]
    for row, said in (("guessed,mlp,30000,1.3,1.1,d,h", "line 3: recipe 'guessed'"),
                      ("self_distilled,mlp,lots,1.3,1.1,d,h", "line 3: invalid literal"),
                      ("self_distilled,mlp,30000,0.9,1.1,d,h", "line 3: acceptance 0.9 must be >= 1"),
                      ("baseline,suffix,30000,2.2,1.6,d,h", "line 3: budget 30000")):
        path.write_text(f"{header}\n{CELLS.splitlines()[1]}\n{row}\n")
        assert main(["--cells", str(path), "--out", str(out)]) == 2
        assert said in capsys.readouterr().err and not out.exists()
    path.write_text("recipe,family,tokens\nself_distilled,mlp,30000\n")
    assert main(["--cells", str(path)]) == 2
    assert "no column budget, acceptance_length, speedup, date, host" in capsys.readouterr().err
    assert main(["--cells", str(tmp_path / "nowhere.csv")]) == 2
    assert "not found" in capsys.readouterr().err
