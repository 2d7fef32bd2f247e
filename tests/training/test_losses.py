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
