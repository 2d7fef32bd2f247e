"""Docs that cannot rot: README.md and docs/*.md are checked against the code.

- A ```bash block right after `<!-- runnable -->` is run as written (bash -eu, its page's
  blocks in order, in one scratch directory with its own speclab cache): keep these few
  and on the tiny target.
- A ```bash block right after `<!-- parses -->` is too slow or needs what these machines
  lack (a GPU, a cluster, a hub): its `speclab train` / `speclab sweep` lines are composed
  by Hydra (`--cfg job`: every override and group option checked, nothing runs; a
  multirun's comma lists are checked at their first value, since Hydra's --cfg takes no
  -m) and its other `speclab` lines are parsed by the CLI's own parser.
- The worked family of docs/extending.md is executed and put through the family checks.
- Every relative link and anchor resolves.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!--\s*(?P<mark>[\w: -]+?)\s*-->\s*\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
VENV_BIN = str(Path(sys.executable).parent)


def marked_blocks(mark: str) -> list[tuple[Path, str]]:
    return [(page, m["body"]) for page in PAGES for m in BLOCK.finditer(page.read_text()) if m["mark"] == mark]


def pages_with(mark: str) -> list[Path]:
    return sorted({page for page, _ in marked_blocks(mark)})


def commands(body: str) -> list[list[str]]:
    """The block's commands, backslash continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


def test_the_marked_blocks_exist():
    assert pages_with("runnable"), "no runnable block left: the docs would no longer be run"
    assert marked_blocks("parses") and marked_blocks("example: family")


@pytest.mark.parametrize("page", pages_with("runnable"), ids=lambda p: p.name)
def test_runnable_blocks_run_on_the_tiny_target(page, tmp_path):
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
           "SPECLAB_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    for body in [b for p, b in marked_blocks("runnable") if p == page]:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{page.name}:\n{body}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"


def first_of_each_sweep(args: list[str]) -> list[str]:
    """Hydra's --cfg composes one job: drop -m and keep the first value of `key=a,b` lists."""
    out = []
    for arg in args:
        if arg in ("-m", "--multirun"):
            continue
        key, eq, value = arg.partition("=")
        if eq and "," in value and not value.startswith(("[", "{", "'", '"')):
            value = value.split(",")[0]
        out.append(f"{key}{eq}{value}")
    return out


@pytest.mark.parametrize("body", [b for _, b in marked_blocks("parses")],
                         ids=[f"{p.name}-{i}" for i, (p, _) in enumerate(marked_blocks("parses"))])
def test_parse_only_blocks_compose_or_parse(body, tmp_path):
    from speclab.sweeps.cli import build_parser

    checked = 0
    for argv in commands(body):
        if argv[0] != "speclab":
            continue
        checked += 1
        if argv[1] in ("train", "sweep"):
            args = first_of_each_sweep(argv[1:]) + ["--cfg", "job"]
            proc = subprocess.run([os.path.join(VENV_BIN, "speclab"), *args], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stderr[-3000:]}"
        else:
            build_parser().parse_args(argv[1:])  # exits (a failure) on an unknown flag
    assert checked, f"a parses block with no speclab command:\n{body}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def dead_links(page: Path) -> list[str]:
    """Relative links (outside code blocks) whose file, or whose anchor in a .md file, is missing."""
    dead = []
    for link in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z]+:", link):  # http(s), mailto: not checked (no network here)
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            dead.append(link)
        elif anchor and (target.suffix != ".md" or anchor not in anchors(target)):
            dead.append(link)
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page):
    assert not dead_links(page), f"{page.name}: dead links {dead_links(page)}"


def test_the_link_check_finds_a_dead_file_and_a_dead_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# A `code` heading, with punctuation\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-code-heading-with-punctuation) [self](#top) [gone](missing.md)\n"
                    "[bad anchor](other.md#nope) [web](https://example.org/x)\n\n# Top\n"
                    "```\n[in code](ignored.md)\n```\n")
    assert dead_links(page) == ["missing.md", "other.md#nope"]


# --- the worked family of docs/extending.md -------------------------------------------------


@pytest.fixture(scope="module")
def example():
    (body,) = [b for _, b in marked_blocks("example: family")]
    module = types.ModuleType("docs_extending_example")
    sys.modules[module.__name__] = module
    try:
        exec(compile(body, str(ROOT / "docs" / "extending.md"), "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[module.__name__]


@pytest.fixture
def registered(example, monkeypatch):
    from speclab.speculator.families import REGISTRY

    cls = example.BigramSpeculator
    monkeypatch.setitem(REGISTRY, cls.family, cls)
    return cls


@pytest.fixture(scope="module")
def tiny():
    from speclab.speculator.target.builders import tiny_llama

    return tiny_llama()


def test_example_config_yaml_matches_its_dataclass(example, registered):
    text = (ROOT / "docs" / "extending.md").read_text()
    (config,) = [yaml.safe_load(m[1]) for m in re.finditer(r"```yaml\n(# A token bigram drafter.*?)```", text, re.S)]
    import dataclasses

    from speclab.configs.schemas import family_config

    # the file names the family's schema and repeats none of its defaults; composed, it is the dataclass
    assert config.pop("defaults") == [{"/schema/speculator@_here_": "bigram"}, "_self_"]
    fields = {f.name: f.default for f in dataclasses.fields(example.BigramConfig)}
    assert family_config(example.BigramConfig, "bigram", config) == {"family": "bigram", **fields}


def test_example_training_forward_equals_inference_and_it_trains(registered, tiny):
    from speclab.speculator.base import Features, TargetInfo
    from speclab.speculator.families import build_speculator

    torch.manual_seed(0)
    info = TargetInfo.of(tiny)
    spec = build_speculator("bigram", {"hidden_size": 16}, info).eval()
    T = 9
    ids = torch.randint(0, info.vocab_size, (1, T))
    hidden = torch.randn(1, T, info.hidden_size)
    feats = Features(input_ids=ids, hidden=hidden, loss_mask=torch.ones(1, T, dtype=torch.bool))
    logits = spec.draft_logits(feats)  # [1, 1, T, V]
    state = spec.start(ids[:, :1], hidden[:, :1])
    for t in range(T):
        _, step = spec.propose(state, ids[:, t:t + 1], 1)  # [1, 1, V]
        torch.testing.assert_close(step[0, 0], logits[0, 0, t], rtol=1e-6, atol=1e-6)

    def objective(draft, target):  # [N, V] each -> [N]: CE on the target's argmax
        return torch.nn.functional.cross_entropy(draft, target.argmax(-1), reduction="none")

    def target_head(rows, columns):
        return rows @ info.lm_head_weight.T

    spec.train()
    optimizer = torch.optim.Adam(spec.parameters(), lr=3e-2)
    losses = []
    for _ in range(30):
        loss, _ = spec.loss(feats, objective, target_head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_example_saves_loads_and_decodes_losslessly(registered, tiny, tmp_path):
    from speclab.eval.engine import generate_plain, generate_speculative
    from speclab.eval.prompts import encode_prompt
    from speclab.speculator.base import Features, TargetInfo
    from speclab.speculator.families import build_speculator, load_speculator

    torch.manual_seed(0)
    info = TargetInfo.of(tiny)
    spec = build_speculator("bigram", {}, info).eval()
    spec.save(tmp_path / "ckpt")
    loaded = load_speculator(tmp_path / "ckpt", info)
    ids = torch.randint(0, info.vocab_size, (1, 7))
    feats = Features(input_ids=ids, hidden=torch.zeros(1, 7, info.hidden_size),
                     loss_mask=torch.ones(1, 7, dtype=torch.bool))
    assert torch.equal(loaded.draft_logits(feats), spec.draft_logits(feats))
    prompt = encode_prompt(tiny.tokenizer, {"prompt": "Write a function that returns the sum of a list"})
    plain = generate_plain(tiny, prompt, 16, eos_ids=())
    assert generate_speculative(tiny, loaded, prompt, 16, 3, eos_ids=()).tokens == plain.tokens
