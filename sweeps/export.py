"""Export the best run's speculator: weights, config, result.json and a model card.

The export directory is a speculator checkpoint in its own right (`load_speculator` and
`speclab eval` read it directly). It is assembled in a temporary sibling directory and
renamed into place, so an existing export is replaced only once the new one is complete.
Only safetensors and JSON are read: nothing is ever unpickled.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from speclab.speculator.base import Speculator, TargetInfo
from speclab.speculator.families import load_speculator, speculator_class

from .export_formats import ENGINE_LAYOUTS, ExportContext, layout_of, write_layout
from .run_rows import best, is_eligible, load_rows, metric_value
from .results import (EXPORT_MANIFEST, RESULT_FILE, SHARED_DIR_MODE, SHARED_FILE_MODE, SPECULATOR_FILES,
                      is_speculator_checkpoint, weights_sha256, write_json_atomic)
from .table import format_number, format_params, format_per_position, format_speedup

log = logging.getLogger(__name__)

MODEL_CARD = "README.md"
DEFAULT_K = 4  # draft length written into an export's proposal config when the run recorded none
# Among runs the prompts do not separate from the leader (run_rows.mark_ties), the export takes:
TIE_ORDER = "servable by an engine first, then fewer parameters, then the higher speedup"
BESIDE_SUFFIX = "-best-overall"  # the best run when no engine serves it, exported next to the servable one


def pick_best(runs_dir: str | Path, metric: str = "speedup") -> tuple[dict, dict | None]:
    """(the run to export, the tie it was chosen from or None). By `metric`, the leader; by
    speedup, of the leader and the runs tied with it, the first in TIE_ORDER: a tie is no
    reason to ship the slower-to-serve or larger drafter (docs/design.md)."""
    leader = best(runs_dir, metric)
    if metric != "speedup":
        return leader, None
    rows = load_rows(runs_dir)
    tied = [row for row in rows if row["run_dir"] == leader["run_dir"] or row.get("tied_with_leader")]
    if len(tied) < 2:
        return leader, None
    chosen = min(tied, key=_tie_rank)
    return chosen, {"leader": leader["run_id"], "tied": [row["run_id"] for row in sorted(tied, key=_tie_rank)],
                    "order": TIE_ORDER, "chosen": chosen["run_id"],
                    "by": [(row.get("vs_leader") or {}).get("by") for row in tied if not row.get("leader")]}


def _tie_rank(row: dict) -> tuple[bool, float, float]:
    params = row.get("params")
    return (not servable(row), params if isinstance(params, int) else float("inf"), -(metric_value(row, "speedup") or 0))


def servable(row: dict, engine: str = "vllm") -> bool:
    """Whether the run's family exports to a layout `engine` serves (export_formats.ENGINE_LAYOUTS;
    an export whose engine refuses its settings still falls back to speclab's own)."""
    return bool(row.get("family")) and row["family"] in ENGINE_LAYOUTS.get(engine, {})


def beside_dir(out_dir: str | Path) -> Path:
    """Where the best run overall goes when no engine serves it: next to the servable export."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + BESIDE_SUFFIX)


def best_servable(runs_dir: str | Path, metric: str, engine: str = "vllm") -> dict | None:
    eligible = [row for row in load_rows(runs_dir) if is_eligible(row, metric) and servable(row, engine)]
    return max(eligible, key=lambda row: metric_value(row, metric)) if eligible else None


def export_best(runs_dir: str | Path, out_dir: str | Path, metric: str = "speedup", engine: str = "vllm") -> Path:
    """Copy the best run (by measured `metric`, ties broken by TIE_ORDER: pick_best) into
    out_dir, in its layout for `engine`; returns out_dir. export.json's `tie` names the tied runs (null: no tie).

    An export is for serving: when no engine serves the best run (a corpus, a family with no
    engine layout), out_dir gets the best run an engine can serve, and the best run overall is
    exported beside it (`beside_dir`), each export.json naming the other and the reason."""
    row, tie = pick_best(runs_dir, metric)
    alternative = None if servable(row, engine) else best_servable(runs_dir, metric, engine)
    if alternative is None:
        return _export_run(runs_dir, row, tie, out_dir, metric, engine)
    reason = f"no serving engine loads a {row['family']} speculator (docs/serving.md)"
    beside = beside_dir(out_dir)
    _export_run(runs_dir, row, tie, beside, metric, engine, {"role": "best overall, not servable", "reason": reason,
                                                      "servable_export": str(Path(out_dir))})
    return _export_run(runs_dir, alternative, None, out_dir, metric, engine, {
        "role": "best servable", "best_overall": {"run_id": row["run_id"], "family": row["family"],
                                                  "value": metric_value(row, metric), "export": str(beside),
                                                  "reason": reason}})


def _export_run(runs_dir: str | Path, row: dict, tie: dict | None, out_dir: str | Path, metric: str,
                engine: str, role: dict | None = None) -> Path:
    run_dir = Path(runs_dir) / row["run_dir"]
    checkpoint = checkpoint_of(run_dir, row["result"])
    meta = json.loads((checkpoint / "config.json").read_text())
    speculator = verify_weights(checkpoint, row["result"].get("final_weights_sha256"), meta)
    ctx = ExportContext(meta, *scored_with(row["result"]), final_dir=Path(out_dir))

    def fill(tmp: Path) -> None:
        layout, refused = write_layout(tmp, speculator, ctx, engine)  # eagle3: speculators, mlp: mlp_speculator, ...
        shutil.copy2(run_dir / RESULT_FILE, tmp / RESULT_FILE)  # byte for byte, as measured
        card = model_card(row["result"], metric, meta.get("target_config"), layout, refused, ctx.scored_with)
        if tie:
            card += f"\n{tie_line(tie)}\n"
        if role:
            card += f"\n{role_line(role)}\n"
        (tmp / MODEL_CARD).write_text(card)
        write_json_atomic(tmp / EXPORT_MANIFEST, {
            "run_id": row["run_id"],
            "source_run_dir": str(run_dir.resolve()),
            "layout": layout,
            "engine": engine,
            "not_servable": refused,  # why the family's engine layout was not written (empty: it was)
            "scored_with": ctx.scored_with,
            "metric": metric,
            "value": metric_value(row, metric),
            "speedup_ci": row.get("speedup_ci"),
            "tie": tie,
            "role": role,  # null: the best run, servable or the only kind there is; else which of a pair it is
            "final_weights_sha256": row["result"].get("final_weights_sha256"),
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })

    return replace_dir(Path(out_dir), fill)


def export_for_engine(source: str | Path, out_dir: str | Path, engine: str) -> Path:
    """An existing export, or a run, written in `engine`'s layout (`speclab serve` turns the demo's
    vLLM export into llama.cpp's): the same weights, result.json and method, refused where that engine has no
    layout for the family or could not compute it as measured. Both files are read as data."""
    source = Path(source)
    result_file = source / RESULT_FILE
    if not result_file.is_file():
        raise FileNotFoundError(f"{source} is neither a speclab export nor a run: it has no {RESULT_FILE}")
    from .checkpoint_meta import checkpoint_meta
    from .export_formats import load_checkpoint

    result = json.loads(result_file.read_text())
    if (source / EXPORT_MANIFEST).is_file():
        manifest, checkpoint = json.loads((source / EXPORT_MANIFEST).read_text()), source
    else:  # a run directory
        manifest, checkpoint = {"run_id": result.get("run_id"), "source_run_dir": str(source.resolve())}, \
            checkpoint_of(source, result)
    meta = checkpoint_meta(checkpoint)
    family = meta.get("family")
    layout_of(str(family), engine)  # an engine without a layout for the family: refused in one line
    speculator = load_checkpoint(checkpoint, live_target_info(meta))
    expected = result.get("final_weights_sha256")
    if expected and weights_sha256(speculator.state_dict()) != expected:
        raise ValueError(f"{source} holds weights other than the ones its result.json measured: the export was changed")
    ctx = ExportContext(meta, *scored_with(result), final_dir=Path(out_dir))

    def fill(tmp: Path) -> None:
        layout, refused = write_layout(tmp, speculator, ctx, engine)
        if refused:
            raise ValueError(f"{engine} cannot serve {source} as it was measured: {'; '.join(refused)}")
        shutil.copy2(result_file, tmp / RESULT_FILE)
        card = model_card(result, str(manifest.get("metric") or "speedup"), meta.get("target_config"), layout, refused,
                          ctx.scored_with)
        (tmp / MODEL_CARD).write_text(card + f"\nWritten for {engine} from the export {source.resolve()}.\n")
        write_json_atomic(tmp / EXPORT_MANIFEST, {
            **{key: manifest.get(key) for key in ("run_id", "source_run_dir", "metric", "value", "speedup_ci", "tie",
                                                  "role", "final_weights_sha256")},
            "layout": layout, "engine": engine, "not_servable": refused, "scored_with": ctx.scored_with,
            "converted_from": str(source.resolve()),
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })

    return replace_dir(Path(out_dir), fill)


def role_line(role: dict) -> str:
    """One line saying which of a servable / best-overall pair an export is."""
    if "best_overall" in role:
        best = role["best_overall"]
        return (f"The best run overall, {best['run_id']} ({best['family']}), is not servable ({best['reason']}): "
                f"it is exported beside this one, in {best['export']}.")
    return f"Not servable ({role['reason']}); the best servable run is exported in {role['servable_export']}."


def tie_line(tie: dict) -> str:
    """One line saying the export was chosen from a tie, and how."""
    return (f"A tie: {', '.join(tie['tied'])} are not separated from the fastest ({tie['leader']}) by their paired "
            f"intervals; {tie['chosen']} was chosen, {tie['order']}.")


def scored_with(result: dict) -> tuple[int, dict | None]:
    """(k, tree or None) the run was scored with: result.json's chosen method (eval/method.py:
    {"kind": "chain", "k"} or {"kind": "tree", shape, depth, top_k, budget}), else its chain's k."""
    chosen = (result.get("method") or {}).get("chosen") or {}
    if chosen.get("kind") == "tree":
        return chosen["depth"], {key: chosen[key] for key in ("shape", "depth", "top_k", "budget")}
    return chosen.get("k") or (result.get("acceptance") or {}).get("k") or DEFAULT_K, None


def checkpoint_of(run_dir: Path, result: dict) -> Path:
    """The speculator directory result.json's `checkpoint` names (relative to the run dir)."""
    if not result.get("checkpoint"):
        raise FileNotFoundError(f"run {run_dir} records no checkpoint in its {RESULT_FILE}")
    checkpoint = run_dir / result["checkpoint"]
    if not is_speculator_checkpoint(checkpoint):
        raise FileNotFoundError(
            f"{checkpoint} (the checkpoint of run {run_dir}) lacks {' or '.join(SPECULATOR_FILES)}")
    return checkpoint


def verify_weights(checkpoint: Path, expected_sha256: str | None, meta: dict | None = None) -> Speculator:
    """Refuse to export weights other than the ones whose figures result.json reports.

    The checkpoint is hashed as `load_speculator` rebuilds it, i.e. as a user will get it:
    its state dict names a tied tensor under every alias, as the run's in-memory model did,
    while the safetensors file stores it once.
    """
    speculator = load_speculator(checkpoint, live_target_info(meta or {}))
    if not expected_sha256:
        log.warning("%s: result.json has no final_weights_sha256; exporting unverified weights", checkpoint)
        return speculator
    actual = weights_sha256(speculator.state_dict())
    if actual != expected_sha256:
        raise ValueError(f"{checkpoint} holds weights with sha256 {actual[:12]}..., but the run "
                         f"measured weights {expected_sha256[:12]}...: the checkpoint was changed")
    return speculator


def live_target_info(meta: dict) -> TargetInfo | None:
    """The recorded target, built only for families that draft through its frozen tensors
    (eagle reads the target's LM head, which its checkpoint does not hold)."""
    family = meta.get("family")
    if not family or not getattr(speculator_class(family), "target_tensors", ()):
        return None
    from .target_spec import parse_target_spec

    spec = parse_target_spec(meta.get("target_config"), "the checkpoint's target_config")  # data, never code
    return TargetInfo.of(spec.build())


def replace_dir(out_dir: Path, fill: Callable[[Path], None]) -> Path:
    """Build out_dir's new contents with `fill(tmp)` in a sibling temp dir, then swap it in.

    An existing out_dir is replaced only if it is empty or an earlier export: never a
    directory of unrelated files a mistyped --out points at.
    """
    if out_dir.exists() and not _replaceable(out_dir):
        raise FileExistsError(f"{out_dir} exists and is not an earlier export; "
                              "choose another --out or remove it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    try:
        tmp.chmod(SHARED_DIR_MODE)
        fill(tmp)
        for written in tmp.rglob("*"):  # safetensors writes owner-only files; a server reads them
            written.chmod(SHARED_DIR_MODE if written.is_dir() else SHARED_FILE_MODE)
        if out_dir.exists():
            old = Path(f"{tmp}.old")
            os.replace(out_dir, old)
            try:
                os.replace(tmp, out_dir)
            except BaseException:
                os.replace(old, out_dir)  # put the previous export back
                raise
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _replaceable(path: Path) -> bool:
    return path.is_dir() and ((path / EXPORT_MANIFEST).is_file() or not any(path.iterdir()))


LAYOUT_FILES = {
    "speclab": "`model.safetensors` + `config.json`: speclab's own speculator checkpoint "
               "(`load_speculator` reads it); no serving engine loads it",
    "mlp_speculator": "`model.safetensors` + `config.json` in the fms-extras / vLLM `mlp_speculator` layout "
                      "(`emb.i`, `proj.i`, `ln.i`, `head.i`), speclab's norm and draft vocabulary folded into the "
                      "weights so vLLM's mean-free norm and full-vocabulary head compute speclab's logits; serve with "
                      "`--speculative-config '{\"method\": \"mlp_speculator\", \"model\": DIR, "
                      "\"num_speculative_tokens\": K}'`. `speclab.json` maps it back to speclab",
    "speculators_eagle3": "`model.safetensors` + `config.json` in vLLM's speculators format "
                          "(`speculators_model_type: eagle3`, `Eagle3DraftModel` tensor names, `d2t`/`t2d`); vLLM "
                          "serves it (`vllm serve DIR`), speculators' `SpeculatorModel.from_pretrained` loads it "
                          "when the draft is as wide as the target; `speclab.json` maps it back",
    "speculators_peagle": "`model.safetensors` + `config.json` in vLLM's speculators format "
                          "(`speculators_model_type: peagle`, `PEagleDraftModel` tensor names with `mask_hidden`, "
                          "`mask_token_id`, `d2t`/`t2d`); speculators' `SpeculatorModel.from_pretrained` loads it when "
                          "the draft is as wide as the target; `speclab.json` maps it back",
    "vllm_medusa": "`model.safetensors` + `config.json` of vLLM's `MedusaModel` (`blocks.i.layers.j`, "
                   "`lm_heads.i`, `token_map` for a reduced vocabulary); serve with `--speculative-config "
                   "'{\"method\": \"medusa\", \"model\": DIR, \"num_speculative_tokens\": K}'`; "
                   "`speclab.json` maps it back",
    "sglang_eagle3": "`model.safetensors` + `config.json` of SGLang's `LlamaForCausalLMEagle3` (`fc`, `midlayer.*`, "
                     "`norm`, `lm_head`, `d2t`/`t2d`; a LlamaConfig with `draft_vocab_size`, `target_hidden_size` and "
                     "`eagle_config.eagle_aux_hidden_state_layer_ids`, which count decoder-layer outputs); serve with "
                     "`python -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 "
                     "--speculative-draft-model-path DIR --speculative-num-steps K --speculative-eagle-topk 1 "
                     "--speculative-num-draft-tokens K+1`; `speclab.json` maps it back",
    "trtllm_eagle3": "`model.safetensors` + `config.json` of TensorRT-LLM's `Eagle3ForCausalLM` (`fc`, `midlayer.*` "
                     "or `midlayer.i.*`, `norm`, `lm_head`, `d2t`); serve with `Eagle3DecodingConfig("
                     "speculative_model_dir=DIR, max_draft_len=K, eagle3_layers_to_capture=IDS)`, IDS being "
                     "`config.json`'s `eagle_config.eagle_aux_hidden_state_layer_ids`; `speclab.json` maps it back",
    "llama_cpp_eagle3": "vLLM's speculators format (as `--engine vllm` writes it) plus `draft.gguf`, the draft converted "
                        "by llama.cpp's own `convert_hf_to_gguf.py --target-model-dir`, and `llama_cpp.json`, whose `serve` "
                        "is the command (`llama-server -m TARGET.gguf -md DIR/draft.gguf --spec-type draft-eagle3 "
                        "--spec-draft-n-max K`); llama.cpp decodes the target from its GGUF (SmolLM2: the shipped "
                        "Q4_1 file that speclab dequantises), so its target features differ from speclab's by its "
                        "quantised arithmetic",
    "llama_cpp_dflash": "vLLM's speculators format (as `--engine vllm` writes it) plus `draft.gguf`, converted by "
                        "llama.cpp's own `convert_hf_to_gguf.py` through its reader of speculators' DFlash-lineage "
                        "schema, and `llama_cpp.json` (`llama-server ... --spec-type draft-dflash`): the pending token "
                        "and block_size - 1 mask tokens, drafted in one pass",
    "llama_cpp_dspark": "vLLM's speculators format plus `draft.gguf` (llama.cpp's DFLASH architecture with the "
                        "Markov head) and `llama_cpp.json` (`llama-server ... --spec-type draft-dspark`)",
    "hf_llama": "`model.safetensors` + `config.json` of a plain `LlamaForCausalLM`: transformers' "
                "`generate(assistant_model=AutoModelForCausalLM.from_pretrained(DIR))` and vLLM's draft-model "
                "method load it; `speclab.json` maps it back",
}


def model_card(result: dict, metric: str, target_config: dict | None, layout: str = "speclab",
               refused: list[str] = (), scored: dict | None = None) -> str:
    """A short README.md with the run's measured figures."""
    files = f"Layout `{layout}`: {LAYOUT_FILES.get(layout, layout)}. Also `result.json` (the run's full " \
            "record) and `export.json` (where it came from)."
    if scored:
        how = f"a chain of k = {scored['k']}" if scored["method"] == "chain" else f"a tree {json.dumps(scored['tree'])}"
        files = f"Scored with {how}.\n\n" + files
    if refused:
        files += "\n\nNot written in its engine's layout, because: " + "; ".join(refused) + "."
    costs = [f"- {key}: {format_number(value, '.3g')}" for key, value in sorted((result.get("throughput") or {}).items())
             if "draft" in key and isinstance(value, (int, float))]
    return _model_card_body(result, metric, target_config, "\n".join([*costs, "", files]) if costs else files)


def _model_card_body(result: dict, metric: str, target_config: dict | None, files: str) -> str:
    spec = result.get("speculator") or {}
    acc = result.get("acceptance") or {}
    thr = result.get("throughput") or {}
    lossless = result.get("lossless") or {}
    train = result.get("train") or {}
    target = (target_config or {}).get("_target_", "unknown")
    lines = [
        f"# speclab speculator `{result.get('run_id')}`",
        "",
        f"A `{spec.get('family')}` speculator ({format_params(spec.get('params'))} parameters), "
        f"the best run by measured **{metric}**.",
        "",
        f"- target: `{target}` ({json.dumps(target_config)})",
        f"- draft length k: {acc.get('k')}",
        f"- mean acceptance length: {format_number(acc.get('mean_acceptance_length'))} "
        f"(acceptance rate {format_number(acc.get('acceptance_rate'))})",
        f"- per-position acceptance: {format_per_position(acc.get('per_position'))}",
        f"- tokens/s: {format_number(thr.get('spec_tok_s'), '.1f')} speculative vs "
        f"{format_number(thr.get('baseline_tok_s'), '.1f')} plain decoding = {format_speedup(thr.get('speedup'))}",
        f"- lossless check: {lossless.get('mismatches')} mismatches in {lossless.get('checked_prompts')} prompts",
        f"- training: {train.get('steps')} steps, {train.get('tokens')} tokens, "
        f"final loss {format_number(train.get('final_loss'), '.4f')}",
        f"- weights sha256: `{result.get('final_weights_sha256')}`",
        "",
        files,
        "",
        "```python",
        "from speclab.sweeps.export_formats import load_checkpoint",
        'speculator = load_checkpoint("<this directory>")  # any layout; eagle needs the live target',
        "```",
        "",
        "Re-score it: `speclab eval <this directory>`.",
        "",
    ]
    return "\n".join(lines)

