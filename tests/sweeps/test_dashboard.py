"""The dashboard: a read-only local page, checked in headless Chromium."""

import hashlib
import json
import os
import threading
import urllib.error
import urllib.request

import pytest
from speclab.sweeps.dashboard.browser import Browser, find_chromium
from test_run_rows import make_run

from speclab.sweeps.dashboard.data import state
from speclab.sweeps.dashboard.server import make_server
from speclab.sweeps.results import read_result, write_json_atomic, write_result



def artifacts_dir() -> str:
    """Where test artefacts go: $SPECLAB_TEST_ARTIFACTS, else artifacts/ at the repo root."""
    root = os.environ.get("SPECLAB_TEST_ARTIFACTS") or os.path.join(os.path.dirname(__file__), "..", "..", "artifacts")
    os.makedirs(root, exist_ok=True)
    return os.path.abspath(root)


EVIL = '<img src=x onerror="window.__pwned=1">'  # a run directory may be named anything


def add_training(run_dir, losses, rollbacks=(), restarts=()):
    result = read_result(run_dir)
    result["train"].update(loss_history=losses, steps=len(losses),
                           rollback_log=[{"step": s + 3, "onset": s, "target": t, "reason": "spike"} for s, t in rollbacks],
                           attempts=[{"attempt": 0, "status": "failed"}] + [{"attempt": i + 1, "resumed_from": r}
                                                                            for i, r in enumerate(restarts)])
    result["timing"] = {"draft_ms_per_token": 1.5}
    write_result(run_dir, result)


def add_data(run_dir, tokens):
    result = read_result(run_dir)
    result["data"] = {"assistant_tokens": tokens, "build_seconds": 3.0}
    write_result(run_dir, result)


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    sweep = root / "sweep-quick"
    a = make_run(sweep, "0-mlp-aaaa", speedup=1.4, acceptance_length=2.2, params=2_000_000)
    b = make_run(sweep, "1-draft_lm-bbbb", family="draft_lm", speedup=1.1, per_position=(0.5, 0.3, 0.1), params=5_000_000)
    make_run(sweep, "2-eagle3-cccc", family="eagle3", status="failed")
    evil = make_run(root, EVIL, speedup=0.9, params=9_000_000)
    for d in (a, b, sweep / "2-eagle3-cccc", sweep / "3-mlp-dddd"):
        (d / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    add_training(a, [3.0 - 0.01 * i for i in range(60)], rollbacks=[(20, 10)], restarts=[40])
    add_training(evil, [2.0] * 10)
    add_data(a, 30_000), add_data(b, 100_000)  # two points of the data-scaling chart
    # a job still training: no result.json yet, a live Lightning CSV log
    (sweep / "3-mlp-dddd" / "logs").mkdir()
    (sweep / "3-mlp-dddd" / "logs" / "metrics.csv").write_text("step,train/loss\n0,4.0\n1,3.5\n2,3.2\n")
    write_json_atomic(sweep / "halving.json", {
        "metric": "speedup", "budget_key": "training.max_steps", "eta": 2, "min_budget": 1, "candidates": 2,
        "rungs": [{"rung": 0, "budget": 1, "runs": [
            {"overrides": ["speculator=mlp"], "run_dir": str(a), "value": 1.4, "status": "completed", "promoted": True},
            {"overrides": [EVIL], "run_dir": str(b), "value": 1.1, "status": "completed", "promoted": False}]}],
        "winner": {"overrides": ["speculator=mlp"], "run_dir": str(a), "value": 1.4, "status": "completed"}})
    return root


def snapshot(root):
    """Every path, with each file's mtime and content hash (the test itself adds a run later)."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


@pytest.fixture
def served(runs):
    server = make_server(runs, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield runs, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_state_has_runs_curves_markers_and_sweep_progress(runs):
    payload = state(runs)
    by_dir = {r["run_dir"]: r for r in payload["runs"]}
    assert len(by_dir) == 5  # 4 recorded runs + 1 still running
    mlp = by_dir["sweep-quick/0-mlp-aaaa"]
    assert len(mlp["loss"]) == 60 and mlp["draft_ms_per_token"] == 1.5
    assert sorted((e["kind"], e["step"]) for e in mlp["events"]) == [("restart", 40), ("rollback", 10), ("spike", 20)]
    assert by_dir["sweep-quick/3-mlp-dddd"]["status"] == "running" and len(by_dir["sweep-quick/3-mlp-dddd"]["loss"]) == 3
    (sweep,) = payload["sweeps"]
    assert (sweep["jobs"], sweep["completed"], sweep["failed"], sweep["running"]) == (4, 2, 1, 1)
    assert sweep["halving"]["winner"]["value"] == 1.4


def test_server_binds_locally_and_serves_only_its_routes(served):
    runs, url = served
    assert url.startswith("http://127.0.0.1:")
    for path in ("../", "..%2f..%2fetc/passwd", "%2e%2e/%2e%2e/etc/passwd", "api/state/../../etc/passwd",
                 "sweep-quick/0-mlp-aaaa/result.json", "static/../../result.json", "static/../server.py",
                 "static/js/../../server.py", "static/%2e%2e/data.py", "static/page.html",
                 "api/run?dir=../../etc", "api/run?dir=/etc/passwd", "api/run?dir=sweep-quick",
                 "api/run?dir=sweep-quick/0-mlp-aaaa/../0-mlp-aaaa", "api/run"):
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(url + path, timeout=10)
        assert exc.value.code == 404, path
    body = json.loads(urllib.request.urlopen(url + "api/state", timeout=10).read())
    assert len(body["runs"]) == 5
    run = json.loads(urllib.request.urlopen(url + "api/run?dir=sweep-quick/0-mlp-aaaa", timeout=10).read())
    assert run["run_id"] == "0-mlp-aaaa" and len(run["loss"]) == 60
    plotly = urllib.request.urlopen(url + "static/plotly.min.js", timeout=10)
    assert plotly.headers["Content-Type"].startswith("text/javascript") and b"plotly.js" in plotly.read(2000)
    csp = plotly.headers["Content-Security-Policy"]
    assert "script-src 'self' 'unsafe-eval';" in csp and "unsafe-inline" not in csp.split("style-src")[0]


chromium = find_chromium()
needs_chromium = pytest.mark.skipif(chromium is None and not os.environ.get("SPECLAB_REQUIRE_CHROMIUM"),
                                    reason="no chromium (apt-get install -y chromium; .ci/run installs it)")


def traces(browser, chart, meta=None):
    """The Plotly traces drawn in a chart (of one `meta` kind), as [name, number of points]."""
    return browser.evaluate(f"(document.getElementById({json.dumps(chart)}).data || [])"
                            f".filter(t => {json.dumps(meta)} === null || t.meta === {json.dumps(meta)})"
                            ".map(t => [t.name, (t.x || []).length])")


@needs_chromium
def test_page_in_headless_chromium(served):
    runs, url = served
    before = snapshot(runs)
    browser = Browser(chromium)
    try:
        browser.call("Page.navigate", url=url)
        browser.wait_for("document.querySelectorAll('#leaderboard tbody tr').length === 5")
        browser.wait_for("document.body.dataset.drawn === 'overview'")
        browser.evaluate("document.getElementById('cost').value = 'params'; "
                         "document.getElementById('cost').dispatchEvent(new Event('change'))")
        assert sum(n for _, n in traces(browser, "pareto", "point")) == 3  # measured runs
        assert len(traces(browser, "pareto", "front")) == 1
        assert len(traces(browser, "acceptance")) == 3
        assert len(traces(browser, "loss", "curve")) == 3
        assert sum(n for _, n in traces(browser, "scaling", "point")) == 2
        assert browser.evaluate("document.querySelectorAll('#scaling .legend .traces').length") == 2  # mlp, draft_lm
        assert sorted(name for name, _ in traces(browser, "loss", "event")) == ["restart", "rollback", "spike"]
        assert browser.evaluate("document.querySelectorAll('.halving tr').length") == 3
        # strings from run names are text, never markup: the evil name shows, nothing runs
        assert browser.evaluate(f"document.body.innerText.includes({json.dumps(EVIL)})")
        # in a chart's legend too, as the same characters (Plotly reads tags in labels: they are escaped)
        assert browser.evaluate("[...document.querySelectorAll('#acceptance .legend text')]"
                                f".some(t => t.textContent === {json.dumps(EVIL[:27] + '…')})")
        assert browser.evaluate("document.querySelectorAll('img').length") == 0
        assert browser.evaluate("window.__pwned === undefined")
        # sorting by header clicks: params descending (the 9M run first), then ascending (the
        # failed run's 12K first); the running job has no count and stays last both ways
        click = "[...document.querySelectorAll('#leaderboard th')].find(t => t.dataset.key === 'params').click()"
        first, last = ("document.querySelector('#leaderboard tbody tr:%s-child td:nth-child(2)').textContent" % end
                       for end in ("first", "last"))
        browser.evaluate(click)
        assert (browser.evaluate(first), browser.evaluate(last)) == (EVIL, "sweep-quick/3-mlp-dddd")
        browser.evaluate(click)
        assert (browser.evaluate(first), browser.evaluate(last)) == ("2-eagle3-cccc", "sweep-quick/3-mlp-dddd")
        # live: a run that appears is shown at the next refresh
        make_run(runs / "sweep-quick", "4-hydra-eeee", family="hydra", speedup=1.2)
        browser.wait_for("document.querySelectorAll('#leaderboard tbody tr').length === 6", timeout=20)
        browser.screenshot(os.path.join(artifacts_dir(), "dashboard.png"))
        # the evil run's page, reached by its link: its name is text there too
        browser.evaluate(f"[...document.querySelectorAll('a.run-link')].find(a => a.textContent === {json.dumps(EVIL)}).click()")
        browser.wait_for("document.body.dataset.drawn === 'run'")
        assert browser.evaluate("document.querySelector('#run-head h2').textContent") == EVIL
        assert browser.evaluate("document.querySelectorAll('img').length") == 0
        assert browser.evaluate("window.__pwned === undefined")
        assert browser.errors() == []
    finally:
        browser.close()
    after = snapshot(runs)
    after.pop("sweep-quick/4-hydra-eeee"), after.pop("sweep-quick/4-hydra-eeee/result.json")
    assert after == before  # the page changed nothing on disk


def test_state_says_which_runs_count_and_marks_the_baselines(runs):
    make_run(runs / "sweep-quick", "baseline-suffix", family="suffix", params=0, speedup=1.2)
    make_run(runs / "sweep-quick", "lossy-mlp", speedup=2.5, mismatches=1)
    payload = state(runs)
    by_dir = {r["run_dir"]: r for r in payload["runs"]}
    assert by_dir["sweep-quick/baseline-suffix"]["note"] == "baseline"
    scaling = payload["scaling"]  # the data-scaling chart: learned runs with tokens, the baselines as lines
    assert sorted(p["tokens"] for p in scaling["points"]) == [30_000, 100_000]
    assert [b["family"] for b in scaling["baselines"]] == ["suffix"]
    assert by_dir["sweep-quick/0-mlp-aaaa"]["counts"] and by_dir["sweep-quick/0-mlp-aaaa"]["note"] == ""  # 1.4x
    assert by_dir["sweep-quick/1-draft_lm-bbbb"]["note"] == "below baseline (suffix 1.20x)"  # 1.1x
    failed, lossy = by_dir["sweep-quick/2-eagle3-cccc"], by_dir["sweep-quick/lossy-mlp"]
    assert not failed["counts"] and "out of memory" in failed["note"]  # its one-line reason, in the row
    assert not lossy["counts"] and lossy["note"].startswith("not lossless")


@needs_chromium
def test_a_rows_tie_and_interval_are_shown(served, monkeypatch):
    """The results table's own verdicts, where a row carries them: `tied_with_leader` marks
    the speedup "tied", and `speedup_ci` is the interval shown beside it."""
    from speclab.sweeps.dashboard import data

    runs, url = served
    rows = data.load_rows

    def with_verdicts(root):
        out = rows(root)
        for row in out:
            if row["run_dir"] == "sweep-quick/1-draft_lm-bbbb":
                row.update(tied_with_leader=True, speedup_ci=[0.95, 1.25])
        return out

    monkeypatch.setattr(data, "load_rows", with_verdicts)
    browser = Browser(chromium)
    try:
        browser.call("Page.navigate", url=url)
        browser.wait_for("document.body && document.body.dataset.drawn === 'overview'")
        cell = "document.querySelector('tr[data-run=\"sweep-quick/1-draft_lm-bbbb\"] td:nth-child(10)')"
        assert browser.evaluate(cell + ".textContent") == "1.10x [0.95, 1.25]tied"
        assert browser.evaluate("document.querySelectorAll('.tied').length") == 1
        assert browser.errors() == []
    finally:
        browser.close()
