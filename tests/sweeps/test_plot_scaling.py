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
    assert svg.count("<rect") == 1 + 1 and "suffix 1.60-1.80x" in svg  # the legend's swatch and the band
    assert main(["--runs", str(tmp_path / "a"), "--runs", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
