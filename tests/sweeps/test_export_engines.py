"""EAGLE-3 exports for SGLang and TensorRT-LLM, run by oracles rebuilt from each engine's
published model code (eagle3_engine_oracles.py): the engine's logits at every draft step equal
speclab's, its draft-to-target id map equals speclab's vocabulary, and the oracles fail on a
layout that is not the engine's (control tests).

Tolerance 1e-5 on fp32 logits, as in test_export_interop.py: the same function with differently
ordered operations (a fused qkv and gate/up, another attention loop) agrees to ~1e-6.
"""

import json

import pytest
import torch
from eagle3_engine_oracles import ORACLES, SGLangEagle3, TRTLLMEagle3, engine_draft_logits
from interop import T, random_input_norm
from test_export_layouts import SPECS, exported, tensor_names

from speclab.speculator.target.builders import tiny_llama
from speclab.sweeps.cli import main

ATOL = 1e-5
WIDE = dict(SPECS["eagle3"], hidden_size=64, num_heads=4, num_kv_heads=2)  # as wide as the target: its embedding


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, num_layers=4)


def sequence(target, seed=0):
    return torch.randint(0, target.vocab_size, (1, T), generator=torch.Generator().manual_seed(seed))


def oracle_vs_speclab(layout, speculator, out, target) -> tuple[float, float, bool]:
    """(max |logit difference|, argmax agreement, drafted target ids equal) over every step and position."""
    from interop import target_features

    model = ORACLES[layout].from_export(out, target.embed_weight)
    feats = target_features(target, speculator)
    want = speculator.draft_logits(feats)[0]  # [P, T, N]
    got = engine_draft_logits(model, target, feats.input_ids, want.shape[0])
    diff = max((g - w[: g.shape[0]]).abs().max().item() for g, w in zip(got, want))
    agree = min((g.argmax(-1) == w[: g.shape[0]].argmax(-1)).float().mean().item() for g, w in zip(got, want))
    drafted = torch.cat([g.argmax(-1) for g in got])
    same_ids = torch.equal(model.to_target(drafted), speculator.vocab.to_target(drafted))
    return diff, agree, same_ids


@pytest.mark.parametrize("layout, engine", [("sglang_eagle3", "sglang"), ("trtllm_eagle3", "trtllm")])
@pytest.mark.parametrize("spec", [SPECS["eagle3"], dict(SPECS["eagle3"], draft_vocab_size=0), WIDE],
                         ids=["narrow-reduced-vocab", "narrow-full-vocab", "as-wide-as-the-target"])
def test_eagle3_runs_in_the_engines_maths_as_in_speclabs(tmp_path, target, layout, engine, spec):
    speculator, out = exported(tmp_path, target, "eagle3", spec=spec, engine=engine)
    assert json.loads((out / "export.json").read_text())["layout"] == layout
    diff, agree, same_ids = oracle_vs_speclab(layout, speculator, out, target)
    assert diff < ATOL and agree == 1.0 and same_ids


EAGLE3_1 = {"norm-output": dict(SPECS["eagle3"], norm_output=True),
            "norm-before-fc": dict(SPECS["eagle3"], norm_before_fc=True),
            "both": dict(SPECS["eagle3"], norm_output=True, norm_before_fc=True)}


@pytest.mark.parametrize("spec", EAGLE3_1.values(), ids=EAGLE3_1.keys())
def test_trtllm_runs_eagle3_1_as_speclab_does(tmp_path, target, spec):
    """TensorRT-LLM reads norm_output and eagle_config.norm_before_fc; the export writes both. The
    input norm's weight is made random first, so a norm that is not loaded or not applied shows."""
    prepare = random_input_norm if spec.get("norm_before_fc") else None
    speculator, out = exported(tmp_path, target, "eagle3", spec=spec, engine="trtllm", prepare=prepare)
    config = json.loads((out / "config.json").read_text())
    assert config["norm_output"] == spec.get("norm_output", False)
    assert config["eagle_config"]["norm_before_fc"] == spec.get("norm_before_fc", False)
    diff, agree, same_ids = oracle_vs_speclab("trtllm_eagle3", speculator, out, target)
    assert diff < ATOL and agree == 1.0 and same_ids
    for key in ("norm_output", "norm_before_fc"):  # control: the engine told the other way computes something else
        if spec.get(key):
            flipped = json.loads(json.dumps(config))
            (flipped if key == "norm_output" else flipped["eagle_config"])[key] = False
            (out / "config.json").write_text(json.dumps(flipped))
            assert oracle_vs_speclab("trtllm_eagle3", speculator, out, target)[0] > 1e-3


def test_trtllm_runs_a_draft_of_several_layers(tmp_path, target):
    speculator, out = exported(tmp_path, target, "eagle3", spec=dict(SPECS["eagle3"], num_layers=2), engine="trtllm")
    assert {"midlayer.0.input_layernorm.weight", "midlayer.1.hidden_norm.weight"} <= set(tensor_names(out))
    assert "midlayer.1.input_layernorm.weight" not in tensor_names(out)  # later layers are `next_layer_regular`
    diff, agree, same_ids = oracle_vs_speclab("trtllm_eagle3", speculator, out, target)
    assert diff < ATOL and agree == 1.0 and same_ids


def test_the_config_names_layers_by_decoder_output(tmp_path, target):
    speculator, out = exported(tmp_path, target, "eagle3", engine="sglang")
    config = json.loads((out / "config.json").read_text())
    assert speculator.target_layer_ids == (1, 2, 3)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # SGLang captures id + 1
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 100
    assert config["target_hidden_size"] == target.hidden_size and config["tie_word_embeddings"] is False
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} \
        <= set(tensor_names(out))


# --- controls: the oracles fail on a layout that is not the engine's -------------------------


def test_sglang_cannot_load_the_speculators_names(tmp_path, target):
    """SGLang skips names it has no parameter for: speclab's layers.0.* would leave its layer empty."""
    _, out = exported(tmp_path, target, "eagle3", engine="vllm")
    config = json.loads((out / "config.json").read_text())  # give it the config SGLang reads, keep the names
    sglang_config = json.loads(json.dumps(config["transformer_layer_config"]))
    sglang_config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=100,
                         target_hidden_size=target.hidden_size,
                         eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    (out / "config.json").write_text(json.dumps(sglang_config))
    with pytest.raises(AssertionError, match="SGLang would leave .*midlayer.* uninitialised"):
        SGLangEagle3.from_export(out, target.embed_weight)


@pytest.mark.parametrize("layout, engine", [("sglang_eagle3", "sglang"), ("trtllm_eagle3", "trtllm")])
def test_layer_ids_in_speclabs_convention_would_not_match(tmp_path, layout, engine):
    """The engines count decoder outputs: speclab's ids written unshifted read the next layers."""
    deeper = tiny_llama(seed=0, num_layers=6)
    config = {"_target_": "speclab.speculator.target.builders.tiny_llama", "seed": 0, "num_layers": 6}
    speculator, out = exported(tmp_path, deeper, "eagle3", spec=dict(SPECS["eagle3"], target_layers=[1, 2, 3]),
                               target_config=config, engine=engine)
    assert oracle_vs_speclab(layout, speculator, out, deeper)[0] < ATOL
    draft_config = json.loads((out / "config.json").read_text())
    draft_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (out / "config.json").write_text(json.dumps(draft_config))
    assert oracle_vs_speclab(layout, speculator, out, deeper)[0] > 1e-2


def test_trtllm_later_layers_without_hidden_norm_are_not_loaded(tmp_path, target):
    _, out = exported(tmp_path, target, "eagle3", spec=dict(SPECS["eagle3"], num_layers=2), engine="vllm")
    config = json.loads((out / "config.json").read_text())["transformer_layer_config"]
    config.update(draft_vocab_size=100, target_hidden_size=target.hidden_size,
                  eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(AssertionError, match="TensorRT-LLM would leave .*midlayer.1.hidden_norm"):
        TRTLLMEagle3.from_export(out, target.embed_weight)


# --- what the engines cannot compute: speclab's layout, with the reason ---------------------


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_a_trained_embedding_as_wide_as_the_target_is_refused(tmp_path, target, engine):
    _, out = exported(tmp_path, target, "eagle3", spec=dict(WIDE, embedding="trained"), engine=engine)
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and manifest["engine"] == engine
    assert "replaces the draft's token embedding by the target's" in manifest["not_servable"][0]


@pytest.mark.parametrize("spec, reason", [
    (EAGLE3_1["norm-output"], "carries the pre-norm state to the next drafted step"),
    (EAGLE3_1["norm-before-fc"], "no norm over the fused target layers before fc"),
], ids=["norm-output", "norm-before-fc"])
def test_sglang_refuses_eagle3_1(tmp_path, target, spec, reason):
    _, out = exported(tmp_path, target, "eagle3", spec=spec, engine="sglang")
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["layout"] == "speclab" and any(reason in line for line in manifest["not_servable"])


def test_sglang_refuses_several_layers(tmp_path, target):
    _, out = exported(tmp_path, target, "eagle3", spec=dict(SPECS["eagle3"], num_layers=2), engine="sglang")
    assert "restart the residual stream" in json.loads((out / "export.json").read_text())["not_servable"][0]


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_the_embeddings_as_a_target_layer_cannot_be_named(tmp_path, engine):
    shallow = tiny_llama(seed=0, num_layers=3)  # default ids 0, 1, 2
    config = {"_target_": "speclab.speculator.target.builders.tiny_llama", "seed": 0, "num_layers": 3}
    _, out = exported(tmp_path, shallow, "eagle3", target_config=config, engine=engine)
    reasons = json.loads((out / "export.json").read_text())["not_servable"]
    assert any("embeddings (layer 0) cannot be named" in reason for reason in reasons)


def test_an_engine_without_a_layout_for_the_family_is_a_clear_error(tmp_path, target, capsys):
    exported(tmp_path / "mlp", target, "mlp")
    code = main(["export", "--best", "--runs", str(tmp_path / "mlp" / "runs"), "--out", str(tmp_path / "x"),
                 "--engine", "sglang"])
    assert code == 2 and "sglang has no layout for the mlp family" in capsys.readouterr().err


def test_the_cli_writes_the_engines_layout(tmp_path, target, capsys):
    exported(tmp_path, target, "eagle3")
    assert main(["export", "--best", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "trt"),
                 "--engine", "trtllm"]) == 0
    assert json.loads((tmp_path / "trt" / "export.json").read_text())["layout"] == "trtllm_eagle3"
