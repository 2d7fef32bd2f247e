"""Every family: its teacher-forced training forward and its incremental inference path
compute the same logits for the same inputs; configs and registry agree."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from speclab.speculator.base import Features, TargetInfo
from speclab.speculator.families import REGISTRY, build_speculator, load_speculator

CONFIGS = Path(__file__).parents[2] / "configs" / "speculator"
# fp32 on the same CPU kernels; the two paths differ only in matmul shapes (batched vs
# one row), which reorders sums: 1e-5 relative is a few ulps of the logits' scale.
TOL = dict(rtol=1e-5, atol=1e-5)

SMALL = {
    "mlp": [dict(n_predict=3, inner_dim=24, tie_weights=True),
            dict(n_predict=4, inner_dim=17, tie_weights=False, draft_vocab_size=19)],
    "draft_lm": [dict(num_layers=2, hidden_size=24, num_heads=3, intermediate_size=40, init_from_target=True),
                 dict(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=24, init_from_target=True,
                      draft_vocab_size=19)],
    # odd widths, heads not dividing the target's, grouped KV heads, tied and untied outputs
    "medusa": [dict(n_predict=3, num_blocks=1, hidden_size=0),
               dict(n_predict=4, num_blocks=2, hidden_size=17, output="shared", draft_vocab_size=19)],
    "hydra": [dict(n_predict=3, hidden_size=24, num_blocks=1),
              dict(n_predict=4, hidden_size=17, num_blocks=2, output="shared", draft_vocab_size=19)],
    "eagle": [dict(num_layers=1, hidden_size=24, num_heads=4, num_kv_heads=2, intermediate_size=40, unroll_steps=3),
              dict(num_layers=2, hidden_size=18, num_heads=3, num_kv_heads=1, intermediate_size=23, unroll_steps=4,
                   draft_vocab_size=19)],
    "eagle3": [dict(num_layers=1, hidden_size=24, num_heads=4, num_kv_heads=2, intermediate_size=40, ttt_steps=3),
               dict(num_layers=2, hidden_size=18, num_heads=3, num_kv_heads=3, intermediate_size=23, ttt_steps=3,
                    target_layers=[1, 3], embedding="trained", draft_vocab_size=19, norm_output=True,
                    norm_before_fc=True)],  # EAGLE-3.1 with speculators' fused-input norm
    "peagle": [dict(num_layers=1, hidden_size=24, num_heads=4, num_kv_heads=2, intermediate_size=40, block_size=4),
               dict(num_layers=2, hidden_size=18, num_heads=3, num_kv_heads=3, intermediate_size=23, block_size=3,
                    target_layers=[1, 3], embedding="frozen", mask_token_id=7, draft_vocab_size=19, norm_before_fc=True)],
    # head_dim independent of the (target's) width; a trained head; anchors sampled or every row
    "dflash": [dict(block_size=4, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=6, intermediate_size=40),
               dict(block_size=5, num_layers=2, num_heads=3, num_kv_heads=3, head_dim=4, intermediate_size=23,
                    target_layers=[1, 3], head="trained", anchors=3, draft_vocab_size=19)],
    "dspark": [dict(block_size=3, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=6, intermediate_size=40,
                    markov_rank=5),
               dict(block_size=4, num_layers=2, num_heads=3, num_kv_heads=3, head_dim=4, intermediate_size=23,
                    target_layers=[1, 3], markov_rank=3, markov_head="gated", anchors=3, draft_vocab_size=19)],
    # the selector reranks K of the 53 tokens; 20 channels in groups of 4 or 5
    "dflash2": [dict(block_size=4, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=6, intermediate_size=40,
                     conv_group_size=5, selector_rank=6, selector_top_k=5, draft_vocab_size=0),
                dict(block_size=5, num_layers=2, num_heads=3, num_kv_heads=3, head_dim=4, intermediate_size=23,
                     target_layers=[1, 3], head="trained", anchors=3, conv_kernel_size=3, conv_group_size=4,
                     selector_rank=3, selector_top_k=7, draft_vocab_size=19)],
    "xpress": [dict(block_size=4, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=6, intermediate_size=40,
                    xpress_rank=5),
               dict(block_size=5, num_layers=2, num_heads=3, num_kv_heads=3, head_dim=4, intermediate_size=23,
                    target_layers=[1, 3], xpress_rank=3, xpress_mlp_ratio=1, anchors=3, draft_vocab_size=19)],
    "lstm": [dict(n_predict=3, inner_dim=24, tie_weights=True),
             dict(n_predict=4, inner_dim=17, tie_weights=False, draft_vocab_size=19)],
    # min_match out of reach: every step drafts with the learned part, whose training forward this checks
    "hybrid": [dict(learned=dict(family="mlp", n_predict=3, inner_dim=24), min_match=100),
               dict(learned=dict(family="lstm", n_predict=4, inner_dim=17, draft_vocab_size=19), min_match=100)],
}
# No training forward to compare: their drafting rules are tested in test_training_free.py.
TRAINING_FREE = {"ngram", "suffix"}


def target_info(vocab=53, hidden=20, num_layers=3):
    torch.manual_seed(0)
    return TargetInfo(vocab_size=vocab, hidden_size=hidden, num_layers=num_layers, name="stub",
                      embed_weight=torch.randn(vocab, hidden), lm_head_weight=torch.randn(vocab, hidden),
                      token_counts=torch.randint(0, 50, (vocab,)))


def random_layers(spec, T, hidden):
    """[1, T, L, H] stand-ins for the target's intermediate layers (None when the family reads none)."""
    ids = spec.target_layer_ids
    return torch.randn(1, T, len(ids), hidden) if ids else None


def test_config_groups_mirror_registry():
    # One config per family, plus variants of a family under their own names (suffix_corpus).
    assert set(REGISTRY) <= {p.stem for p in CONFIGS.glob("*.yaml")}
    for path in CONFIGS.glob("*.yaml"):
        if path.stem not in REGISTRY:  # a variant starts from its family's config
            assert set(OmegaConf.load(path).get("defaults", [])) & set(REGISTRY), path.name
    assert set(SMALL) | TRAINING_FREE == set(REGISTRY), "every learned family needs shapes in this test"


def module_imports(path: Path, top_level_only: bool) -> set[str]:
    """The speculator/ modules a file imports (relative imports), at its top level or anywhere."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    return found


def test_registry_and_interfaces_do_not_import_each_other():
    speculator_dir = CONFIGS.parents[1] / "speculator"
    assert "families" not in module_imports(speculator_dir / "base.py", top_level_only=False)
    # No family imports the registry while it loads (hybrid looks families up inside functions).
    for cls in REGISTRY.values():
        path = speculator_dir / f"{cls.__module__.rsplit('.', 1)[-1]}.py"
        assert "families" not in module_imports(path, top_level_only=True), path.name


def test_unknown_family_and_option_name_valid_choices():
    with pytest.raises(ValueError, match="valid: .*draft_lm.*mlp"):
        build_speculator("nope", {}, target_info())
    with pytest.raises(ValueError, match="valid: .*inner_dim"):
        build_speculator("mlp", {"width": 3}, target_info())


@pytest.mark.parametrize("family", sorted(SMALL))
@pytest.mark.parametrize("size", [0, 1])
def test_training_forward_equals_inference(family, size):
    info = target_info()
    spec = build_speculator(family, SMALL[family][size], info).eval()
    torch.manual_seed(1)
    T0, k = 7, 3  # prompt length, draft steps
    prompt = torch.randint(0, info.vocab_size, (1, T0))
    hidden = torch.randn(1, T0 + k + 1, info.hidden_size)
    pending = torch.randint(0, info.vocab_size, (1, 1))
    layers = random_layers(spec, T0 + k + 1, info.hidden_size)
    cut = lambda x, n: None if x is None else x[:, :n]  # noqa: E731

    state = spec.start(prompt, hidden[:, :T0], cut(layers, T0))
    drafts, logits = spec.propose(state, pending, k)  # [1, k], [1, k, V]
    assert drafts.shape == (1, k) and logits.shape == (1, k, spec.vocab.size)
    assert torch.equal(drafts, spec.vocab.to_target(logits.argmax(-1)))

    # Teacher-force the sequence the draft itself produced: prompt, pending, d_1..d_k.
    seq = torch.cat([prompt, pending, drafts], 1)  # [1, T0 + 1 + k]
    feats = Features(input_ids=seq, hidden=hidden[:, : seq.shape[1]], loss_mask=torch.ones_like(seq, dtype=torch.bool),
                     layers=cut(layers, seq.shape[1]))
    with torch.no_grad():
        tf = spec.draft_logits(feats)  # [1, P, T, V]
    for i in range(k):
        # Draft i guesses token T0 + 1 + i: for shift s and step p, position t = T0 + i - s - p.
        p = min(i, tf.shape[1] - 1)
        t = T0 + i - spec.shift - p
        torch.testing.assert_close(tf[0, p, t], logits[0, i], **TOL)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_propose_tokens_are_proposes_drafts(family):
    info = target_info()
    spec = build_speculator(family, SMALL[family][0], info).eval()
    torch.manual_seed(3)
    prompt, hidden = torch.randint(0, info.vocab_size, (1, 6)), torch.randn(1, 6, info.hidden_size)
    layers = random_layers(spec, 6, info.hidden_size)
    pending = torch.randint(0, info.vocab_size, (1, 1))
    drafts, _ = spec.propose(spec.start(prompt, hidden, layers), pending, 3)
    assert torch.equal(spec.propose_tokens(spec.start(prompt, hidden, layers), pending, 3), drafts)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_accept_then_propose_matches_fresh_start(family):
    """After a partial acceptance, the state equals one started on the committed prefix."""
    info = target_info()
    spec = build_speculator(family, SMALL[family][0], info).eval()
    torch.manual_seed(2)
    prompt = torch.randint(0, info.vocab_size, (1, 6))
    hidden = torch.randn(1, 12, info.hidden_size)
    pending = torch.randint(0, info.vocab_size, (1, 1))
    layers = random_layers(spec, 12, info.hidden_size)
    span = lambda lo, hi: None if layers is None else layers[:, lo:hi]  # noqa: E731
    for n in range(0, 4):  # accepted drafts, including all k
        state = spec.start(prompt, hidden[:, :6], span(0, 6))
        drafts, _ = spec.propose(state, pending, 3)
        committed = torch.cat([pending, drafts[:, :n]], 1)
        spec.accept(state, committed, hidden[:, 6 : 7 + n], span(6, 7 + n))
        nxt = torch.tensor([[5]])
        _, after = spec.propose(state, nxt, 3)

        fresh = spec.start(torch.cat([prompt, committed], 1), hidden[:, : 7 + n], span(0, 7 + n))
        _, expected = spec.propose(fresh, nxt, 3)
        torch.testing.assert_close(after, expected, **TOL)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_save_load_round_trip(family, tmp_path):
    info = target_info()
    spec = build_speculator(family, SMALL[family][1], info)
    spec.save(tmp_path / "ckpt")
    loaded = load_speculator(tmp_path / "ckpt", info)
    assert spec.state_dict().keys() == loaded.state_dict().keys()
    for k, a in spec.state_dict().items():
        assert torch.equal(a, loaded.state_dict()[k]), k
    assert torch.equal(loaded.vocab.ids, spec.vocab.ids)  # the trained draft vocabulary survives
    with pytest.raises(ValueError, match="trained for target"):
        load_speculator(tmp_path / "ckpt", target_info(vocab=60))


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    spec = build_speculator("mlp", SMALL["mlp"][0], target_info())
    spec.save(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupt speculator checkpoint"):
        load_speculator(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="not a speculator checkpoint"):
        load_speculator(tmp_path / "missing")


def test_mlp_tie_weights_shrinks_parameters():
    info = target_info()
    tied = build_speculator("mlp", dict(n_predict=4, inner_dim=16, tie_weights=True), info)
    untied = build_speculator("mlp", dict(n_predict=4, inner_dim=16, tie_weights=False), info)
    assert tied.num_params() < untied.num_params()


def test_reduced_vocab_trains_only_rows_it_can_propose():
    """Rows whose next token is outside the draft vocabulary carry no loss."""
    info = target_info()
    spec = build_speculator("draft_lm", SMALL["draft_lm"][1], info)
    outside = int((~spec.vocab.t2d()).nonzero()[0])
    inside = int(spec.vocab.ids[0])
    ids = torch.tensor([[inside, outside, inside, inside]])
    feats = Features(input_ids=ids, hidden=torch.zeros(1, 4, info.hidden_size),
                     loss_mask=torch.tensor([[True, False, False, False]]))  # only t=0 -> next is `outside`
    seen = []
    loss, metrics = spec.loss(feats, lambda d, t: seen.append(len(d)) or d.sum(-1) * 0, lambda h, c: h.new_zeros(len(h), len(c)))
    assert seen == [] and metrics == {}


@pytest.mark.parametrize("family", ["mlp", "hydra", "medusa"])
def test_the_targets_logits_are_computed_once_per_batch_and_each_step_reads_its_own_rows(family):
    """The loss equals a step-by-step reference (each step's rows through the target's head
    alone), with loss_mask holes so a step reading another step's rows would change it."""
    info = target_info()
    spec = build_speculator(family, SMALL[family][0], info)
    torch.manual_seed(11)
    B, T = 2, 12
    feats = Features(torch.randint(0, info.vocab_size, (B, T)), torch.randn(B, T, info.hidden_size),
                     torch.rand(B, T) > 0.3)
    weight = info.lm_head_weight
    head = lambda h, cols: h @ (weight if cols is None else weight[cols]).T  # noqa: E731
    calls = []
    kl = lambda d, t: (t.softmax(-1) * (t.log_softmax(-1) - d.log_softmax(-1))).sum(-1)  # noqa: E731
    loss, _ = spec.loss(feats, kl, lambda h, cols: calls.append(len(h)) or head(h, cols))

    states = spec.draft_states(feats)
    next_ids = torch.zeros_like(feats.input_ids)
    next_ids[:, :-1] = feats.input_ids[:, 1:]
    trainable = feats.loss_mask & spec.vocab.contains(next_ids)
    columns = None if spec.vocab.full else spec.vocab.ids
    rows = []
    for p in range(states.shape[1]):
        lo = spec.shift + p
        if lo >= T:
            break
        mask = trainable[:, lo:]
        draft = spec.draft_head(p, states[:, p, : T - lo][mask])
        rows.append(kl(draft, head(feats.hidden[:, lo:][mask], columns)))
    reference = torch.cat(rows).mean()
    assert len(calls) == 1 and states.shape[1] > 1
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)


@pytest.mark.parametrize("family", ["medusa", "hydra"])
def test_the_old_chain_length_name_is_refused_naming_the_new_one(family):
    with pytest.raises(ValueError, match=rf"^speculator.num_heads was renamed: {family} takes speculator.n_predict"):
        build_speculator(family, {"num_heads": 3}, target_info())


@pytest.mark.parametrize("old, new", [("shared", "true"), ("per_stage", "false")])
def test_lstms_old_tie_weights_strings_are_refused_naming_the_bool(old, new):
    with pytest.raises(ValueError, match=rf"^speculator.tie_weights={old} is now a bool: speculator.tie_weights={new}$"):
        build_speculator("lstm", {"tie_weights": old}, target_info())


def test_a_checkpoint_stored_with_an_old_name_is_refused_not_remapped(tmp_path):
    out = build_speculator("medusa", dict(n_predict=2, hidden_size=0), target_info()).save(tmp_path / "medusa")
    meta = json.loads((out / "config.json").read_text())
    meta["config"]["num_heads"] = meta["config"].pop("n_predict")  # as saved before the rename
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="num_heads was renamed: medusa takes speculator.n_predict") as err:
        load_speculator(out, target_info())
    assert "\n" not in str(err.value)


def test_one_name_per_concept_across_families():
    fields = {family: {f.name: f.type for f in dataclasses.fields(cls.Config)} for family, cls in REGISTRY.items()}
    chains = {family for family, names in fields.items() if "n_predict" in names}
    assert chains == {"mlp", "lstm", "medusa", "hydra"}
    assert all("num_heads" not in fields[f] for f in chains)  # num_heads: attention heads only
    assert {f: names["tie_weights"] for f, names in fields.items() if "tie_weights" in names} == {
        "mlp": "bool", "lstm": "bool"}
