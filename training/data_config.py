"""What a training data set is made of: the `DataConfig` dataclass, one help text per field.

The Hydra group `configs/data/` holds one YAML per source; the runner builds the data with
`build_dataset(target, DataConfig(**cfg.data))`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, get_args

Source = Literal["self_distill", "code_prompts", "jsonl", "text", "parquet", "hub", "code_corpus"]
SOURCES: tuple[str, ...] = get_args(Source)
GENERATED_SOURCES = ("self_distill", "code_prompts")  # the target writes the answers trained on

# Magpie's user turns follow the system prompt they are sampled under, so these steer the
# prompt mix: Python coding help (one eval set is HumanEval) and general assistant work.
DEFAULT_SYSTEM_PROMPTS: list[str] = [
    "You are an expert Python programmer. Users ask you to write, explain or fix Python functions.",
    "You are a coding assistant. Users give you a Python function signature with a docstring "
    "and ask you to implement it.",
    "You are a helpful AI assistant. Users ask you everyday questions about science, history, "
    "cooking, travel and writing.",
    "You are a friendly tutor. Users ask you to explain a concept clearly, step by step.",
]


@dataclass
class DataConfig:
    """Where the training conversations come from and how they are tokenised."""

    source: Source = "self_distill"
    """self_distill: prompts and greedy responses sampled from the target itself (Magpie-style,
    no download); code_prompts: self-distilled responses to HumanEval-style prompts mined from
    Python source, mixed with Magpie-style ones (`mix`); jsonl / parquet: a local file of chat
    rows; text: a local plain-text file (loss on every token); hub: a Hugging Face hub data set
    (needs a network); code_corpus: Python source teacher-forced (loss on every token)."""

    # --- where the rows are (file and hub sources) ---------------------------------------
    path: str | None = None
    """Local file (or directory of files) for source jsonl, text or parquet; for code_prompts
    and code_corpus a folder of Python source (None: the interpreter's standard library and
    installed packages)."""
    name: str | None = None
    """Hub data set id for source=hub, e.g. HuggingFaceH4/ultrachat_200k."""
    subset: str | None = None
    """Hub data set configuration (subset) name, if the data set has several."""
    split: str = "train"
    """Hub data set split for source=hub."""

    # --- which columns hold what (jsonl, parquet, hub) -----------------------------------
    messages_field: str = "messages"
    """Column with a chat: a list of {"role", "content"} dicts. Used when present."""
    prompt_field: str = "prompt"
    """Column with a single user prompt, paired with `response_field` (used when there is no messages column)."""
    response_field: str = "response"
    """Column with the assistant reply to `prompt_field`."""
    text_field: str = "text"
    """Column with raw text (loss on every token): the fallback when no chat columns exist."""

    # --- how much --------------------------------------------------------------------------
    num_prompts: int = 224
    """Training conversations to keep (self_distill, code_prompts: distinct prompts per round,
    beyond the held-out ones; code_corpus: source files per round). 0 keeps every row of a
    file or hub source (code_corpus: every file, one round)."""
    max_tokens: int = 0
    """Training-token budget: tokens with a loss (assistant replies; every token of a
    teacher-forced corpus). 0: one round of `num_prompts`. Otherwise rounds are built until the
    budget is met and training takes the shortest prefix of examples that reaches it; a later
    run with a bigger budget extends the cached data instead of rebuilding it."""
    mix: float = 0.5
    """code_prompts: share of each round's prompts mined from Python source; the rest are
    sampled Magpie-style from the target (0: all Magpie, 1: all mined)."""
    text_split: Literal["paragraph", "chunk"] = "paragraph"
    """text: one example per blank-line paragraph, or each file cut into `max_seq_len`-token
    chunks (longer contexts; code_corpus always chunks)."""
    heldout_size: int = 16
    """Distinct prompts set aside for evaluation, never used in training."""
    max_seq_len: int = 512
    """Tokens per training example; longer examples are truncated at the end."""
    seed: int = 0
    """Seeds prompt sampling and the train/held-out split."""

    # --- self-distillation (source=self_distill) -----------------------------------------
    max_prompt_tokens: int = 64
    """Longest sampled user turn; one that has not ended by then is dropped as truncated."""
    max_response_tokens: int = 160
    """Longest greedy assistant response; a longer one is kept, cut at this length."""
    gen_batch_size: int = 0
    """Prompts per batched `generate` call (left padded); 0: this machine's choice
    (self_distill.generation_batch_size)."""
    prompt_temperature: float = 1.0
    """Sampling temperature for the user turns (responses are always greedy)."""
    prompt_top_p: float = 1.0
    """Nucleus sampling mass for the user turns; 1.0 disables it."""
    prompt_sampling_budget: float = 4.0
    """Stop sampling user turns after this many times the number of prompts wanted, even if
    dedup and the drop of truncated turns left fewer (a warning says so)."""
    system_prompts: list[str] = field(default_factory=lambda: list(DEFAULT_SYSTEM_PROMPTS))
    """System prompts cycled across the sampled user turns; they steer what users ask.
    Empty: the chat template's default system turn."""
    response_system_prompt: str | None = None
    """System prompt the responses are generated (and trained) under. None: the template's
    default, i.e. the prompt as evaluation renders a bare user turn."""

    # --- building in shards (training/shards.py) ----------------------------------------
    shards: int = 1
    """Processes a build is split across: each round's answers (self_distill, code_prompts)
    and the feature pass, each shard its own cache entry, merged into the one cache a
    one-process build makes (bitwise the same). 1: one process builds all."""
    shard: int | None = None
    """This process's shard, 0..shards-1. None: its SLURM array task (SLURM_ARRAY_TASK_ID -
    SLURM_ARRAY_TASK_MIN), else its torch.distributed RANK, else none (it builds every shard
    in turn). Any process also builds the shards nobody has started."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown data source {self.source!r}; valid: {', '.join(SOURCES)}")
        if self.path == "???":  # Hydra's unset marker: a source that may omit the path must not see it
            self.path = None
        if self.source in ("jsonl", "text", "parquet") and self.path in (None, ""):  # ???: Hydra's unset
            raise ValueError(f"data.source={self.source} needs data.path=<local file>")
        if self.source == "hub" and not self.name:
            raise ValueError("data.source=hub needs data.name=<hub data set id>")
        positive = ("max_seq_len", "max_prompt_tokens", "max_response_tokens")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"data.{key} must be positive, got {getattr(self, key)}")
        if self.gen_batch_size < 0:
            raise ValueError(f"data.gen_batch_size must be positive, or 0 for this machine's choice, got {self.gen_batch_size}")
        if self.num_prompts < 0 or self.heldout_size < 0 or self.max_tokens < 0:
            raise ValueError("data.num_prompts, data.heldout_size and data.max_tokens must be >= 0")
        if self.source in ("self_distill", "code_prompts") and self.num_prompts == 0:
            raise ValueError(f"data.source={self.source} needs data.num_prompts > 0")
        if not 0 <= self.mix <= 1:
            raise ValueError(f"data.mix must be in [0, 1], got {self.mix}")
        if self.text_split not in ("paragraph", "chunk"):
            raise ValueError(f"data.text_split must be paragraph or chunk, got {self.text_split!r}")
        if self.prompt_temperature <= 0 or not 0 < self.prompt_top_p <= 1:
            raise ValueError("data.prompt_temperature must be > 0 and data.prompt_top_p in (0, 1]")
        if self.prompt_sampling_budget < 1:
            raise ValueError("data.prompt_sampling_budget must be >= 1")
        if self.shards < 1 or self.shard is not None and not 0 <= self.shard < self.shards:
            raise ValueError(f"data.shard={self.shard} and data.shards={self.shards}: need shards >= 1 and "
                             f"0 <= shard < shards")
        self.system_prompts = list(self.system_prompts)  # a Hydra ListConfig becomes a list


# Fields that cannot change the data a source produces: left out of its fingerprint, so a
# sweep that varies one of them still shares the built data set.
_SAMPLING_FIELDS = {
    "max_prompt_tokens", "max_response_tokens", "gen_batch_size", "prompt_temperature",
    "prompt_top_p", "prompt_sampling_budget", "system_prompts", "response_system_prompt",
}
_HUB_FIELDS = {"name", "subset", "split"}
_COLUMN_FIELDS = {"messages_field", "prompt_field", "response_field", "text_field"}
_FILE_FIELDS = _HUB_FIELDS | {"mix", "text_split"}
_IGNORED_BY_SOURCE: dict[str, set[str]] = {
    "self_distill": {"path", "mix", "text_split"} | _HUB_FIELDS | _COLUMN_FIELDS,
    "code_prompts": {"text_split"} | _HUB_FIELDS | _COLUMN_FIELDS,
    "jsonl": _SAMPLING_FIELDS | _FILE_FIELDS,
    "parquet": _SAMPLING_FIELDS | _FILE_FIELDS,
    "text": _SAMPLING_FIELDS | _HUB_FIELDS | _COLUMN_FIELDS | {"mix"},
    "hub": _SAMPLING_FIELDS | {"path", "mix", "text_split"},
    "code_corpus": _SAMPLING_FIELDS | _FILE_FIELDS | _COLUMN_FIELDS,
}
# The budget only says how many rounds to build and how long a prefix to train on: runs
# with different budgets share one cache, which grows (appends) when a bigger one asks.
# Shards split how the data is built, never what it is.
_NEVER_FINGERPRINTED = {"max_tokens", "shards", "shard"}


def fields_that_matter(cfg: DataConfig) -> dict:
    """The config fields that can change what `cfg.source` builds."""
    ignored = _IGNORED_BY_SOURCE[cfg.source] | _NEVER_FINGERPRINTED
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ignored}
