"""Each export layout on a tiny target: eagle3 and peagle -> vLLM speculators, mlp -> mlp_speculator,
draft_lm -> LlamaForCausalLM, others -> speclab's own; an export its engine could not run falls
back to speclab's layout with the reason; every export reloads with `speclab eval` losslessly.

The target has 4 layers: vLLM's EAGLE-3 fuses three distinct pre-norm layers, ids 0..L-1."""

import json

import pytest
import torch
from safetensors import safe_open
from test_run_rows import make_run

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main
from speclab.sweeps.export import export_best, scored_with
from speclab.sweeps.engine_layouts import ExportContext, verifier_of
from speclab.sweeps.export_formats import load_checkpoint
from speclab.sweeps.results import weights_sha256

TARGET_CONFIG = {"_target_": "speclab.speculator.target.builders.tiny_llama", "seed": 0, "num_layers": 4}
# Small, with a reduced draft vocabulary where the family has one (d2t/t2d are exported).
SPECS = {
    "mlp": {"n_predict": 3, "inner_dim": 16, "draft_vocab_size": 100},
    "eagle3": {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64, "draft_vocab_size": 100},
    "peagle": {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64, "draft_vocab_size": 100,
               "block_size": 4, "mask_token_id": 5},
    "draft_lm": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32},
    "medusa": {"n_predict": 2, "draft_vocab_size": 100},
    "eagle": {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64},
    "dflash": {"block_size": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
               "draft_vocab_size": 100},
    "dspark": {"block_size": 3, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
               "markov_rank": 6, "draft_vocab_size": 100},
    "xpress": {"block_size": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
               "xpress_rank": 6, "draft_vocab_size": 100},
    "dflash2": {"block_size": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
                "conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 6, "selector_top_k": 5,
                "draft_vocab_size": 0},
}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, num_layers=4)


def exported(tmp_path, target, family, spec=None, target_config=TARGET_CONFIG, prepare=None, engine="vllm", **figures):
    """(the speculator, its export): a fake best run around a real saved checkpoint; `prepare`
    (the speculator) sets weights before it is saved."""
    torch.manual_seed(0)
    # token frequencies in a shuffled order, so the drafted ids are not simply 0..N-1 (d2t is not all zeros)
    counts = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(1)).float()
    speculator = build_speculator(family, spec or SPECS[family], TargetInfo.of(target).with_counts(counts))
    if prepare is not None:
        prepare(speculator)
    runs = tmp_path / "runs"
    speculator.save(runs / "run" / "checkpoints" / "speculator", extra={"target_config": target_config})
    make_run(runs, "run", family=family, params=speculator.num_params(), checkpoint="checkpoints/speculator",
             weights_sha256=weights_sha256(speculator.state_dict()), **{"per_position": (0.5, 0.3), "speedup": 1.3,
                                                                        **figures})
    return speculator, export_best(runs, tmp_path / "out", engine=engine)


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
    # an in-process target is saved beside the draft and named by the export's own path
    assert spec["verifier"] == {"name_or_path": str((out / "verifier").resolve()),
                                "architectures": ["LlamaForCausalLM"]}
    assert json.loads((out / "verifier" / "config.json").read_text())["num_hidden_layers"] == 4
    assert config["draft_vocab_size"] == 100 and config["target_hidden_size"] == target.hidden_size
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # pre-norm states vLLM hands, never layer 4
    assert config["transformer_layer_config"]["hidden_size"] == 32
    tensors = tensor_names(out)
    assert {"embed_tokens.weight", "fc.weight", "layers.0.hidden_norm.weight", "layers.0.self_attn.q_proj.weight",
            "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(tensors)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * 32  # reads [embedding; hidden]
    assert tensors["fc.weight"].shape == (32, 3 * target.hidden_size)  # vLLM: [D, 3 x target_hidden_size]
    # vLLM's vocabulary mapping: target id = i + d2t[i]; t2d marks drafted target ids
    ids = torch.arange(100) + tensors["d2t"]
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].sum() == 100 and tensors["t2d"][ids].all()
    assert torch.equal(ids, speculator.vocab.ids)
    assert same_state(load_checkpoint(out), speculator)
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in out.rglob("*"))  # a server can read the verifier too


def test_the_export_records_the_tree_it_was_scored_with(tmp_path, target):
    torch.manual_seed(0)
    speculator = build_speculator("eagle3", SPECS["eagle3"], TargetInfo.of(target))
    runs = tmp_path / "runs"
    speculator.save(runs / "run" / "checkpoints" / "speculator", extra={"target_config": TARGET_CONFIG})
    make_run(runs, "run", family="eagle3", checkpoint="checkpoints/speculator",
             weights_sha256=weights_sha256(speculator.state_dict()), per_position=(0.5, 0.3, 0.2))
    result_file = runs / "run" / "result.json"
    result = json.loads(result_file.read_text())
    result["method"] = {"chosen": {"kind": "tree", "shape": "dynamic", "depth": 3, "top_k": 4, "budget": 8}}
    result_file.write_text(json.dumps(result))
    out = export_best(runs, tmp_path / "out")
    scored = {"method": "tree", "k": 3, "tree": {"shape": "dynamic", "depth": 3, "top_k": 4, "budget": 8}}
    assert json.loads((out / "speclab.json").read_text())["scored_with"] == scored
    assert json.loads((out / "export.json").read_text())["scored_with"] == scored
    proposal = json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"][0]
    assert proposal["speculative_tokens"] == 3  # speculators has only greedy chains: the tree's depth
    assert 'Scored with a tree {"shape": "dynamic", "depth": 3' in (out / "README.md").read_text()


def test_peagle_is_written_in_the_speculators_format(tmp_path, target):
    speculator, out = exported(tmp_path, target, "peagle")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["architectures"] == ["PEagleSpeculator"]
    assert config["mask_token_id"] == 5 and config["embed_requires_grad"] and config["norm_output"] is False
    spec = config["speculators_config"]
    assert spec["algorithm"] == "peagle" and spec["proposal_methods"][0]["speculative_tokens"] == 4  # the block
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and config["draft_vocab_size"] == 100
    tensors = tensor_names(out)
    assert tensors["mask_hidden"].shape == (1, 1, 3 * target.hidden_size)
    assert {"embed_tokens.weight", "fc.weight", "layers.0.hidden_norm.weight", "d2t", "t2d"} <= set(tensors)
    assert same_state(load_checkpoint(out), speculator)


def test_eagle3_1_carries_norm_output_in_its_export(tmp_path, target):
    speculator, out = exported(tmp_path, target, "eagle3", spec=dict(SPECS["eagle3"], norm_output=True))
    assert json.loads((out / "config.json").read_text())["norm_output"] is True
    assert load_checkpoint(out).config.norm_output and same_state(load_checkpoint(out), speculator)


def test_eagle3_on_a_target_too_shallow_for_vllm_falls_back_with_the_reason(tmp_path, caplog):
    shallow = tiny_llama(seed=0)  # 2 layers: only ids 0, 1 are pre-norm, and vLLM fuses three
    config = {"_target_": "speclab.speculator.target.builders.tiny_llama", "seed": 0}
    _, out = exported(tmp_path, shallow, "eagle3", target_config=config)
    reason = "vLLM's EAGLE-3 reads exactly 3 distinct target layers"
    assert reason in caplog.text
    assert json.loads((out / "config.json").read_text())["family"] == "eagle3"  # speclab's own layout
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and reason in manifest["not_servable"][0]
    assert reason in (out / "README.md").read_text()


def test_a_dflash2_over_a_reduced_vocabulary_is_written_in_speclabs_layout_with_the_reason(tmp_path, target):
    speculator, out = exported(tmp_path, target, "dflash2", spec=dict(SPECS["dflash2"], draft_vocab_size=100))
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and "whole vocabulary" in manifest["not_servable"][0]
    assert same_state(load_checkpoint(out, TargetInfo.of(target)), speculator)


@pytest.mark.parametrize("num_layers, ids", [(6, [1, 3, 5]), (3, [0, 1, 2])])
def test_eagle3_default_layers_on_shallow_targets_are_served(tmp_path, num_layers, ids):
    """From three layers on, the default ids are three distinct pre-norm ones (6 layers once gave 2, 3, 3)."""
    shallow = tiny_llama(seed=0, num_layers=num_layers)
    config = {"_target_": "speclab.speculator.target.builders.tiny_llama", "seed": 0, "num_layers": num_layers}
    _, out = exported(tmp_path, shallow, "eagle3", target_config=config)
    assert json.loads((out / "export.json").read_text())["layout"] == "speculators_eagle3"
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == ids


def test_eagle3_reading_the_post_norm_last_layer_is_refused(tmp_path, target):
    spec = dict(SPECS["eagle3"], target_layers=[1, 2, 4])
    _, out = exported(tmp_path, target, "eagle3", spec=spec)
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and "pre-norm residual stream" in manifest["not_servable"][0]


def test_eagle3_fusing_layers_out_of_vllms_order_is_refused(tmp_path, target):
    _, out = exported(tmp_path, target, "eagle3", spec=dict(SPECS["eagle3"], target_layers=[3, 1, 2]))
    assert "ascending order" in json.loads((out / "export.json").read_text())["not_servable"][0]


def test_mlp_is_written_in_the_mlp_speculator_layout(tmp_path, target):
    speculator, out = exported(tmp_path, target, "mlp")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mlp_speculator" and config["architectures"] == ["MLPSpeculatorPreTrainedModel"]
    # the 100-token draft vocabulary is expanded to the target's through one extra state dimension
    assert (config["emb_dim"], config["inner_dim"], config["n_predict"], config["vocab_size"]) == \
        (target.hidden_size, 17, 3, target.vocab_size)
    assert "draft_vocab_size" not in config  # vLLM has no such field: the head has a row per target token
    tensors = tensor_names(out)
    assert set(tensors) == {"emb.0.weight", "proj.0.weight", "proj.1.weight", "ln.0.weight", "ln.0.bias",
                            "head.0.weight", "d2t", "t2d"}
    assert tensors["head.0.weight"].shape == (target.vocab_size, 17)
    reloaded = load_checkpoint(out)
    assert torch.equal(reloaded.vocab.ids, speculator.vocab.ids)
    card = (out / "README.md").read_text()
    assert "mlp_speculator" in card and "1.30x" in card and "mean-free" in card


def test_a_tied_single_stage_mlp_falls_back_with_the_reason(tmp_path, target):
    _, out = exported(tmp_path, target, "mlp", spec=dict(SPECS["mlp"], n_predict=1), per_position=(0.5,))
    assert "single stage" in json.loads((out / "export.json").read_text())["not_servable"][0]


def test_draft_lm_is_written_as_a_llama_for_causal_lm(tmp_path, target):
    speculator, out = exported(tmp_path, target, "draft_lm")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == target.vocab_size
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= set(tensor_names(out))
    assert same_state(load_checkpoint(out), speculator)


def test_a_draft_lm_with_a_reduced_vocabulary_falls_back_with_the_reason(tmp_path, target):
    _, out = exported(tmp_path, target, "draft_lm", spec=dict(SPECS["draft_lm"], draft_vocab_size=100))
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and "draft_vocab_size=0" in manifest["not_servable"][0]


def test_medusa_is_written_in_vllms_medusa_layout(tmp_path, target):
    speculator, out = exported(tmp_path, target, "medusa")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert (config["num_heads"], config["num_hidden_layers"], config["truncated_vocab_size"]) == (2, 1, 100)
    tensors = tensor_names(out)
    assert {"blocks.0.layers.0.weight", "blocks.1.layers.0.bias", "lm_heads.1.weight", "token_map"} <= set(tensors)
    assert torch.equal(tensors["token_map"], speculator.vocab.ids)
    assert same_state(load_checkpoint(out), speculator)


def test_a_medusa_narrower_than_its_target_falls_back_with_the_reason(tmp_path, target):
    _, out = exported(tmp_path, target, "medusa", spec=dict(SPECS["medusa"], hidden_size=32, output_init="random"))
    assert "no input projection" in json.loads((out / "export.json").read_text())["not_servable"][0]


@pytest.mark.parametrize("family", ["eagle"])
def test_other_families_keep_speclabs_self_describing_layout(tmp_path, target, family):
    speculator, out = exported(tmp_path, target, family)
    meta = json.loads((out / "config.json").read_text())
    assert meta["family"] == family and meta["target_config"] == TARGET_CONFIG
    assert meta["scored_with"] == {"method": "chain", "k": 2}
    assert not (out / "speclab.json").exists()
    assert same_state(load_checkpoint(out, TargetInfo.of(target)), speculator)


@pytest.mark.parametrize("family", ["eagle3", "peagle", "mlp", "medusa", "draft_lm"])
def test_every_layout_reloads_with_speclab_eval_losslessly(tmp_path, target, family):
    _, out = exported(tmp_path, target, family)
    report = tmp_path / "eval.json"
    assert main(["eval", str(out), "--limit", "2", "--max-new-tokens", "12", "--k", "2", "--json", str(report)]) == 0
    scored = json.loads(report.read_text())
    assert (scored["lossless"]["checked_prompts"], scored["lossless"]["mismatches"]) == (2, 0)
    assert scored["acceptance"]["num_drafts"] > 0


def test_the_verifier_is_a_hub_id_for_a_known_target_and_a_local_path_otherwise(tmp_path, target):
    smollm2 = ExportContext({"target_config": {"_target_": "speclab.speculator.target.builders.smollm2_from_gguf"}}, k=4)
    assert verifier_of(smollm2, "ignored", tmp_path) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "LlamaForCausalLM")
    target.model.save_pretrained(tmp_path / "my-model")  # a user's local checkpoint
    local = ExportContext({"target_config": {"_target_": "speclab.speculator.target.builders.hf_causal_lm",
                                             "name_or_path": str(tmp_path / "my-model")}}, k=4)
    assert verifier_of(local, "ignored", tmp_path) == (str((tmp_path / "my-model").resolve()), "LlamaForCausalLM")


def test_scored_with_reads_the_chosen_method_then_the_chains_k():
    assert scored_with({"method": {"chosen": {"kind": "chain", "k": 6}}, "acceptance": {"k": 6}}) == (6, None)
    tree = {"kind": "tree", "shape": "static", "depth": 3, "top_k": 2, "budget": 5}
    assert scored_with({"method": {"chosen": tree}}) == (3, {"shape": "static", "depth": 3, "top_k": 2, "budget": 5})
    assert scored_with({"acceptance": {"k": 2}}) == (2, None)  # a run from before methods were chosen
