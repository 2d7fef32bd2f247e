"""The dashboard's screenshots for the docs, drawn from a runs directory's records.

    python -m speclab.sweeps.dashboard.capture --runs runs/demo --out docs/dashboard

Serves the runs directory on a free local port, opens each view in headless Chromium (apt's
`chromium`; websocket-client, a dev dependency, speaks to it) at 1400 px wide and writes
overview.png, sweep.png, run.png (the counted run with the highest speedup) and compare.png
(the counted runs with the highest speedups, up to COMPARE of them).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from urllib.parse import quote

from ..run_rows import load_rows
from ..table import counts
from .browser import Browser, find_chromium
from .server import make_server

COMPARE = 4
WIDTH, HEIGHT = 1400, 1800
SETTLE_S = 1.0  # Plotly finishes its layout a frame or two after the view reports drawn


def views(root: Path) -> dict[str, str]:
    """{file stem: the page's hash} of each view worth a picture."""
    ranked = sorted((r for r in load_rows(root) if counts(r)), key=lambda r: -r["speedup"])
    out = {"overview": "overview", "sweep": "sweep"}
    if ranked:
        out["run"] = "run=" + quote(ranked[0]["run_dir"], safe="")
    if len(ranked) >= 2:
        out["compare"] = "compare=" + quote("|".join(r["run_dir"] for r in ranked[:COMPARE]), safe="")
    return out


def capture(root: Path, out: Path, executable: str) -> list[Path]:
    server = make_server(root, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Browser(executable, WIDTH, HEIGHT)
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stem, view in views(root).items():
            browser.call("Page.navigate", url=url + "#" + view)
            name = view.split("=")[0]
            browser.wait_for(f"document.body && document.body.dataset.drawn === '{name}'", timeout=120)
            time.sleep(SETTLE_S)
            browser.screenshot(str(out / f"{stem}.png"))
            written.append(out / f"{stem}.png")
        errors = browser.errors()
        if errors:
            raise RuntimeError(f"the page reported errors: {errors}")
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="runs directory to picture")
    parser.add_argument("--out", default="docs/dashboard", help="folder for the PNG files")
    args = parser.parse_args(argv)
    executable = find_chromium()
    if executable is None:
        raise SystemExit("no chromium found (apt-get install -y chromium)")
    for path in capture(Path(args.runs), Path(args.out), executable):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
