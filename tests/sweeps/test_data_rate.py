"""The data-rate tool measures every source cold to the same training-token budget."""

import json

from speclab.sweeps.data_rate import SOURCES, main

TINY = ["target=tiny", "threads=1", "data.max_prompt_tokens=96", "data.max_response_tokens=24",
        "data.prompt_sampling_budget=8", "data.heldout_size=2", "data.num_prompts=8", "data.gen_batch_size=8"]


def test_every_source_reaches_the_budget_and_reports_its_rates(capsys):
    assert main(["--max-tokens", "150", "--json", *TINY]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["source"] for r in rows] == list(SOURCES)
    for r in rows:
        assert r["train_tokens"] >= 150 and r["tokens"] >= r["train_tokens"]
        assert r["data_s"] > 0 and r["data_train_tok_s"] > 0 and r["feature_tok_s"] > 0
    corpus = rows[-1]
    assert corpus["tokens"] == corpus["train_tokens"]  # teacher-forced: every token has a loss
    # Self-distilled features are the generation's hidden states; a corpus needs the target's pass.
    assert [r["from_generation"] for r in rows] == [True, True, False]
