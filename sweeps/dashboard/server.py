"""The dashboard's HTTP server: the standard library's, two routes, read-only.

    GET /            the page (page.html: inline SVG + JS, no CDN, no network)
    GET /api/state   JSON of everything the page draws (data.state)

No route takes a path or a file name, so nothing outside the runs' own records can be
served; every string the page shows is inserted as text, never as HTML (page.html).
"""

from __future__ import annotations

import json
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from . import data

PAGE = "page.html"
HEADERS = {  # the page loads nothing from elsewhere and may not be framed
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src 'self' data:",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Handler(BaseHTTPRequestHandler):
    def __init__(self, *args, root: Path, **kwargs):
        self.root = root
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        route = urlsplit(self.path).path
        if route in ("/", "/index.html"):
            self.send(200, "text/html; charset=utf-8", page())
        elif route == "/api/state":
            body = json.dumps(data.state(self.root), allow_nan=False).encode()
            self.send(200, "application/json", body)
        else:
            self.send(404, "text/plain; charset=utf-8", b"not found")

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: the page polls
        pass


def page() -> bytes:
    return (resources.files(__package__) / PAGE).read_bytes()


def make_server(root: str | Path, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
    """A server over runs directory `root` (port 0: any free port; see server.server_address)."""
    server = ThreadingHTTPServer((host, port), partial(Handler, root=Path(root)))
    server.daemon_threads = True
    return server
