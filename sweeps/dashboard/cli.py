"""`speclab dashboard [--runs DIR] [--port PORT] [--host HOST]`."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_PORT = 8765


def add_dashboard_parser(commands) -> None:
    dash = commands.add_parser("dashboard", help="live results page: leaderboard, Pareto front, curves, sweeps")
    dash.add_argument("--runs", default="runs", help="directory holding the run directories")
    dash.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to serve on (0: any free port)")
    dash.add_argument("--host", default="127.0.0.1",
                      help="address to bind (default: this machine only; 0.0.0.0 exposes the page to the network)")


def run_dashboard(args: argparse.Namespace) -> int:
    from .server import make_server

    root = Path(args.runs)
    if not root.is_dir():
        raise FileNotFoundError(f"runs directory {root} does not exist")
    server = make_server(root, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"speclab dashboard for {root.resolve()} at http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
