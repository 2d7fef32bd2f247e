"""Each dashboard view in headless Chromium over a generated runs folder (three families,
the baselines, a failed run, a run training, a malformed record), checked as a person would
see it: every chart drawn with its legend, no text over other text, the table fitting or
scrolling, the run page reached by a click, two runs compared."""

import json
import os
import threading
import time

import pytest
from dashboard_runs import generate
from test_dashboard import artifacts_dir, chromium, needs_chromium

from speclab.sweeps.dashboard.browser import Browser
from speclab.sweeps.dashboard.server import make_server
from speclab.sweeps.results import failed_result, write_result

RUNS = 100  # learned runs: the load time is measured over this many

# [chart id, what is wrong] for each visible chart that is not drawn or has no legend
# (parallel coordinates carry a colour bar instead: its lines have no names)
UNDRAWN = """[...document.querySelectorAll('.js-plotly-plot')].filter(gd => gd.offsetParent).flatMap(gd => {
  const svg = gd.querySelector('.main-svg');
  if (!svg || !gd.data || !gd.data.length) return [[gd.id, 'not drawn']];
  if (gd.data[0].type === 'parcoords') return gd.querySelector('.colorbar') ? [] : [[gd.id, 'no colour bar']];
  return gd.querySelectorAll('.legend .traces').length ? [] : [[gd.id, 'no legend']];
})"""

# pairs of visible texts inside one chart whose boxes overlap by more than 2 px each way
OVERLAPS = """[...document.querySelectorAll('.js-plotly-plot')].filter(gd => gd.offsetParent).flatMap(gd => {
  const boxes = [...gd.querySelectorAll('svg text')].filter(t => t.textContent.trim() && !t.closest('.hoverlayer'))
    .map(t => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0 && r.height > 0);
  const out = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i][1], b = boxes[j][1];
    const x = Math.min(a.right, b.right) - Math.max(a.left, b.left), y = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (x > 2 && y > 2) out.push([gd.id, boxes[i][0], boxes[j][0]]);
  }
  return out;
})"""

# cells whose text is cut, and whether the leaderboard fits the window or scrolls in its box
TABLE = """(() => {
  const box = document.getElementById('leaderboard-scroll');
  const cut = [...box.querySelectorAll('td, th')].filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent);
  const fits = box.scrollWidth <= box.clientWidth && box.getBoundingClientRect().right <= window.innerWidth;
  return {cut, fits, scrolls: getComputedStyle(box).overflowX === 'auto'};
})()"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("generated") / "runs"
    special = generate(root, runs=RUNS)
    server = make_server(root, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, special, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def check_view(browser, name):
    assert browser.evaluate(UNDRAWN) == [], name
    assert browser.evaluate(OVERLAPS) == [], name
    browser.screenshot(os.path.join(artifacts_dir(), f"dashboard-{name}.png"))


@needs_chromium
def test_every_view_over_a_generated_sweep(generated):
    root, special, url = generated
    browser = Browser(chromium, 1400, 1800)
    try:
        start = time.perf_counter()
        browser.call("Page.navigate", url=url)
        browser.wait_for("document.body && document.body.dataset.drawn === 'overview'", timeout=120)
        load_s = time.perf_counter() - start
        rows = RUNS + 2 + 3  # learned, baselines, failed + training + malformed
        assert browser.evaluate("document.querySelectorAll('#leaderboard tbody tr').length") == rows
        with open(os.path.join(artifacts_dir(), "dashboard-load.json"), "w") as f:
            json.dump({"runs": rows, "load_s": load_s}, f)
        print(f"overview of {rows} runs drawn in {load_s:.2f} s")
        check_view(browser, "overview")
        table = browser.evaluate(TABLE)
        assert table["cut"] == [] and (table["fits"] or table["scrolls"])
        # the failed run's one-line reason and the malformed record's problem are on the page
        text = browser.evaluate("document.body.innerText")
        assert "out of memory at step 12" in text and "acceptance is not an object" in text
        assert "training (step" in text
        # every run with a draft cost is on the Pareto chart, the baselines included
        points = browser.evaluate("document.getElementById('pareto').data.filter(t => t.meta === 'point')"
                                  ".reduce((n, t) => n + t.x.length, 0)")
        assert points == RUNS + 2

        browser.evaluate("location.hash = 'sweep'")
        browser.wait_for("document.body.dataset.drawn === 'sweep'")
        assert browser.evaluate("Number(document.getElementById('parcoords').dataset.axes)") >= 5
        assert browser.evaluate("document.querySelectorAll('#parcoords canvas').length") > 0
        check_view(browser, "sweep")

        # a run page, reached by clicking its row's link
        browser.evaluate("location.hash = 'overview'")
        browser.wait_for("document.body.dataset.drawn === 'overview'")
        name = browser.evaluate("document.querySelector('#leaderboard tbody tr a.run-link').textContent")
        browser.evaluate("document.querySelector('#leaderboard tbody tr a.run-link').click()")
        browser.wait_for("document.body.dataset.drawn === 'run' && !!document.getElementById('run-loss')")
        assert browser.evaluate("document.querySelector('#run-head h2').textContent") == name
        for chart in ("run-acceptance", "run-prompts", "run-categories", "run-verify", "run-methods", "run-loss"):
            assert browser.evaluate(f"document.getElementById('{chart}').data.length") > 0, chart
        assert sorted(browser.evaluate("document.getElementById('run-loss').data.filter(t => t.meta === 'event')"
                                       ".map(t => t.name)")) == ["restart", "rollback", "spike"]
        text = browser.evaluate("document.body.innerText")
        assert "Lossless record" in text and "Data and cache" in text and "checkpoints/speculator" in text
        check_view(browser, "run")

        # compare: two rows ticked, the button pressed
        browser.evaluate("location.hash = 'overview'")
        browser.wait_for("document.body.dataset.drawn === 'overview'")
        browser.evaluate("[...document.querySelectorAll('input.pick')].slice(0, 2).forEach(b => b.click())")
        browser.evaluate("document.getElementById('compare-button').click()")
        browser.wait_for("document.body.dataset.drawn === 'compare' && !!document.getElementById('compare-config')")
        assert browser.evaluate("document.querySelectorAll('#compare-config tr.diff').length") >= 1
        assert browser.evaluate("document.getElementById('run-acceptance').data.length") == 2
        check_view(browser, "compare")

        # live: the training run's page follows its log, then shows why it failed
        training = special["training"].relative_to(root).as_posix()
        browser.evaluate(f"location.hash = 'run=' + encodeURIComponent({json.dumps(training)})")
        browser.wait_for("document.body.dataset.drawn === 'run' && !!document.getElementById('run-progress')")
        assert browser.evaluate("document.getElementById('run-loss').data.find(t => t.meta === 'curve').x") == [0, 5, 10, 15]
        with open(special["training"] / "logs" / "metrics.csv", "a") as f:
            f.write("".join(f"0,{s},{4 - s * 0.01:.3f}\n" for s in range(20, 60, 5)))
        browser.wait_for("document.getElementById('run-loss').data.find(t => t.meta === 'curve').x.length === 12",
                         timeout=20)
        write_result(special["training"], failed_result("late", {}, RuntimeError("loss is NaN at step 61")))
        browser.wait_for("document.body.innerText.includes('loss is NaN at step 61')", timeout=20)
        browser.evaluate("location.hash = 'overview'")
        browser.wait_for("[...document.querySelectorAll('#failures p')].some(p => p.innerText.includes('loss is NaN'))")
        assert browser.errors() == []
    finally:
        browser.close()
