"""The Lightning adapter against a bf16 target: the logits trained towards are fp32 products
(what the lean decoder computes), on both the unfused and the fused loss path."""

import pytest
import torch

from speclab.speculator.base import Features, TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speclab.training.losses import objective
from speclab.training.module import SpeculatorModule


@pytest.fixture(scope="module")
def bf16_target():
    # The transformers runtime keeps the weights' dtype as its compute dtype: the target
    # hands training bf16 hidden states and a bf16 LM head, as in a bf16 demo run.
    target = tiny_llama(dtype="bf16", runtime="hf")
    assert target.lm_head_weight.dtype == torch.bfloat16
    return target


def _module(target, spec=None):
    spec = spec or build_speculator("mlp", dict(n_predict=2, inner_dim=16), TargetInfo.of(target))
    return SpeculatorModule(spec, target, objective("kl"), optimizer=None, warmup_steps=1, total_steps=1,
                            online=False)


def _hidden(target, seed=0):
    ids = torch.randint(target.vocab_size, (2, 9), generator=torch.Generator().manual_seed(seed))
    return ids, target(ids, logits_for="none").hidden  # [2, 9, H] bf16


@pytest.mark.parametrize("rows", ["all", "columns"])
def test_target_logits_are_fp32_products_of_the_bf16_weights(bf16_target, rows):
    _, hidden = _hidden(bf16_target)
    assert hidden.dtype == torch.bfloat16
    columns = None if rows == "all" else torch.arange(0, bf16_target.vocab_size, 3)
    head = bf16_target.lm_head_weight if columns is None else bf16_target.lm_head_weight[columns]
    logits = _module(bf16_target).target_logits(hidden.reshape(-1, hidden.shape[-1]), columns)
    assert logits.dtype == torch.float32
    # bf16 x bf16 products are exact in fp32; only the fp32 sums round (~1e-7). A bf16 matmul
    # rounds every logit to 8 bits of mantissa (relative error up to 4e-3) and fails this.
    exact = hidden.reshape(-1, hidden.shape[-1]).double() @ head.double().T
    torch.testing.assert_close(logits.double(), exact, rtol=2e-6, atol=2e-6)


def test_fused_and_unfused_losses_agree_against_a_bf16_target(bf16_target):
    counts = torch.arange(bf16_target.vocab_size, 0, -1).float()
    torch.manual_seed(0)
    spec = build_speculator("mlp", dict(n_predict=2, inner_dim=16, draft_vocab_size=37),
                            TargetInfo.of(bf16_target).with_counts(counts))
    module = _module(bf16_target, spec)
    ids, hidden = _hidden(bf16_target, seed=1)
    feats = Features(input_ids=ids, hidden=hidden, loss_mask=torch.ones_like(ids, dtype=torch.bool))
    losses = []
    for fuse in ("always", "never"):
        loss, metrics = spec.loss(feats, objective("kl", fuse), module.target_logits)
        losses.append((loss.item(), metrics))
    (fused, met_f), (unfused, met_u) = losses
    assert fused == pytest.approx(unfused, rel=1e-5)
    assert met_f["acc_pos0"] == met_u["acc_pos0"]


def test_bf16_training_multiplies_in_bf16_and_keeps_the_teacher_and_weights_fp32():
    """precision=bf16: the draft's products in bf16 (its loss moves by bf16 rounding, not
    more), the teacher's logits the fp32 ones bit for bit, gradients and weights fp32."""
    target = tiny_llama()
    torch.manual_seed(0)
    spec = build_speculator("mlp", dict(n_predict=2, inner_dim=16), TargetInfo.of(target))
    ids, hidden = _hidden(target, seed=2)
    batch = {"input_ids": ids, "hidden": hidden, "loss_mask": torch.ones_like(ids, dtype=torch.bool)}
    teachers, losses = {}, {}
    for name in ("fp32", "bf16"):
        module = SpeculatorModule(spec, target, objective("kl", "never"), optimizer=None, warmup_steps=1,
                                  total_steps=1, online=False, precision=name)
        module.log = module.log_dict = lambda *a, **k: None  # no trainer here
        teacher = module.target_logits
        module.target_logits = lambda h, c, name=name: teachers.setdefault(name, teacher(h, c))
        spec.zero_grad(set_to_none=True)
        loss = module.training_step(batch, 0)
        loss.backward()
        losses[name] = loss.item()
        assert loss.dtype == torch.float32
        assert all(p.grad is None or p.grad.dtype == torch.float32 for p in spec.parameters())
    assert all(p.dtype == torch.float32 for p in spec.parameters())
    torch.testing.assert_close(teachers["bf16"], teachers["fp32"], rtol=0, atol=0)
    assert teachers["bf16"].dtype == torch.float32
    assert 0 < abs(losses["bf16"] - losses["fp32"]) < 2e-2 * abs(losses["fp32"])


def test_the_fused_loss_runs_outside_bf16_autocast():
    """The fused loss also computes the teacher's logits: under bf16 training it is called with
    autocast off, so they stay fp32, and its loss is the one it gives outside autocast."""
    target = tiny_llama()
    torch.manual_seed(0)
    spec = build_speculator("mlp", dict(n_predict=2, inner_dim=16), TargetInfo.of(target))
    ids, hidden = _hidden(target, seed=3)
    feats = Features(input_ids=ids, hidden=hidden, loss_mask=torch.ones_like(ids, dtype=torch.bool))
    obj = objective("kl", "always")
    seen = []
    fused = obj.fused
    object.__setattr__(obj, "fused", lambda *a: seen.append(torch.is_autocast_enabled("cpu")) or fused(*a))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        spec.loss(feats, obj, None)
    assert seen and not any(seen)
