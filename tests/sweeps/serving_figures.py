"""The per-family interop figures of docs/serving.md, measured as the interop tests measure them.

    .venv/bin/python tests/sweeps/serving_figures.py

Each row: a speculator on the 4-layer tiny target exported through `export_best` (a fake best
run around its real checkpoint), loaded by its client, compared on one 16-token sequence.
The last row is the demo's mlp shape (SmolLM2-135M's vocab 49,152 and width 576, the quick
sweep's mlp config: n_predict 4, inner_dim 256, tied, draft_vocab_size 8192) with random
weights and random target states: its shapes, load and maths, not a trained checkpoint.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

# speculators' block drafters import triton, which on a CPU runs only through its interpreter:
# set before that import, as tests/conftest.py does for the interop tests.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from interop import CLIENT, COMPARE, Comparison, convolved, drafted_figures, random_input_norm
from test_export_layouts import SPECS, exported
from vllm_mlp_oracle import VLLMMLPSpeculator

from speclab.speculator.base import Features, TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.export import export_best
from speclab.sweeps.results import weights_sha256

CASES = [  # (family, label, spec)
    ("eagle3", "eagle3, D = H = 64, draft vocab 100 of 384", dict(SPECS["eagle3"], hidden_size=64)),
    ("eagle3", "eagle3, D = H = 64, full vocab", dict(SPECS["eagle3"], hidden_size=64, draft_vocab_size=0)),
    ("eagle3", "eagle3 with norm_output (EAGLE-3.1), D = H = 64, draft vocab 100 of 384",
     dict(SPECS["eagle3"], hidden_size=64, norm_output=True)),
    ("eagle3", "eagle3 with norm_output and norm_before_fc (speculators' trainer default), D = H = 64, "
     "draft vocab 100 of 384", dict(SPECS["eagle3"], hidden_size=64, norm_output=True, norm_before_fc=True)),
    ("peagle", "peagle, block of 4, D = H = 64, draft vocab 100 of 384", dict(SPECS["peagle"], hidden_size=64)),
    ("peagle", "peagle, block of 4, D = H = 64, full vocab", dict(SPECS["peagle"], hidden_size=64, draft_vocab_size=0)),
    ("peagle", "peagle with norm_before_fc, block of 4, D = H = 64, draft vocab 100 of 384",
     dict(SPECS["peagle"], hidden_size=64, norm_before_fc=True)),
    ("mlp", "mlp, tied, draft vocab 100 of 384 (expanded)", SPECS["mlp"]),
    ("mlp", "mlp, untied, full vocab", dict(SPECS["mlp"], tie_weights=False, draft_vocab_size=0)),
    ("medusa", "medusa, 2 heads, draft vocab 100 of 384 (token_map)", SPECS["medusa"]),
    ("medusa", "medusa, 2 heads, shared output, full vocab",
     dict(SPECS["medusa"], output="shared", draft_vocab_size=0)),
    ("draft_lm", "draft_lm, full vocab", SPECS["draft_lm"]),
    ("dflash", "dflash, block 4, draft vocab 100 of 384", SPECS["dflash"]),
    ("dflash", "dflash, block 4, 2 layers, full vocab", dict(SPECS["dflash"], num_layers=2, draft_vocab_size=0)),
    ("dspark", "dspark, block 3, vanilla Markov head, draft vocab 100 of 384", SPECS["dspark"]),
    ("dspark", "dspark, block 3, gated Markov head, full vocab",
     dict(SPECS["dspark"], markov_head="gated", draft_vocab_size=0)),
    ("xpress", "xpress, block 4, refiner rank 6, draft vocab 100 of 384", SPECS["xpress"]),
    ("dflash2", "dflash2, block 4, 3-tap convolutions (random), selector rank 6 over the top 5, full vocab",
     SPECS["dflash2"]),
]
PREPARE = {"dflash2": convolved}  # its convolutions start as the identity: made random so they are compared
# (and a norm_before_fc case's input_norm starts as ones: made random the same way)


def size(out: Path) -> str:
    weights = (out / "model.safetensors").stat().st_size
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return f"{weights / 1e6:.3f} MB weights, {total / 1e6:.3f} MB in all"


def demo_shaped_mlp(tmp: Path) -> tuple[Comparison, str]:
    from test_run_rows import make_run

    info = TargetInfo(vocab_size=49152, hidden_size=576, num_layers=30, name="HuggingFaceTB/SmolLM2-135M-Instruct")
    counts = torch.randperm(info.vocab_size, generator=torch.Generator().manual_seed(1)).float()
    torch.manual_seed(0)
    speculator = build_speculator("mlp", {"n_predict": 4, "inner_dim": 256, "draft_vocab_size": 8192},
                                  info.with_counts(counts))
    runs = tmp / "runs"
    speculator.save(runs / "run" / "checkpoints" / "speculator",
                    extra={"target_config": {"_target_": "speclab.speculator.target.builders.smollm2_from_gguf"}})
    make_run(runs, "run", family="mlp", checkpoint="checkpoints/speculator",
             weights_sha256=weights_sha256(speculator.state_dict()), per_position=(0.3, 0.1, 0.05, 0.0))
    out = export_best(runs, tmp / "out")
    g = torch.Generator().manual_seed(0)
    T, n = 16, 4
    feats = Features(torch.randint(0, info.vocab_size, (1, T), generator=g), torch.randn(1, T, 576, generator=g),
                     torch.ones(1, T, dtype=torch.bool))
    with torch.no_grad():
        want = speculator.draft_logits(feats)[0][:, : T - n].transpose(0, 1)  # [t, n, N]
        tokens = torch.stack([feats.input_ids[0, t + 1 : t + 1 + n] for t in range(T - n)])
        got = VLLMMLPSpeculator.from_export(out).stage_logits(feats.hidden[0, : T - n], tokens)  # [t, n, V]
    return drafted_figures(got, want, speculator.vocab.ids), size(out)


def main() -> None:
    target = tiny_llama(seed=0, num_layers=4)
    print("| export | client | max abs logit diff | argmax agreement | size |")
    print("|---|---|---|---|---|")
    for family, label, spec in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            prepare = random_input_norm if spec.get("norm_before_fc") else PREPARE.get(family)
            speculator, out = exported(Path(tmp), target, family, spec=spec, prepare=prepare)
            c = COMPARE[family](speculator, out, target)
            print(f"| {label} | {CLIENT[family]} | {c.diff:.1e} | {c.agree:.0%} | {size(out)} |")
    with tempfile.TemporaryDirectory() as tmp:
        c, sized = demo_shaped_mlp(Path(tmp))
        print(f"| mlp, the demo's shape on SmolLM2 sizes (random weights) | {CLIENT['mlp']} | {c.diff:.1e} | "
              f"{c.agree:.0%} | {sized} |")


if __name__ == "__main__":
    main()
