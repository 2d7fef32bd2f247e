import pytest
import torch

from speclab.training.losses import ce_on_argmax, forward_kl, objective


def test_forward_kl_matches_definition_and_is_zero_on_equal_logits():
    torch.manual_seed(0)
    d, t = torch.randn(5, 11, dtype=torch.float64), torch.randn(5, 11, dtype=torch.float64)
    p, q = t.softmax(-1), d.softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(forward_kl(d, t).double(), expected, rtol=1e-5, atol=1e-6)
    assert forward_kl(t, t).abs().max() < 1e-6


def test_forward_kl_gradient_is_q_minus_p():
    torch.manual_seed(1)
    d = torch.randn(3, 7, requires_grad=True)
    t = torch.randn(3, 7)
    forward_kl(d, t).sum().backward()
    torch.testing.assert_close(d.grad, d.detach().softmax(-1) - t.softmax(-1), rtol=1e-5, atol=1e-6)


def test_ce_on_argmax_uses_the_targets_greedy_token():
    t = torch.tensor([[0.0, 5.0, 1.0]])
    d = torch.tensor([[1.0, 2.0, 3.0]])
    assert ce_on_argmax(d, t).item() == pytest.approx(-d.log_softmax(-1)[0, 1].item())


def test_unknown_objective_lists_valid_ones():
    with pytest.raises(ValueError, match="valid: \\['ce', 'kl'\\]"):
        objective("mse")


# --- the fused path (speclab.kernels.distill_loss) inside Speculator.loss ------------------

FUSED_CASES = {
    "mlp": dict(n_predict=3, inner_dim=24),
    "mlp-reduced-vocab": dict(n_predict=3, inner_dim=17, tie_weights=False, draft_vocab_size=37),
    "draft_lm": dict(num_layers=1, hidden_size=24, num_heads=3, intermediate_size=40),
    "draft_lm-reduced-vocab": dict(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=24,
                                   draft_vocab_size=37),
}


def _features(target, seed=0):
    from speclab.speculator.base import Features

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(target.vocab_size, (2, 12), generator=g)
    mask = torch.rand(2, 12, generator=g) < 0.7
    return Features(input_ids=ids, hidden=target(ids, logits_for="none").hidden.float(), loss_mask=mask)


@pytest.mark.parametrize("kind", ["kl", "ce"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_fused_loss_matches_the_unfused_path_on_the_tiny_target(target, case, kind):
    from speclab.speculator.base import TargetInfo
    from speclab.speculator.families import build_speculator

    family = case.split("-")[0]
    counts = torch.arange(target.vocab_size, 0, -1).float()  # a reduced vocabulary keeps the lowest ids
    info = TargetInfo.of(target).with_counts(counts)
    torch.manual_seed(0)
    spec = build_speculator(family, FUSED_CASES[case], info)
    feats = _features(target)

    def head(hidden, columns):  # the unfused target head, as training.module.SpeculatorModule's
        w = target.lm_head_weight if columns is None else target.lm_head_weight[columns]
        return torch.nn.functional.linear(hidden, w).float()

    fused_calls = []
    obj = objective(kind)
    fused = type(obj)(kind, fuse="always")  # these shapes are far below the CPU's "auto" threshold
    object.__setattr__(fused, "fused", lambda *a: fused_calls.append(1) or obj.fused(*a))
    results = []
    for chosen in (fused, lambda d, t: obj(d, t)):  # the lambda has no .fused: today's path
        spec.zero_grad()
        loss, metrics = spec.loss(feats, chosen, head)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in spec.named_parameters() if p.grad is not None}
        results.append((loss.detach(), metrics, grads))
    assert fused_calls, "the fused path was not taken"
    (loss_f, met_f, grad_f), (loss_u, met_u, grad_u) = results
    # fp32 both ways; the fused path sums the vocabulary in chunks (reordered fp32 sums): 1e-5.
    torch.testing.assert_close(loss_f, loss_u, rtol=1e-5, atol=1e-6)
    assert met_f.keys() == met_u.keys() and any(k.startswith("acc_pos") for k in met_f)
    for key in met_f:
        assert met_f[key] == pytest.approx(met_u[key], rel=1e-5, abs=1e-6), key
    assert grad_f.keys() == grad_u.keys()
    for name in grad_f:
        torch.testing.assert_close(grad_f[name], grad_u[name], rtol=1e-4, atol=1e-6, msg=name)


def test_auto_fuses_on_cuda_or_where_the_logits_would_be_big():
    from speclab.training.losses import FUSE_MIN_LOGITS

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    auto = objective("kl")
    assert not auto.fuses(512, 8192, cpu)  # the demo's shapes: the unfused path is faster on CPU
    assert auto.fuses(FUSE_MIN_LOGITS // 49152 + 1, 49152, cpu)
    assert auto.fuses(1, 8, cuda)
    assert objective("kl", "always").fuses(1, 8, cpu) and not objective("kl", "never").fuses(10**6, 10**6, cuda)
    with pytest.raises(ValueError, match="fused_loss"):
        objective("kl", "sometimes")


def test_auto_takes_the_unfused_path_for_small_cpu_shapes(target):
    from speclab.speculator.base import TargetInfo
    from speclab.speculator.families import build_speculator

    spec = build_speculator("mlp", FUSED_CASES["mlp"], TargetInfo.of(target))
    calls = []
    auto = objective("kl")
    object.__setattr__(auto, "fused", lambda *a: calls.append(1) or objective("kl").fused(*a))
    head = lambda hidden, columns: torch.nn.functional.linear(hidden, target.lm_head_weight).float()  # noqa: E731
    spec.loss(_features(target), auto, head)
    assert not calls


def test_objectives_are_plain_callables_too():
    d, t = torch.randn(4, 9), torch.randn(4, 9)
    torch.testing.assert_close(objective("kl")(d, t), forward_kl(d, t))
    torch.testing.assert_close(objective("ce")(d, t), ce_on_argmax(d, t))
