"""Exports loaded by the clients that serve them, computing speclab's logits (interop.py).

speculators (vLLM's own library, pinned in the Makefile, installed without touching torch) is
a hard import here: CI installs it, and a missing client must fail, not skip.

Tolerances (`interop.matches`): both sides compute in fp32 the same function with differently
ordered ops (a fused qkv, another attention kernel, the mlp norm folded into the weights), so
they agree to fp32 round-off: 1e-5, or 16 units in the last place of the largest logit where
logits are large (interop.py says why), while any real difference (another eps, a centred vs
mean-free norm, a wrong layer) shows at 1e-3 or more. Argmax agreement is required to be
total: no near-ties at these random weights.
"""

import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from interop import T, Comparison, convolved, dflash2_vs_speculators, dflash_vs_speculators, draft_lm_vs_transformers, \
    eagle3_vs_speculators, load_block_drafter_in_speculators, load_in_speculators, masked_logits_ceiling, matches, \
    medusa_vs_vllm_oracle, mlp_vs_vllm_oracle, peagle_vs_speculators, random_input_norm, tolerance
from test_export_layouts import SPECS, exported, same_state, tensor_names
from transformers import AutoModelForCausalLM

from speclab.speculator.base import TargetInfo
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.export_formats import load_checkpoint
from speclab.sweeps.export_mlp import MASKED

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"



def test_the_tolerance_is_fp32_round_off_and_no_more():
    """1e-5 at logits of a few units; at 19, 16 units in the last place (3.6e-5), which holds
    the 1.0014e-5 an AVX-512 CPU without AMX measured there but not a real difference."""
    assert tolerance(1.0) == 1e-5
    assert tolerance(19.0) == pytest.approx(16 * 2**-23 * 19.0)
    assert matches(Comparison(1.0014e-5, 1.0, 18.8))
    assert not matches(Comparison(1.0014e-5, 1.0, 2.0))
    assert not matches(Comparison(1e-3, 1.0, 19.0))
    assert not matches(Comparison(0.0, 0.99, 1.0))

@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, num_layers=4)


def test_the_installed_speculators_is_the_makefiles_pin():
    pin = re.search(r"^SPECULATORS_SPEC \?= speculators==(\S+)$", MAKEFILE.read_text(), re.M).group(1)
    assert version("speculators") == pin


# EAGLE-3, EAGLE-3.1, and speculators' trainer default for eagle3 (3.1 with norm_before_fc)
@pytest.mark.parametrize(("norm_output", "norm_before_fc"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("draft_vocab_size", [0, 100])
def test_eagle3_loads_in_speculators_and_computes_speclabs_draft(tmp_path, target, draft_vocab_size, norm_output,
                                                                norm_before_fc):
    spec = dict(SPECS["eagle3"], hidden_size=target.hidden_size, draft_vocab_size=draft_vocab_size,
                norm_output=norm_output, norm_before_fc=norm_before_fc)  # D = H
    speculator, out = exported(tmp_path, target, "eagle3", spec=spec,
                               prepare=random_input_norm if norm_before_fc else None)
    model = load_in_speculators(out)
    assert type(model).__name__ == "Eagle3DraftModel" and model.target_layer_ids == [1, 2, 3]
    assert model.config.norm_output is norm_output and model.config.norm_before_fc is norm_before_fc
    assert (model.input_norm is not None) is norm_before_fc
    if draft_vocab_size:
        assert torch.equal(model.d2t, speculator.vocab.d2t()) and torch.equal(model.t2d, speculator.vocab.t2d())
    else:
        assert model.d2t is None and model.t2d is None  # speculators' own convention for a full vocabulary
    # from_pretrained re-reads the embedding from the verifier: it must be the draft's (frozen = target's)
    assert torch.equal(model.embed_tokens.weight, speculator.embed_tokens.weight)
    comparison = eagle3_vs_speculators(speculator, out, target)
    assert matches(comparison), comparison


@pytest.mark.parametrize("draft_vocab_size", [0, 100])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_dflash_loads_in_speculators_and_computes_speclabs_blocks(tmp_path, target, draft_vocab_size, num_layers):
    spec = dict(SPECS["dflash"], draft_vocab_size=draft_vocab_size, num_layers=num_layers)
    speculator, out = exported(tmp_path, target, "dflash", spec=spec)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == 4
    assert config["mask_token_id"] == target.vocab_size - 1
    comparison = dflash_vs_speculators(speculator, out, target)
    assert matches(comparison), comparison


@pytest.mark.parametrize("draft_vocab_size", [0, 100])
@pytest.mark.parametrize("markov_head", ["vanilla", "gated"])
def test_dspark_loads_in_speculators_and_computes_speclabs_blocks(tmp_path, target, draft_vocab_size, markov_head):
    spec = dict(SPECS["dspark"], draft_vocab_size=draft_vocab_size, markov_head=markov_head)
    speculator, out = exported(tmp_path, target, "dspark", spec=spec)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dspark" and config["sample_from_anchor"] is True
    comparison = dflash_vs_speculators(speculator, out, target)
    assert matches(comparison), comparison


@pytest.mark.parametrize("draft_vocab_size", [0, 100])
def test_xpress_loads_in_speculators_and_computes_speclabs_refined_blocks(tmp_path, target, draft_vocab_size):
    def mixed(speculator):  # a mix that is not zero (its initial value), so the causal mixing is compared too
        speculator.refiner_head.mix_l.data.normal_(std=0.3)

    spec = dict(SPECS["xpress"], draft_vocab_size=draft_vocab_size)
    speculator, out = exported(tmp_path, target, "xpress", spec=spec, prepare=mixed)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "xpress" and config["xpress_rank"] == 6
    comparison = dflash_vs_speculators(speculator, out, target)
    assert matches(comparison), comparison


@pytest.mark.parametrize("num_layers", [1, 2])
def test_dflash2_loads_in_speculators_and_computes_speclabs_blocks_and_selection(tmp_path, target, num_layers):
    speculator, out = exported(tmp_path, target, "dflash2", spec=dict(SPECS["dflash2"], num_layers=num_layers),
                               prepare=convolved)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash2" and config["selector_top_k"] == 5
    assert config["draft_vocab_size"] == target.vocab_size and config["conv_group_size"] == 8
    comparison = dflash2_vs_speculators(speculator, out, target)
    assert matches(comparison), comparison


@pytest.mark.parametrize(("family", "draft_vocab_size"),  # speculators' DFlash2 drafts over the whole vocabulary only
                         [(f, n) for f in ("dflash", "dspark", "xpress") for n in (0, 100)] + [("dflash2", 0)])
def test_a_block_drafter_saved_by_speculators_loads_into_speclab_with_its_logits(tmp_path, target, draft_vocab_size,
                                                                                 family):
    """The other way: speculators' own class, initialised at random and saved by it, read by
    `load_checkpoint` (no speclab.json), computes in speclab what it computes in speculators."""
    spec = dict(SPECS[family], draft_vocab_size=draft_vocab_size)
    speculator, out = exported(tmp_path, target, family, spec=spec)
    model = load_block_drafter_in_speculators(out)
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("layers.", "fc.", "hidden_norm.", "norm.", "markov_head.", "refiner_head.",
                                "candidate_selector.")):
                p.copy_(torch.randn_like(p) * (0.2 if p.ndim > 1 else 1.0))
    saved = tmp_path / "saved-by-speculators"
    model.save_pretrained(str(saved))
    loaded = load_checkpoint(saved, TargetInfo.of(target))
    assert not same_state(loaded, speculator)  # the weights it was given, not the export's
    compare = dflash2_vs_speculators if family == "dflash2" else dflash_vs_speculators
    comparison = compare(loaded, saved, target)
    assert matches(comparison), comparison


def test_dflash_with_another_mask_token_would_not_match(tmp_path, target):
    """The control: the same export told another mask token computes other blocks."""
    speculator, out = exported(tmp_path, target, "dflash")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, mask_token_id=0)))
    assert dflash_vs_speculators(speculator, out, target).diff > 1e-3


@pytest.mark.parametrize(("embedding", "norm_before_fc"), [("trained", False), ("frozen", False), ("trained", True)])
@pytest.mark.parametrize("draft_vocab_size", [0, 100])
def test_peagle_loads_in_speculators_and_computes_speclabs_block(tmp_path, target, draft_vocab_size, embedding,
                                                                 norm_before_fc):
    """At every block position (depths 0..3) of every anchor. Replaced for the check (interop.py
    says why neither changes the maths): flex attention by speculators' own dense ("eager") path
    over the same mask function, and its random choice of (anchor, depth) rows by all of them."""
    spec = dict(SPECS["peagle"], hidden_size=target.hidden_size, draft_vocab_size=draft_vocab_size, embedding=embedding,
                norm_before_fc=norm_before_fc)
    speculator, out = exported(tmp_path, target, "peagle", spec=spec,
                               prepare=random_input_norm if norm_before_fc else None)
    model = load_in_speculators(out)
    assert type(model).__name__ == "PEagleDraftModel" and model.mask_token_id == 5
    assert (model.input_norm is not None) is norm_before_fc
    assert model.config.embed_requires_grad is (embedding == "trained")
    assert torch.equal(model.mask_hidden, speculator.mask_hidden)
    assert torch.equal(model.embed_tokens.weight, speculator.embed_tokens.weight)
    comparison = peagle_vs_speculators(speculator, out, target)
    assert matches(comparison), comparison


def _speculators_model(kind: str, target, draft_vocab_size: int, verifier: str, norm_before_fc: bool = False):
    """A model speculators' own class builds and initialises (random norms too, so mixing two up
    shows), as its training would start: EAGLE-3.1 for eagle3, a block of 4 for peagle."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(vocab_size=target.vocab_size, hidden_size=target.hidden_size, intermediate_size=96,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                        rope_theta=10000.0)
    layer._attn_implementation = "eager"
    common = dict(transformer_layer_config=layer, draft_vocab_size=draft_vocab_size or target.vocab_size,
                  target_hidden_size=target.hidden_size, eagle_aux_hidden_state_layer_ids=[1, 2, 3],
                  norm_before_fc=norm_before_fc,
                  speculators_config=SpeculatorsConfig(
                      algorithm=kind, proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=4)],
                      default_proposal_method="greedy",
                      verifier=VerifierConfig(name_or_path=verifier, architectures=["LlamaForCausalLM"])))
    torch.manual_seed(5)
    if kind == "eagle3":
        model = Eagle3DraftModel(Eagle3SpeculatorConfig(**common, norm_output=True))
    else:
        model = PEagleDraftModel(PEagleSpeculatorConfig(**common, mask_token_id=9))
    with torch.no_grad():
        if draft_vocab_size:
            ids = torch.randperm(target.vocab_size)[:draft_vocab_size].sort().values
            model.d2t.copy_(ids - torch.arange(draft_vocab_size))
            model.t2d.zero_()
            model.t2d[ids] = True
        model.load_verifier_weights()  # embedding and lm_head from the verifier, as speculators' training starts
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
        model.lm_head.weight.add_(0.05 * torch.randn_like(model.lm_head.weight))  # trained away from the verifier's
        model.embed_tokens.weight.add_(0.05 * torch.randn_like(model.embed_tokens.weight))
    return model


@pytest.mark.parametrize("norm_before_fc", [False, True])  # True: speculators' trainer default for eagle3
@pytest.mark.parametrize("kind", ["eagle3", "peagle"])
@pytest.mark.parametrize("draft_vocab_size", [0, 100])
def test_a_model_speculators_saved_loads_into_speclab_with_its_logits(tmp_path, target, kind, draft_vocab_size,
                                                                     norm_before_fc):
    target.model.save_pretrained(tmp_path / "verifier")  # speculators' from_pretrained reads its verifier's config
    _speculators_model(kind, target, draft_vocab_size, str(tmp_path / "verifier"),
                       norm_before_fc).save_pretrained(tmp_path / "saved")
    speculator = load_checkpoint(tmp_path / "saved", TargetInfo.of(target))
    assert speculator.family == kind and speculator.target_layer_ids == (1, 2, 3)
    assert speculator.config.norm_before_fc is norm_before_fc
    assert speculator.config.norm_output if kind == "eagle3" else speculator.mask_token_id == 9
    compare = eagle3_vs_speculators if kind == "eagle3" else peagle_vs_speculators
    comparison = compare(speculator, tmp_path / "saved", target)
    assert matches(comparison), comparison


def test_a_speculators_checkpoint_asking_for_other_maths_is_refused_naming_it(tmp_path, target):
    target.model.save_pretrained(tmp_path / "verifier")
    _speculators_model("eagle3", target, 0, str(tmp_path / "verifier")).save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    (tmp_path / "saved" / "config.json").write_text(json.dumps(dict(config, fc_norm=True)))
    with pytest.raises(ValueError, match="do not compute: fc_norm=True"):
        load_checkpoint(tmp_path / "saved", TargetInfo.of(target))
    with pytest.raises(ValueError, match="pass the live target"):
        load_checkpoint(tmp_path / "saved")
    (tmp_path / "saved" / "config.json").write_text(json.dumps(dict(config, norm_before_fc="false")))
    with pytest.raises(ValueError, match="'norm_before_fc' must be true or false, not 'false'"):
        load_checkpoint(tmp_path / "saved", TargetInfo.of(target))


def test_a_narrower_eagle3_is_shaped_for_vllm_but_speculators_cannot_load_it(tmp_path, target):
    """vLLM sizes fc from target_hidden_size ([D, 3H]); speculators 0.9.0 builds it [D, 3D] and checks
    the verifier's width against the draft's. docs/serving.md says so; this test notices a change."""
    _, out = exported(tmp_path, target, "eagle3")  # D = 32 < H = 64
    assert json.loads((out / "config.json").read_text())["target_hidden_size"] == target.hidden_size
    assert tensor_names(out)["fc.weight"].shape == (32, 3 * target.hidden_size)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # fc: checkpoint [32, 192], model [32, 96]
        load_in_speculators(out)


@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("draft_vocab_size", [0, 100])
def test_mlp_runs_in_vllms_maths_as_in_speclabs(tmp_path, target, tie_weights, draft_vocab_size):
    spec = dict(SPECS["mlp"], tie_weights=tie_weights, draft_vocab_size=draft_vocab_size)
    speculator, out = exported(tmp_path, target, "mlp", spec=spec)
    comparison = mlp_vs_vllm_oracle(speculator, out, target)
    assert matches(comparison), comparison
    if draft_vocab_size:  # a token speclab cannot draft is one vLLM never drafts
        assert masked_logits_ceiling(speculator, out, target) < MASKED / 2


def test_mlp_without_the_conversion_would_not_match(tmp_path, target):
    """The oracle can fail: speclab's tensors renamed only (the old export) are 1e-2 or more away."""
    speculator, out = exported(tmp_path, target, "mlp", spec=dict(SPECS["mlp"], draft_vocab_size=0))
    from safetensors.torch import save_file

    raw = {name.replace("norm.", "ln.", 1): t.contiguous() for name, t in speculator.state_dict().items()}
    save_file(raw, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, inner_dim=speculator.config.inner_dim)))
    diff = mlp_vs_vllm_oracle(speculator, out, target).diff
    assert diff > 1e-2, diff


@pytest.mark.parametrize("output", ["per_head", "shared"])
@pytest.mark.parametrize("draft_vocab_size", [0, 100])
def test_medusa_runs_in_vllms_maths_as_in_speclabs(tmp_path, target, output, draft_vocab_size):
    spec = dict(SPECS["medusa"], output=output, draft_vocab_size=draft_vocab_size)
    speculator, out = exported(tmp_path, target, "medusa", spec=spec)
    comparison = medusa_vs_vllm_oracle(speculator, out, target)
    assert matches(comparison), comparison


def test_draft_lm_loads_as_a_causal_lm_with_speclabs_logits(tmp_path, target):
    speculator, out = exported(tmp_path, target, "draft_lm")
    comparison = draft_lm_vs_transformers(speculator, out, target)
    assert matches(comparison), comparison


def test_draft_lm_drives_transformers_assisted_generation_losslessly(tmp_path, target):
    _, out = exported(tmp_path, target, "draft_lm")
    assistant = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    calls = []
    assistant.register_forward_hook(lambda *args: calls.append(1))
    prompt = torch.randint(0, target.vocab_size, (1, T), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=None)
    plain = target.model.generate(prompt, **kwargs)
    assisted = target.model.generate(prompt, assistant_model=assistant, **kwargs)
    assert calls, "transformers never ran the assistant"
    assert torch.equal(assisted, plain) and plain.shape[1] == T + 24
