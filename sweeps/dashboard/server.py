"""The dashboard's HTTP server: the standard library's, read-only.

    GET /                    the page (page.html, its scripts and style under /static/)
    GET /static/NAME         one of ASSETS: the page's own files, and Plotly's JavaScript as
                             the plotly package installs it (no CDN, no network)
    GET /api/state           JSON of everything the overview draws (data.state)
    GET /api/run?dir=RUN     one run's page (detail.run_detail); RUN must be one of the run
                             directories found under the root, compared as a name

No route joins a requested name onto a path: static names are keys of a fixed table and a
run is matched against the directories found by walking the root, so nothing outside the
runs' own records (and the page's assets) can be served. Every string the page shows is
inserted as text or handed to Plotly as escaped data, never as HTML (js/util.js).

A request must name this server in its Host header: a page on another site whose name
was re-pointed at 127.0.0.1 (DNS rebinding) sends its own name there and gets 403, so
it cannot read /api/state. A client that sends nothing is dropped after IDLE_TIMEOUT_S.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ..results import _finite
from . import data, detail

PAGE = "page.html"
PLOTLY = ("plotly", "package_data/plotly.min.js")  # (package, file): the library's own minified bundle
ASSETS = {  # /static/NAME -> (package, file, content type); nothing else is served from disk
    "plotly.min.js": (*PLOTLY, "text/javascript; charset=utf-8"),
    **{name: (__package__, name, "text/javascript; charset=utf-8")
       for name in ("js/util.js", "js/charts.js", "js/overview.js", "js/run.js", "js/app.js")},
    "dash.css": (__package__, "dash.css", "text/css; charset=utf-8"),
}
IDLE_TIMEOUT_S = 30.0  # a connection silent this long is closed (one thread each: idle ones must not pile up)
HEADERS = {  # the page loads nothing from elsewhere and may not be framed
    # scripts only from this server's own files; Plotly sets inline styles on what it draws,
    # and its WebGL traces (the sweep view's parallel coordinates, drawn by regl) compile
    # their drawing code with Function(): 'unsafe-eval'. No record string is ever evaluated.
    "Content-Security-Policy": "default-src 'none'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
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
        url = urlsplit(self.path)
        route = url.path
        if not allowed_host(self.headers.get("Host"), self.server.server_address):
            self.send(403, "text/plain; charset=utf-8", b"host not allowed")
        elif route in ("/", "/index.html"):
            self.send(200, "text/html; charset=utf-8", page())
        elif route.startswith("/static/") and route[len("/static/"):] in ASSETS:
            package, name, content_type = ASSETS[route[len("/static/"):]]
            self.send(200, content_type, asset(package, name))
        elif route == "/api/state":
            self.send_json(data.state(self.root))
        elif route == "/api/run":
            found = detail.run_detail(self.root, (parse_qs(url.query).get("dir") or [""])[0])
            if found is None:
                self.send(404, "text/plain; charset=utf-8", b"no such run")
            else:
                self.send_json(found)
        else:
            self.send(404, "text/plain; charset=utf-8", b"not found")

    def send_json(self, payload) -> None:
        self.send(200, "application/json", json.dumps(_finite(payload), allow_nan=False).encode())

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
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client navigated away mid-transfer
                self.close_connection = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: the page polls
        pass


def allowed_host(header: str | None, bound: tuple) -> bool:
    """Whether a Host header names this server: its port, and the bound address, a loopback
    name for a loopback bind, or any address or this machine's name for a wildcard bind."""
    if not header:
        return False
    name, port = _split_host(header.strip().lower())
    if (port or "80") != str(bound[1]):
        return False
    address = ipaddress.ip_address(bound[0])
    try:
        literal = ipaddress.ip_address(name)
    except ValueError:
        literal = None
    if address.is_unspecified:  # 0.0.0.0 / ::: any of this machine's addresses, or its names
        return literal is not None or name in ("localhost", socket.gethostname().lower(), socket.getfqdn().lower())
    if address.is_loopback:
        return name == "localhost" or (literal is not None and literal.is_loopback)
    return literal == address


def _split_host(header: str) -> tuple[str, str | None]:
    """'name:port', '[v6]:port' or a bare name -> (name, port or None)."""
    if header.startswith("["):
        name, _, rest = header[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    if header.count(":") == 1:
        name, port = header.split(":")
        return name, port
    return header, None


def page() -> bytes:
    return (resources.files(__package__) / PAGE).read_bytes()


def asset(package: str, name: str) -> bytes:
    return resources.files(package).joinpath(*name.split("/")).read_bytes()


def make_server(root: str | Path, host: str = "127.0.0.1", port: int = 8765,
                idle_timeout_s: float = IDLE_TIMEOUT_S) -> ThreadingHTTPServer:
    """A server over runs directory `root` (port 0: any free port; see server.server_address)."""
    handler = type("TimedHandler", (Handler,), {"timeout": idle_timeout_s})  # socket timeout per connection
    server = ThreadingHTTPServer((host, port), partial(handler, root=Path(root)))
    server.daemon_threads = True
    return server
