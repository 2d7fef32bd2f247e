"""Choosing a run's drafting method: the verification-cost curve, the tree it affords, and a
pilot whose choice follows the measured speed (a target made slow at trees picks a chain)."""

import dataclasses
import time

import pytest

from speclab.eval.method import (MethodConfig, candidates, choose, cost_curve, method_of, pick, pilot, tree_for,
                                 tree_of, verification_cost)
from speclab.eval.prompts import encode_prompt
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speculator_stubs import OracleSpeculator, scripted

DELAY_S = 0.1  # per slowed call: ~100x a warm tiny-target step, far above timing noise


class Slowed:
    """The tiny target, its tree verification (a call with a tree mask) or its chain
    verification (several tokens, no mask) made slow; everything else passes through."""

    def __init__(self, target, slow: str):
        self.target, self.slow = target, slow

    def __getattr__(self, name):
        return getattr(self.target, name)

    def __call__(self, ids, cache=None, *args, attention_mask=None, **kwargs):
        tree = attention_mask is not None
        if (self.slow == "tree" and tree) or (self.slow == "chain" and not tree and ids.shape[1] > 1 and cache is not None
                                              and kwargs.get("logits_for") == "all"):
            time.sleep(DELAY_S)
        return self.target(ids, cache, *args, attention_mask=attention_mask, **kwargs)


PILOT = MethodConfig(chain_k=[1, 3], tree_depth=3, tree_top_k=2, cost_lengths=[1, 2, 4, 8], cost_repeats=1,
                     pilot_prompts=1, pilot_tokens=12, cost_cache=False)


def test_cost_curve_has_every_length_and_grows_with_a_slow_tree_path(target, prompt):
    fast = verification_cost(target, prompt, [1, 4, 2], repeats=2)
    assert list(fast) == [1, 2, 4] and all(ms > 0 for ms in fast.values())
    slow = verification_cost(Slowed(target, "tree"), prompt, [1, 4], repeats=1)
    assert min(slow.values()) > DELAY_S * 1e3  # it timed the tree-mask path


def test_the_cost_curve_is_measured_once_per_target_and_machine(target, prompt, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path))
    cfg = MethodConfig(cost_lengths=[1, 2], cost_repeats=1)
    first, source = cost_curve(target, prompt, cfg)
    assert source == "measured" and list(first) == [1, 2]
    # the same target made slow at trees: a new measurement would exceed DELAY_S per length
    again, source = cost_curve(Slowed(target, "tree"), prompt, cfg)
    assert source == "measured earlier on this machine" and again == first
    fresh, source = cost_curve(Slowed(target, "tree"), prompt, dataclasses.replace(cfg, cost_cache=False))
    assert source == "measured" and min(fresh.values()) > DELAY_S * 1e3
    other, source = cost_curve(target, prompt, dataclasses.replace(cfg, cost_lengths=[1, 4]))
    assert source == "measured" and list(other) == [1, 4]  # another curve is another record


def test_tree_budget_is_the_most_tokens_within_the_slack():
    spec = build_speculator("ngram", {}, TargetInfo(vocab_size=7, hidden_size=4, num_layers=1))
    cost = {1: 10.0, 2: 11.0, 4: 12.0, 8: 14.9, 16: 30.0}
    assert tree_for(cost, MethodConfig(cost_slack=1.5), spec).budget == 8
    assert tree_for(cost, MethodConfig(cost_slack=1.25), spec).budget == 4
    tight = tree_for(cost, MethodConfig(cost_slack=1.0, tree_depth=6), spec)
    assert tight.budget == 2 and tight.depth == 2  # never a one-node tree; depth within the budget
    mlp = build_speculator("mlp", {"n_predict": 3, "inner_dim": 8}, TargetInfo(vocab_size=7, hidden_size=4, num_layers=1))
    assert tree_for(cost, MethodConfig(tree_depth=6), mlp).depth == 3  # capped at its longest chain
    assert [m.get("k") for m in candidates(mlp, MethodConfig(chain_k=[1, 2, 5, 8]), None)] == [1, 2, 3]
    tree = tree_for(cost, MethodConfig(), mlp)
    assert [m.get("shape") for m in candidates(mlp, MethodConfig(), tree)] == [None, None, None, "dynamic"]
    hybrid = build_speculator("hybrid", {"learned": {"family": "mlp", "n_predict": 3, "inner_dim": 8}},
                              TargetInfo(vocab_size=7, hidden_size=4, num_layers=1))
    full, compact = candidates(hybrid, MethodConfig(chain_k=[1, 6]), tree_for(cost, MethodConfig(), hybrid))[-2:]
    assert full == {"kind": "tree", "shape": "union", "depth": 6, "top_k": 4, "budget": 8}  # its chains offered
    assert compact == {"kind": "tree", "shape": "union", "depth": 4, "top_k": 4, "budget": 6}  # the sized depth + 2
    tight = candidates(hybrid, MethodConfig(chain_k=[1, 6]), tree_for(cost, MethodConfig(cost_slack=1.25), hybrid))
    assert [m["budget"] for m in tight[-3:]] == [4, 8, 6]  # a union holds more than its first chain
    assert [m["depth"] for m in tight[-3:]] == [4, 6, 4]
    same = candidates(hybrid, MethodConfig(chain_k=[1, 4]), tree_for(cost, MethodConfig(cost_slack=1.25), hybrid))
    assert [m.get("shape") for m in same].count("union") == 1  # no second union where the two coincide


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("slow, expected", [("tree", "chain"), ("chain", "tree")])
def test_the_choice_follows_the_measured_speed(slow, expected, dtype):
    target = tiny_llama(dtype=dtype)
    prompt = encode_prompt(target.tokenizer, {"prompt": "Write a function that returns the sum of a list"})
    speculator = scripted(OracleSpeculator, target, [prompt], 40)
    block = choose(Slowed(target, slow), speculator, [prompt], PILOT)
    assert block["chosen"]["kind"] == expected
    kinds = {m["kind"] for m in block["candidates"]}
    assert kinds == {"chain", "tree"} and set(block["verify_cost_ms"]) == {"1", "2", "4", "8"}
    fastest = max(block["candidates"], key=lambda m: max(m["tok_s_rounds"]))
    assert all(block["fastest"][key] == fastest[key] for key in block["fastest"])
    chosen = pick(block["candidates"], PILOT.tie)
    assert all(block["chosen"][key] == chosen[key] for key in block["chosen"])
    if expected == "tree":
        assert tree_of(block["chosen"]).budget >= 2
    else:
        assert tree_of(block["chosen"]) is None


def test_a_speed_tie_goes_to_the_candidate_accepting_the_most():
    # shaped like the full recipe's suffix_corpus pilot: chains of 4, 6, 8 within the pilot's noise
    tried = [{"kind": "chain", "k": 2, "tok_s": 140.0, "acceptance_length": 1.87},
             {"kind": "chain", "k": 4, "tok_s": 164.1, "acceptance_length": 2.10},
             {"kind": "chain", "k": 6, "tok_s": 160.0, "acceptance_length": 2.22},
             {"kind": "chain", "k": 8, "tok_s": 156.5, "acceptance_length": 2.29},  # 4.6% behind: tied at 5%
             {"kind": "tree", "shape": "dynamic", "tok_s": 125.8, "acceptance_length": 2.54},  # 23% behind
             {"kind": "tree", "shape": "union", "tok_s": None, "error": "no trees"}]
    assert pick(tried, 0.05)["k"] == 8
    assert pick(tried, 0.04)["k"] == 6
    assert pick(tried, 0.0)["k"] == 4  # tie 0: the fastest
    assert pick(tried, 0.3)["shape"] == "dynamic"
    equal = [{"kind": "chain", "k": 1, "tok_s": 100.0, "acceptance_length": 2.0},
             {"kind": "chain", "k": 2, "tok_s": 101.0, "acceptance_length": 2.0}]
    assert pick(equal, 0.05)["k"] == 2  # the faster of equals
    # a burst slowed one round of the deeper union: its other round decides (the warm demo's pilot)
    burst = [{"kind": "tree", "depth": 8, "tok_s": 154.3, "tok_s_rounds": [139.6, 172.6], "acceptance_length": 2.51},
             {"kind": "tree", "depth": 4, "tok_s": 164.6, "tok_s_rounds": [161.0, 168.4], "acceptance_length": 2.29}]
    assert pick(burst, 0.0)["depth"] == 8 and pick(burst, 0.05)["depth"] == 8
    with pytest.raises(ValueError, match="tie"):
        MethodConfig(tie=1.0)


def test_the_pilot_times_every_candidate_in_order_then_in_reverse(target, prompt, monkeypatch):
    import speclab.eval.method as method

    calls, decode = [], method.decode
    monkeypatch.setattr(method, "decode", lambda t, s, p, n, m: calls.append((m["k"], n)) or decode(t, s, p, n, m))
    speculator = build_speculator("suffix", {}, TargetInfo.of(target))
    tried = pilot(target, speculator, [prompt], [{"kind": "chain", "k": k} for k in (1, 2, 3)], 8)
    timed = [k for k, n in calls if n == 8]  # the warm-ups decode WARMUP_TOKENS
    assert timed == [1, 2, 3, 3, 2, 1]
    assert all(m["new_tokens"] == 2 * 8 for m in tried)  # both rounds counted
    assert all(len(m["tok_s_rounds"]) == 2 and min(m["tok_s_rounds"]) <= m["tok_s"] <= max(m["tok_s_rounds"])
               for m in tried)  # each round's rate recorded, the pilot's noise visible in result.json


def test_pilots_do_not_leak_the_eval_history(target, prompt):
    # suffix learns from what it decodes: each candidate, and the final score, start afresh,
    # so a candidate tried after the others accepts exactly what it accepts tried alone
    speculator = build_speculator("suffix", {}, TargetInfo.of(target))
    block = choose(target, speculator, [prompt], PILOT)
    assert speculator.history.size == 1  # nothing left for the final score either
    for tried in block["candidates"]:
        alone = pilot(target, build_speculator("suffix", {}, TargetInfo.of(target)), [prompt], [method_of(tried)],
                      PILOT.pilot_tokens)
        assert alone[0]["acceptance_length"] == tried["acceptance_length"], tried


def test_the_pilot_drafts_through_the_native_drafting_the_score_uses(target, prompt):
    # Piloted on torch's GEMV, a learned drafter's heads cost several times what they cost
    # in the score (benchmark.score routes them natively), and drafting-heavy methods lose.
    from torch import nn

    from speclab.kernels import native

    if native.load() is None:
        pytest.skip("no native kernels on this machine: nothing is routed")
    speculator = build_speculator("mlp", {"n_predict": 2, "inner_dim": 16}, TargetInfo.of(target)).eval()
    linears = [m for m in speculator.modules() if isinstance(m, nn.Linear)]
    routed, propose = [], speculator.propose_tokens  # what greedy chains draft through

    def recording(*args, **kwargs):
        routed.append(all("forward" in vars(m) for m in linears))  # an instance forward: the native route
        return propose(*args, **kwargs)

    speculator.propose_tokens = recording
    pilot(target, speculator, [prompt], [{"kind": "chain", "k": 2}], 8)
    assert routed and all(routed)
    assert not any("forward" in vars(m) for m in linears)  # and back to torch's afterwards
