"""`speclab serve EXPORT`: decode with an exported speculator in an engine that runs on this
machine. llama.cpp is that engine (built on first use into speclab's cache, engines/llama_cpp.py):
an export written for it (`--engine llama.cpp`: `llama_cpp.json` beside `draft.gguf`) is served as
is; any other export of a family llama.cpp runs (the demo's vLLM-layout eagle3) is first rewritten
for it beside itself, in `<EXPORT>-llama.cpp/`, by llama.cpp's own converter.

llama_cpp.json is data from a stranger: its fields are checked, its `serve` line is never run,
and the command is rebuilt from the checked fields.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import llama_cpp
from .llama_cpp import LLAMA_CPP_FILE

SERVED_SUFFIX = "-llama.cpp"  # where an export of another layout is rewritten for llama.cpp
SPEC_TYPES = tuple(llama_cpp.SPEC_TYPES.values())  # the draft kinds a llama.cpp export carries


@dataclass(frozen=True)
class LlamaCppExport:
    root: Path
    target_gguf: Path
    draft_gguf: Path
    spec_type: str
    k: int

    def server_args(self) -> list[str]:
        """llama-server's draft flags for this export (the target goes in as -m)."""
        return llama_cpp.draft_args(self.draft_gguf, self.spec_type, self.k)


def add_parser(commands) -> argparse.ArgumentParser:
    serve = commands.add_parser("serve", help="serve an export with an engine that runs here (llama.cpp)")
    serve.add_argument("export", type=Path, help="an export directory (speclab export --best ...)")
    serve.add_argument("--engine", default="llama.cpp", choices=["llama.cpp"], help="the engine (default llama.cpp)")
    serve.add_argument("--host", default="127.0.0.1", help="address llama-server listens on")
    serve.add_argument("--port", type=int, default=8080, help="port llama-server listens on")
    serve.add_argument("--threads", type=int, default=None, help="CPU threads (default: every core)")
    serve.add_argument("--ctx-size", type=int, default=4096, help="context length of the server's slot")
    serve.add_argument("--dry-run", action="store_true",
                       help="prepare the engine and the GGUF files, print the command, do not start the server")
    return serve


def prepared(export: Path) -> LlamaCppExport:
    """The llama.cpp export `export` is, or the one written for it beside it (rewritten when the
    source export is newer than it)."""
    if not export.is_dir():
        raise FileNotFoundError(f"{export} is not a directory")
    if (export / LLAMA_CPP_FILE).is_file():
        return read_export(export)
    served = export.with_name(export.name + SERVED_SUFFIX)
    if (served / LLAMA_CPP_FILE).is_file() and _converted_from(served) == str(export.resolve()) \
            and (served / LLAMA_CPP_FILE).stat().st_mtime >= (export / "export.json").stat().st_mtime:
        return read_export(served)
    from ..export import export_for_engine

    print(f"writing {export} for llama.cpp into {served} (llama.cpp's own converter)", flush=True)
    return read_export(export_for_engine(export, served, "llama.cpp"))


def check_servable(export: Path) -> None:
    """Refuse, in one line, an export llama.cpp has no layout for."""
    if not export.is_dir():
        raise FileNotFoundError(f"{export} is not a directory")
    if (export / LLAMA_CPP_FILE).is_file():
        return
    from ..checkpoint_meta import checkpoint_meta
    from ..export_formats import layout_of

    layout_of(str(checkpoint_meta(export).get("family")), "llama.cpp")


def read_export(root: Path) -> LlamaCppExport:
    """llama_cpp.json, checked field by field."""
    path = root / LLAMA_CPP_FILE
    try:
        fields = json.loads(path.read_text())
        draft, target, spec_type, k = fields["draft"], fields["target_gguf"], fields["spec_type"], fields["k"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a llama.cpp export description ({exc!r}); export again "
                         "with `speclab export --engine llama.cpp`") from None
    if spec_type not in SPEC_TYPES:
        raise ValueError(f"{path}: spec_type {spec_type!r} is not one of {', '.join(SPEC_TYPES)}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{path}: k must be a positive integer, got {k!r}")
    if not isinstance(draft, str) or "/" in draft or draft in ("", ".", ".."):
        raise ValueError(f"{path}: draft must name a file in the export, got {draft!r}")
    found = LlamaCppExport(root.resolve(), Path(str(target)), root.resolve() / draft, spec_type, k)
    for gguf in (found.target_gguf, found.draft_gguf):
        if not gguf.is_file():
            raise FileNotFoundError(f"{path} names {gguf}, which does not exist")
    return found


def command(engine: llama_cpp.LlamaCpp, export: LlamaCppExport, host: str, port: int, threads: int,
            ctx_size: int) -> list[str]:
    return [str(engine.tool("llama-server")), "-m", str(export.target_gguf), "--host", host, "--port", str(port),
            "-t", str(threads), "-c", str(ctx_size), "-np", "1", *llama_cpp.NO_REPACK, *export.server_args()]


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from ..errors import user_errors

    with user_errors():
        check_servable(args.export)  # before a build of up to an hour, not after it
        if llama_cpp.find() is None:
            print(f"llama.cpp {llama_cpp.VERSION} is not built here: building it once into {llama_cpp.engine_dir()} "
                  "(about 5 minutes on 2 idle cores; later runs reuse it)", flush=True)
        engine = llama_cpp.build()
        export = prepared(args.export)
        argv = command(engine, export, args.host, args.port, args.threads or os.cpu_count() or 1, args.ctx_size)
    print(f"serving {args.export} ({export.spec_type}, chains of {export.k}) with llama.cpp "
          f"{engine.info['version']} at http://{args.host}:{args.port} (OpenAI API: /v1/chat/completions)")
    print(" ".join(argv), flush=True)
    if args.dry_run:
        return 0
    try:
        return subprocess.run(argv).returncode
    except KeyboardInterrupt:
        return 0


def serve_hint(export: Path) -> str | None:
    """The line `speclab export` ends with: the command that serves this export on this machine,
    or why llama.cpp cannot (None: a family llama.cpp has no layout for)."""
    from ..checkpoint_meta import checkpoint_meta
    from ..engine_layouts import refusals
    from ..export_formats import ENGINE_LAYOUTS, load_checkpoint
    from ..export import live_target_info

    meta = checkpoint_meta(export)
    layout = ENGINE_LAYOUTS["llama.cpp"].get(str(meta.get("family")))
    if layout is None:
        return None
    refused = refusals(load_checkpoint(export, live_target_info(meta)), layout)
    if refused:
        return f"llama.cpp cannot serve it as measured: {'; '.join(refused)}"
    built = "" if llama_cpp.find() else " (builds llama.cpp on first use, about 5 minutes on 2 cores)"
    return f"serve it here with llama.cpp{built}: {_invoked_as()} serve {export}"


def _invoked_as() -> str:
    """How this speclab was run (`.venv/bin/speclab` from the Makefile), so the printed command runs as is."""
    import sys

    return sys.argv[0] if Path(sys.argv[0]).name == "speclab" else "speclab"


def _converted_from(root: Path) -> str | None:
    try:
        return json.loads((root / "export.json").read_text()).get("converted_from")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
