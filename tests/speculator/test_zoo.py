"""The speculator zoo (medusa, hydra, eagle, eagle3, peagle, lstm, dflash, dflash2, dspark, xpress): tree drafting agrees with chain
drafting, training reads no future, sizes are knobs, checkpoints hold only the draft's own
weights, and greedy speculative decoding is lossless on a real target."""

from copy import deepcopy

import pytest
import torch

from speclab.eval.engine import generate_plain, generate_speculative
from speclab.speculator import families  # noqa: F401  (fills the registry)
from speclab.speculator.base import Features, TargetInfo
from speclab.speculator.families import REGISTRY, build_speculator, load_speculator, speculator_class
from speclab.speculator.eagle3 import default_layer_ids

from test_families import SMALL, TOL, TRAINING_FREE, random_layers, target_info

ZOO = [f for f in ("medusa", "hydra", "eagle", "eagle3", "peagle", "lstm", "dflash", "dflash2", "dspark", "xpress") if f in SMALL]
# Their later block positions read no token past the pending one x_{t+1} (mask rows); dspark and
# xpress do read x_{t+1+p}, through their heads on the previous token. dflash2's states are
# dflash's: its selector reads x_{t+1+p} after them, in draft_logits (test_families compares
# those with inference).
MASK_ROWS = {"peagle", "dflash", "dflash2"}


def started(spec, info, T0=6, seed=3):
    torch.manual_seed(seed)
    prompt = torch.randint(0, info.vocab_size, (1, T0))
    state = spec.start(prompt, torch.randn(1, T0, info.hidden_size), random_layers(spec, T0, info.hidden_size))
    return state, torch.randint(0, info.vocab_size, (1, 1))


@pytest.mark.parametrize("family", ZOO)
@pytest.mark.parametrize("size", [0, 1])
def test_extend_equals_propose_and_leaves_the_state_alone(family, size):
    info = target_info()
    spec = build_speculator(family, SMALL[family][size], info).eval()
    state, pending = started(spec, info)
    k = 3
    drafts, logits = spec.propose(state, pending, k)
    for d in range(k):
        # row m of extend = propose's logits after drafting paths[m]: use its own drafts, plus
        # random siblings that must each equal a one-row call
        paths = torch.cat([drafts[:, :d], torch.randint(0, info.vocab_size, (4, d))], 0)  # [5, d]
        rows = spec.extend(state, pending, paths)  # [5, N]
        assert rows.shape == (5, spec.vocab.size)
        torch.testing.assert_close(rows[0], logits[0, d], **TOL)
        for m in range(1, 5):
            torch.testing.assert_close(rows[m], spec.extend(state, pending, paths[m : m + 1])[0], **TOL)
    again, again_logits = spec.propose(state, pending, k)
    assert torch.equal(again, drafts)
    torch.testing.assert_close(again_logits, logits, rtol=0, atol=0)


@pytest.mark.parametrize("family", ZOO)
@pytest.mark.parametrize("size", [0, 1])
def test_a_shorter_chain_is_the_start_of_the_longest(family, size):
    """propose(k) drafts what the longest chain starts with (xpress resolves only the k slots
    asked for: its refiner's mix is causal, so later slots cannot change earlier ones)."""
    info = target_info()
    spec = build_speculator(family, SMALL[family][size], info).eval()
    longest = spec.max_draft_len() or 5
    state, pending = started(spec, info)
    drafts, logits = spec.propose(state, pending, longest)
    for k in range(1, longest):
        short, short_logits = spec.propose(state, pending, k)
        assert torch.equal(short, drafts[:, :k])
        torch.testing.assert_close(short_logits, logits[:, :k], **TOL)


@pytest.mark.parametrize("family", [f for f in ("dflash", "dflash2", "dspark", "xpress") if f in ZOO])
def test_a_block_step_streams_dflashs_head_once(family):
    """DFlash's head reads no draft, so a step's drafting computes it once however many slots
    it settles one after another (dspark's bias slot by slot, xpress's Jacobi passes): a draft
    step streams its weights from memory, and the head is the largest of them."""
    info = target_info()
    spec = build_speculator(family, SMALL[family][0], info).eval()
    state, pending = started(spec, info)
    calls = []
    hook = spec.lm_head.register_forward_hook(lambda *args: calls.append(1))
    spec.propose(state, pending, spec.max_draft_len())
    hook.remove()
    assert calls == [1]


@pytest.mark.parametrize("family", ZOO)
def test_training_forward_reads_no_future(family):
    """State (p, t) may read tokens up to x_{t+1+p} and target features up to t, nothing later
    (peagle's and dflash's parallel positions read no token past x_{t+1}: their check moves that one)."""
    info = target_info()
    spec = build_speculator(family, SMALL[family][1], info).eval()
    torch.manual_seed(4)
    T, t = 12, 5
    ids = torch.randint(0, info.vocab_size, (2, T))
    hidden = torch.randn(2, T, info.hidden_size)
    layers = random_layers(spec, T, info.hidden_size)
    layers = None if layers is None else layers.expand(2, -1, -1, -1).clone()
    mask = torch.ones(2, T, dtype=torch.bool)
    with torch.no_grad():
        before = spec.draft_states(Features(ids, hidden, mask, layers))
        for p in range(before.shape[1]):
            ids2, hidden2 = ids.clone(), hidden.clone()
            ids2[:, t + 2 + p :] = (ids2[:, t + 2 + p :] + 1) % info.vocab_size
            hidden2[:, t + 1 :] += 1
            layers2 = None if layers is None else torch.cat([layers[:, : t + 1], layers[:, t + 1 :] + 1], 1)
            after = spec.draft_states(Features(ids2, hidden2, mask, layers2))
            torch.testing.assert_close(after[:, p, : t + 1], before[:, p, : t + 1], **TOL)
            # ...and it does read the token it is given (else the check above proves nothing)
            ids3 = ids.clone()
            read = t + 1 + (0 if family in MASK_ROWS else p)
            ids3[:, read] = (ids3[:, read] + 1) % info.vocab_size
            moved = spec.draft_states(Features(ids3, hidden, mask, layers))
            if family != "medusa":  # medusa's heads read only the target's feature
                assert not torch.allclose(moved[:, p, t], before[:, p, t])


@pytest.mark.parametrize("family", ZOO)
def test_size_knobs_change_the_parameter_count(family):
    info = target_info()
    small, large = (build_speculator(family, SMALL[family][0] | extra, info).num_params()
                    for extra in ({}, bigger(family)))
    assert large > small


def bigger(family: str) -> dict:
    return {"medusa": dict(num_blocks=3), "hydra": dict(hidden_size=32, num_blocks=2),
            "eagle": dict(num_layers=2), "eagle3": dict(num_layers=2, intermediate_size=64),
            "peagle": dict(num_layers=2, intermediate_size=64),
            "lstm": dict(inner_dim=32), "dflash": dict(num_layers=2), "dflash2": dict(selector_rank=9), "dspark": dict(markov_rank=9), "xpress": dict(xpress_rank=9)}[family]


@pytest.mark.parametrize("family", ZOO)
def test_training_loss_backpropagates_to_trainable_weights_only(family):
    info = target_info()
    spec = build_speculator(family, SMALL[family][1], info)
    torch.manual_seed(5)
    T = 10
    ids = torch.randint(0, info.vocab_size, (2, T))
    feats = Features(ids, torch.randn(2, T, info.hidden_size), torch.ones(2, T, dtype=torch.bool),
                     None if not spec.target_layer_ids else torch.randn(2, T, len(spec.target_layer_ids), info.hidden_size))
    head = info.lm_head_weight
    loss, metrics = spec.loss(feats, lambda d, t: torch.nn.functional.cross_entropy(d, t.argmax(-1), reduction="none"),
                              lambda h, cols: h @ (head if cols is None else head[cols]).T)
    loss.backward()
    assert torch.isfinite(loss) and "acc_pos0" in metrics
    trainable = [n for n, p in spec.named_parameters() if p.requires_grad]
    assert trainable and all(spec.get_parameter(n).grad is not None for n in trainable)
    # the target's own tensors are never part of the draft's weights
    names = set(spec.state_dict())
    assert not any(n.startswith(("embed.", "head.")) for n in names), names


def test_eagle_regresses_features_and_needs_the_live_target(tmp_path):
    info = target_info()
    spec = build_speculator("eagle", SMALL["eagle"][1], info)
    T = 9
    feats = Features(torch.randint(0, info.vocab_size, (1, T)), torch.randn(1, T, info.hidden_size),
                     torch.ones(1, T, dtype=torch.bool))
    zero = lambda d, t: d.sum(-1) * 0  # noqa: E731  (token term off: the loss is the regression alone)
    loss, metrics = spec.loss(feats, zero, lambda h, cols: h.new_zeros(len(h), spec.vocab.size))
    states = spec.draft_states(feats)  # [1, P, T, H]: step p at t predicts the target's feature at t + 1 + p
    rows = torch.cat([torch.nn.functional.smooth_l1_loss(states[0, p, : T - 1 - p], feats.hidden[0, 1 + p :],
                                                         reduction="none").mean(-1) for p in range(states.shape[1])])
    assert states.shape[1] == SMALL["eagle"][1]["unroll_steps"] and "feature_loss_pos0" in metrics
    assert loss.item() == pytest.approx(rows.mean().item(), rel=1e-5)
    spec.save(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="pass the live target"):
        load_speculator(tmp_path / "ckpt")
    live = TargetInfo(**{**info.__dict__, "embed_weight": info.embed_weight * 2})
    loaded = load_speculator(tmp_path / "ckpt", live)
    assert loaded.embed.weight.data_ptr() == live.embed_weight.data_ptr()  # the live target's, by reference


def test_eagle3_parameter_names_follow_speculators_layout():
    spec = build_speculator("eagle3", SMALL["eagle3"][1], target_info())
    names = set(spec.state_dict())
    layer0 = {f"layers.0.{n}.weight" for n in (
        "input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
        "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert {"embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "vocab.ids"} | layer0 <= names
    assert not any(n.startswith("layers.1.hidden_norm") for n in names)  # later layers are plain Llama layers
    assert spec.fc.weight.shape == (18, 2 * 20)  # [D, L * H] for target_layers=[1, 3]
    assert spec.embed_tokens.weight.requires_grad  # embedding="trained"
    frozen = build_speculator("eagle3", SMALL["eagle3"][0], target_info())
    assert not frozen.embed_tokens.weight.requires_grad  # EAGLE-3 keeps the target's embedding


def test_eagle3_1_carries_the_normed_output_to_the_next_depth():
    """norm_output (EAGLE-3.1): the first draft is EAGLE-3's; later ones read norm(o), not o."""
    info = target_info()
    base = build_speculator("eagle3", SMALL["eagle3"][0], info).eval()
    v31 = build_speculator("eagle3", dict(SMALL["eagle3"][0], norm_output=True), info).eval()
    v31.load_state_dict(base.state_dict())
    with torch.no_grad():
        for module in (base, v31):
            module.norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(0))
    out = torch.randn(1, 1, SMALL["eagle3"][0]["hidden_size"])
    torch.testing.assert_close(v31.carry(out), base.norm(out), rtol=0, atol=0)
    (_, a), (_, b) = (spec.propose(*started(spec, info), 3) for spec in (base, v31))
    torch.testing.assert_close(a[:, 0], b[:, 0], rtol=0, atol=0)
    assert not torch.allclose(a[:, 1:], b[:, 1:])


@pytest.mark.parametrize("family", ["eagle3", "peagle"])
def test_norm_before_fc_norms_the_fused_target_layers_before_fc(family):
    """norm_before_fc: fc reads RMSNorm([l^a; l^b; l^c]) (one norm over the concatenation), so the
    draft no longer sees the layers' overall scale; without it, scaling them moves the draft."""
    info = target_info()
    spec = build_speculator(family, dict(SMALL[family][0], norm_before_fc=True), info).eval()
    plain = build_speculator(family, SMALL[family][0], info).eval()
    assert spec.input_norm.weight.shape == (len(spec.target_layer_ids) * info.hidden_size,)
    with torch.no_grad():
        spec.input_norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 3, spec.input_norm.weight.numel())
    want = spec.fc(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * spec.input_norm.weight)
    torch.testing.assert_close(spec.lift(x), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(spec.lift(7 * x), spec.lift(x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain.lift(7 * x), plain.lift(x), rtol=1e-3, atol=1e-3)
    assert "input_norm.weight" not in plain.state_dict()


def test_peagle_drafts_a_block_in_one_pass_from_mask_rows():
    """The layers run once per propose; the parallel positions read the mask token and the
    learned mask feature (changing either moves the deeper drafts, never the first)."""
    info = target_info()
    spec = build_speculator("peagle", SMALL["peagle"][0], info).eval()
    state, pending = started(spec, info)
    calls = []
    hook = spec.layers[0].register_forward_hook(lambda *args: calls.append(1))
    _, logits = spec.propose(state, pending, 4)
    hook.remove()
    assert calls == [1] and logits.shape[1] == 4
    with torch.no_grad():
        spec.mask_hidden.add_(1.0)
    _, moved = spec.propose(state, pending, 4)
    torch.testing.assert_close(moved[:, 0], logits[:, 0], rtol=0, atol=0)
    assert not torch.allclose(moved[:, 1:], logits[:, 1:])
    assert spec.propose(state, pending, 9)[0].shape == (1, 4) and spec.max_draft_len() == 4  # a block at most
    with pytest.raises(ValueError, match="blocks of 4"):
        spec.extend(state, pending, torch.zeros(2, 4, dtype=torch.long))


def test_peagle_conditional_drop_token_sampling():
    """Depth d keeps about max(r^d, r_min) of the anchors, each among those kept at d - 1 whose
    depth-d target is trainable; max_anchors caps them; the loss trains each kept row once."""
    info = target_info()
    spec = build_speculator("peagle", dict(SMALL["peagle"][0], block_size=6, down_sample_ratio=0.5,
                                           down_sample_ratio_min=0.2), info)
    T = 40
    trainable = torch.ones(T, dtype=torch.bool)
    trainable[:10] = False  # a prompt
    torch.manual_seed(0)
    kept = spec.sample_chains(trainable, T)
    seeds = int(trainable[2:].sum())  # depth 1 at anchor a guesses the target at a + 2
    assert [len(a) for a in kept] == [int(seeds * max(0.5 ** d, 0.2)) for d in range(1, 6)]
    for d, anchors in enumerate(kept, start=1):
        assert bool(trainable[anchors + 1 + d].all()) and bool((anchors + 1 + d < T).all())
        if d > 1:
            assert set(anchors.tolist()) <= set(kept[d - 2].tolist())
    capped = build_speculator("peagle", dict(SMALL["peagle"][0], block_size=6, max_anchors=5), info)
    assert len(capped.sample_chains(trainable, T)[0]) == int(5 * 0.7)
    # The sampled rows compute what the unsampled forward computes at the same (depth, anchor).
    B = 1
    feats = Features(torch.randint(0, info.vocab_size, (B, T)), torch.randn(B, T, info.hidden_size),
                     trainable[None], torch.randn(B, T, len(spec.target_layer_ids), info.hidden_size))
    with torch.no_grad():
        full = spec.draft_states(feats)  # [1, P, T, D]
        _, base, masked = spec._depth0(feats)
        torch.manual_seed(1)
        rows = spec._chains([(k[:1], v[:1]) for k, v in base], trainable, T, masked)
    assert sorted(rows) == list(range(1, 6))
    for d, (out, at) in rows.items():
        torch.testing.assert_close(spec.head_states(out), full[0, d, at - 1 - d], **TOL)
    torch.manual_seed(1)
    head = info.lm_head_weight
    loss, metrics = spec.loss(feats, lambda a, b: (a - a.detach()).sum(-1) + 1,
                             lambda h, cols: h @ (head if cols is None else head[cols]).T)
    assert loss.item() == pytest.approx(1.0) and {f"acc_pos{d}" for d in range(6)} <= set(metrics)


def test_peagle_training_looks_its_embedding_up_once():
    """Every sequence and depth reads the mask row from the lookup of the tokens: each lookup
    of the trained embedding costs its backward a dense [V, D] gradient (a step paid 29 of
    them at SmolLM2's sizes). The mask row is the one inference drafts from."""
    info = target_info()
    spec = build_speculator("peagle", dict(SMALL["peagle"][0], block_size=6, embedding="trained"), info)
    B, T = 2, 24
    feats = Features(torch.randint(0, info.vocab_size, (B, T)), torch.randn(B, T, info.hidden_size),
                     torch.ones(B, T, dtype=torch.bool), torch.randn(B, T, len(spec.target_layer_ids), info.hidden_size))
    lookups = []
    hook = spec.embed_tokens.register_forward_hook(lambda *args: lookups.append(1))
    head = info.lm_head_weight
    loss, _ = spec.loss(feats, lambda a, b: (a.float() - b.float()).pow(2).mean(-1),
                        lambda h, cols: h @ (head if cols is None else head[cols]).T)
    loss.backward()
    hook.remove()
    assert lookups == [1] and spec.embed_tokens.weight.grad is not None
    with torch.no_grad():
        masked = spec._depth0(feats)[2]
        torch.testing.assert_close(masked, spec.mask_input(), **TOL)


def test_eagle3_default_target_layers_are_low_mid_high():
    assert default_layer_ids(30) == (2, 15, 27)  # SmolLM2-135M: as SpecForge / vLLM pick them
    assert default_layer_ids(32) == (2, 16, 29)
    assert default_layer_ids(7) == (2, 3, 4)  # the shallowest target where 2, L // 2, L - 3 are distinct
    spec = build_speculator("eagle3", SMALL["eagle3"][0], target_info(num_layers=30))
    assert spec.target_layer_ids == (2, 15, 27)
    cls = speculator_class("eagle3")
    assert cls.layer_ids_for(cls.Config(target_layers=[4, 1]), 30) == (4, 1)
    with pytest.raises(ValueError, match="outside 0..30"):
        cls.layer_ids_for(cls.Config(target_layers=[31]), 30)


@pytest.mark.parametrize("num_layers", range(3, 41))
def test_eagle3_default_target_layers_are_three_distinct_pre_norm_ids_from_three_layers(num_layers):
    """Every engine's EAGLE-3 reads three distinct pre-norm layers (0..L-1) in ascending order."""
    ids = default_layer_ids(num_layers)
    assert len(set(ids)) == 3 and list(ids) == sorted(ids) and 0 <= ids[0] and ids[-1] < num_layers


def test_eagle3_default_target_layers_of_shallow_targets():
    assert default_layer_ids(6) == (1, 3, 5)  # not 2, 3, 3
    assert default_layer_ids(4) == (1, 2, 3)
    assert default_layer_ids(3) == (0, 1, 2)
    assert default_layer_ids(2) == (0, 1)  # two pre-norm layers cannot give three


def test_eagle3_d2t_t2d_survive_save_and_load(tmp_path):
    """The exporter writes vocab.d2t()/t2d(): target id = i + d2t[i], and t2d marks exactly those."""
    info = target_info()
    spec = build_speculator("eagle3", SMALL["eagle3"][1], info)
    spec.save(tmp_path / "ckpt")
    loaded = load_speculator(tmp_path / "ckpt")  # eagle3 owns all its weights: no target needed
    d2t, t2d = loaded.vocab.d2t(), loaded.vocab.t2d()
    draft_ids = torch.arange(loaded.vocab.size)
    assert torch.equal(loaded.vocab.to_target(draft_ids), draft_ids + d2t)
    assert torch.equal(t2d.nonzero()[:, 0], draft_ids + d2t) and torch.equal(d2t, spec.vocab.d2t())


# --- lossless greedy decoding on a real (tiny) target -----------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from speclab.speculator.target.builders import tiny_llama

    return tiny_llama()


def real_target_config(family: str) -> dict:
    """SMALL's second shape, made to fit a real target (eagle3, dflash: their default layers); a
    training-free family's defaults."""
    if family in TRAINING_FREE:
        return {}
    return dict(SMALL[family][1], **({"target_layers": []} if family in ("eagle3", "peagle", "dflash", "dflash2", "dspark", "xpress") else {}))


@pytest.mark.parametrize("family", ["eagle3", "peagle"])
def test_eagle_drafters_can_start_as_the_targets_deepest_layer_and_head(family, tiny):
    """head_init and layer_init = target: fc passes the deepest layer read through, the draft
    layer is the target's next decoder layer, the head and final norm are the target's. With the
    embedding half of q/k/v (random at the start) zeroed, the first draft step computes the
    target's own logits from that layer on."""
    info = TargetInfo.of(tiny)
    config = dict(hidden_size=tiny.hidden_size, num_heads=4, num_kv_heads=2, intermediate_size=128, target_layers=[0, 1],
                  draft_vocab_size=0, head_init="target", layer_init="target")
    spec = build_speculator(family, config, info).eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(spec.layers[0].self_attn, name).weight[:, : tiny.hidden_size] = 0
    torch.manual_seed(0)
    ids = torch.randint(3, tiny.vocab_size, (1, 7))
    with torch.no_grad():
        out = tiny.model(ids, output_hidden_states=True)
        layers = torch.stack(out.hidden_states[:2], 2)  # [1, T, 2, H]: the inputs of layers 0 and 1
        states = spec.draft_states(Features(ids, out.hidden_states[-1], torch.ones_like(ids, dtype=torch.bool), layers))
        torch.testing.assert_close(spec.lm_head(states[:, 0]), out.logits, rtol=1e-4, atol=1e-4)
    random = build_speculator(family, dict(config, head_init="random", layer_init="random"), info)
    assert not torch.equal(random.lm_head.weight, spec.lm_head.weight)
    copy = deepcopy(spec)  # as a bench's tree methods copy it: the live target is shared, not cloned
    assert copy.target_info is spec.target_info and copy.lm_head.weight is not spec.lm_head.weight


def test_a_bf16_targets_start_is_its_weights_widened_exactly():
    """A bf16 target's head rows, norm and layer land in the fp32 draft as they are (bf16 widens exactly)."""
    from speclab.speculator.target.builders import tiny_llama

    target = tiny_llama(dtype="bf16", runtime="hf")
    spec = build_speculator("eagle3", dict(hidden_size=target.hidden_size, num_heads=4, num_kv_heads=2, intermediate_size=128,
                                           target_layers=[0, 1], draft_vocab_size=0, head_init="target", layer_init="target"),
                            TargetInfo.of(target))
    ours, theirs = spec.layers[0], target.model.get_decoder().layers[1]
    assert ours.mlp.down_proj.weight.dtype == torch.float32
    assert torch.equal(ours.mlp.down_proj.weight, theirs.mlp.down_proj.weight.float())
    assert torch.equal(ours.self_attn.q_proj.weight[:, target.hidden_size:], theirs.self_attn.q_proj.weight.float())
    assert torch.equal(ours.hidden_norm.weight, theirs.input_layernorm.weight.float())
    assert torch.equal(spec.norm.weight, target.model.get_decoder().norm.weight.float())
    assert torch.equal(spec.lm_head.weight, target.model.lm_head.weight.float())


def test_eagle3_starts_as_the_target_only_at_its_sizes(tiny):
    with pytest.raises(ValueError, match="hidden_size = the target's"):
        build_speculator("eagle3", dict(SMALL["eagle3"][1], target_layers=[], layer_init="target"), TargetInfo.of(tiny))
    with pytest.raises(ValueError, match="random or target"):
        build_speculator("eagle3", dict(SMALL["eagle3"][1], target_layers=[], head_init="copied"), TargetInfo.of(tiny))


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_greedy_speculative_decoding_is_lossless_on_tiny(family, tiny):
    torch.manual_seed(6)
    counts = torch.randint(0, 100, (tiny.vocab_size,))
    spec = build_speculator(family, real_target_config(family), TargetInfo.of(tiny).with_counts(counts)).eval()
    for prompt_len in (1, 9):  # a one-token prompt leaves the feature families nothing to prefill
        prompt = torch.randint(3, tiny.vocab_size, (1, prompt_len))
        plain = generate_plain(tiny, prompt, 10, eos_ids=())
        spec_out = generate_speculative(tiny, spec, prompt, 10, k=3, eos_ids=())
        assert spec_out.tokens == plain.tokens


@pytest.mark.parametrize("learned", ["dflash", "dflash2", "dspark", "xpress"])
def test_a_hybrid_with_a_block_drafter_is_lossless_as_a_chain_and_as_a_tree(learned, tiny):
    """The hybrid's learned part a block drafter (configs/speculator/hybrid_dflash.yaml): its
    steps mix suffix chains and blocks; a tree step unions both. min_match 1: suffix drafts
    wherever the prompt repeats, so both parts draft."""
    from speclab.eval.tree import TreeConfig, generate_tree

    torch.manual_seed(8)
    spec = build_speculator("hybrid", {"learned": dict(real_target_config(learned), family=learned), "min_match": 1},
                            TargetInfo.of(tiny).with_counts(torch.randint(0, 100, (tiny.vocab_size,)))).eval()
    prompt = torch.randint(3, tiny.vocab_size, (1, 6)).repeat(1, 3)  # repeats: the suffix part matches
    plain = generate_plain(tiny, prompt, 16, eos_ids=())
    assert generate_speculative(tiny, spec, prompt, 16, k=3, eos_ids=()).tokens == plain.tokens
    tree = TreeConfig(shape="union", depth=3, top_k=2, budget=8)
    assert generate_tree(tiny, spec, prompt, 16, tree, eos_ids=()).tokens == plain.tokens


@pytest.mark.slow
def test_greedy_speculative_decoding_is_lossless_on_smollm2():
    """Every family, untrained, at its shipped default size, on the real SmolLM2-135M target."""
    from speclab.speculator.target.builders import smollm2_from_gguf
    from speclab.eval.prompts import encode_prompt

    target = smollm2_from_gguf(dtype="fp32")
    info = TargetInfo.of(target).with_counts(torch.randint(0, 100, (target.vocab_size,), generator=torch.Generator().manual_seed(0)))
    prompt = encode_prompt(target.tokenizer, {"prompt": "Write a Python function that reverses a list."}, chat_template=True)
    plain = generate_plain(target, prompt, 12, eos_ids=())
    for family in sorted(REGISTRY):
        spec = build_speculator(family, {}, info).eval()
        assert generate_speculative(target, spec, prompt, 12, k=3, eos_ids=()).tokens == plain.tokens, family
