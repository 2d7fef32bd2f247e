"""Each export layout on the tiny target: eagle3 -> vLLM speculators, mlp -> mlp_speculator,
others -> speclab's own; every export reloads with `speclab eval` and passes its lossless check."""

import json

import pytest
import torch
from safetensors import safe_open
from test_export import TINY_TARGET_CONFIG
from test_index import make_run

from speclab.speculator.base import TargetInfo, build_speculator
from speclab.speculator.targets import tiny_llama
from speclab.sweeps.cli import main
from speclab.sweeps.export import export_best
from speclab.sweeps.export_formats import load_checkpoint
from speclab.sweeps.results import weights_sha256

# Small, with a reduced draft vocabulary where the family has one (d2t/t2d are exported).
SPECS = {
    "mlp": {"n_predict": 3, "inner_dim": 16, "draft_vocab_size": 100},
    "eagle3": {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64, "draft_vocab_size": 100},
    "draft_lm": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32},
    "eagle": {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64},
}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


def exported(tmp_path, target, family):
    torch.manual_seed(0)
    # token frequencies in a shuffled order, so the drafted ids are not simply 0..N-1 (d2t is not all zeros)
    counts = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(1)).float()
    speculator = build_speculator(family, SPECS[family], TargetInfo.of(target).with_counts(counts))
    runs = tmp_path / "runs"
    speculator.save(runs / "run" / "checkpoints" / "speculator", extra={"target_config": TINY_TARGET_CONFIG})
    make_run(runs, "run", family=family, params=speculator.num_params(), checkpoint="checkpoints/speculator",
             weights_sha256=weights_sha256(speculator.state_dict()), per_position=(0.5, 0.3), speedup=1.3)
    return speculator, export_best(runs, tmp_path / "out")


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


def tensor_names(out):
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def test_eagle3_is_written_in_the_speculators_format(tmp_path, target):
    speculator, out = exported(tmp_path, target, "eagle3")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["speculators_version"]
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 2, "verifier_accept_k": 1,
                                         "accept_tolerance": 0.0}]  # k = the run's measured draft length
    assert spec["verifier"]["architectures"] == ["LlamaForCausalLM"] and spec["verifier"]["name_or_path"]
    assert config["draft_vocab_size"] == 100 and config["target_hidden_size"] == target.hidden_size
    assert config["eagle_aux_hidden_state_layer_ids"] == list(speculator.target_layer_ids)
    assert config["transformer_layer_config"]["hidden_size"] == 32
    tensors = tensor_names(out)
    assert {"embed_tokens.weight", "fc.weight", "layers.0.hidden_norm.weight", "layers.0.self_attn.q_proj.weight",
            "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(tensors)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * 32  # reads [embedding; hidden]
    # vLLM's vocabulary mapping: target id = i + d2t[i]; t2d marks drafted target ids
    ids = torch.arange(100) + tensors["d2t"]
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].sum() == 100 and tensors["t2d"][ids].all()
    assert torch.equal(ids, speculator.vocab.ids)
    assert same_state(load_checkpoint(out), speculator)


def test_mlp_is_written_in_the_mlp_speculator_layout(tmp_path, target):
    speculator, out = exported(tmp_path, target, "mlp")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mlp_speculator" and config["architectures"] == ["MLPSpeculatorPreTrainedModel"]
    assert (config["emb_dim"], config["inner_dim"], config["n_predict"], config["vocab_size"]) == \
        (target.hidden_size, 16, 3, target.vocab_size)
    assert set(tensor_names(out)) == {"emb.0.weight", "proj.0.weight", "proj.1.weight", "ln.0.weight", "ln.0.bias",
                                      "head.0.weight", "d2t", "t2d"}
    assert same_state(load_checkpoint(out), speculator)
    card = (out / "README.md").read_text()
    assert "mlp_speculator" in card and "1.30x" in card and "mean-free" in card


@pytest.mark.parametrize("family", ["draft_lm", "eagle"])
def test_other_families_keep_speclabs_self_describing_layout(tmp_path, target, family):
    speculator, out = exported(tmp_path, target, family)
    meta = json.loads((out / "config.json").read_text())
    assert meta["family"] == family and meta["target_config"] == TINY_TARGET_CONFIG
    assert not (out / "speclab.json").exists()
    assert same_state(load_checkpoint(out, TargetInfo.of(target)), speculator)


@pytest.mark.parametrize("family", ["eagle3", "mlp", "draft_lm"])
def test_every_layout_reloads_with_speclab_eval_losslessly(tmp_path, target, family):
    _, out = exported(tmp_path, target, family)
    report = tmp_path / "eval.json"
    assert main(["eval", str(out), "--limit", "2", "--max-new-tokens", "12", "--k", "2", "--json", str(report)]) == 0
    scored = json.loads(report.read_text())
    assert scored["lossless"] == {"checked_prompts": 2, "mismatches": 0}
    assert scored["acceptance"]["num_drafts"] > 0
