"""One evaluation job (``race evaluate``): every snapshot of an :class:`race.core.jobs.EvalJob`,
each on every target, each target with its own ``eval`` FLOP ledger, written to ``eval.json``.

A snapshot is a base policy, or a base policy plus the LoRA adapter of a budget rung
(``results/runs/<cell>/budget~<B>/``). Generation is reseeded per batch from ``seed`` and a fixed
per-target salt, so a target's samples do not depend on which other targets run. The targets,
their intervals, what each is charged and the ``eval.json`` format (``race-eval/1``) are
described in docs/design.md, "File formats".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from race.core.atomic import write_json_atomic
from race.core.engines import DECODE_DEFAULT
from race.core.specs import EvalSpec, RewardSpec
from race.data.task import Record, load_jsonl
from race.evaluation.feedback_models import FeedbackModels
from race.evaluation.snapshot import load_snapshot, rung_info
from race.evaluation.targets import Evaluator, add_flops, flops_json
from race.policy.device import prepare_device

EVAL_FORMAT = "race-eval/1"


def _load_split(data_dir: str | Path, name: str) -> list[Record]:
    return load_jsonl(Path(data_dir) / f"{name}.jsonl")


def _resolve_prm(prm, spec: EvalSpec, results_dir: str | Path, device: str,
                 models: FeedbackModels, tokenizer):
    """(scorer or None, description). A string is loaded on ``device`` through ``models`` (the
    job's cache), probed against the policy's ``tokenizer`` as the native_reward model is, so
    that one instance can serve both."""
    prm = spec.prm if prm is None else prm
    if prm is None or "prm_bon" not in spec.targets:
        return None, None
    if isinstance(prm, str | Path):
        return models.load(str(prm), str(results_dir), policy_tokenizer=tokenizer,
                           device=device), str(prm)
    return prm, getattr(prm, "name", type(prm).__name__)


def _resolve_reward(reward, spec: EvalSpec, tokenizer, results_dir: str | Path, device: str,
                    models: FeedbackModels):
    if reward is None or "native_reward" not in spec.targets:
        return None, None
    if isinstance(reward, RewardSpec):
        reward = reward.to_dict()
    if isinstance(reward, dict):
        from race.feedback.rewards import build_reward

        # Its feedback model computes beside the policy unless the entry names a device.
        return build_reward({"device": device, **reward}, tokenizer=tokenizer,
                            results_dir=str(results_dir),
                            load=models.load), reward
    return reward, getattr(reward, "__name__", type(reward).__name__)


def evaluate(policy: str | Path, data_dir: str | Path, out: str | Path | None = None,
             spec: EvalSpec | None = None, *, adapter: str | Path | None = None,
             reward: RewardSpec | dict | Callable | None = None,
             prm: str | Path | Any | None = None,
             results_dir: str | Path = "results", dtype: str = "float32",
             device: str = "auto", feedback_models: FeedbackModels | None = None,
             engine: str | None = None) -> dict:
    """Evaluate one snapshot on every target of ``spec``; returns (and writes to ``out``) the
    ``eval.json`` payload.

    ``reward``: a ``rewards:`` entry (dict, built with race.feedback.rewards.build_reward) or a
    reward object; ``prm``: a PRM ladder name (``results_dir/prm/size~NAME``), a path or hub id
    (loaded as race.feedback.loading.load_prm loads it), or a scorer object; ``None`` falls back to
    ``spec.prm``. ``dtype``: the weights' dtype (``training.dtype``); ``device``: the
    config's ``device`` (:mod:`race.policy.device`), for the policy and its feedback models.
    ``feedback_models``: the job's cache of loaded feedback models (:class:`FeedbackModels`),
    shared by every snapshot of a job; None: one for this call, where ``prm`` and ``reward``
    naming the same model with the same options still share one instance. ``engine``: the
    rollout engine that decodes (race.core.engines; the job's), None: ``spec.engine``, else
    :data:`race.core.engines.DECODE_DEFAULT`; the adapter is merged (or not) on ``device`` by
    ``spec.merge_adapter`` whatever the engine.
    """
    t0 = time.perf_counter()
    spec = spec or EvalSpec()
    engine = engine or spec.engine or DECODE_DEFAULT
    rung = rung_info(adapter)  # before any compute: a damaged ledger fails here, by name
    device = prepare_device(device, dtype)
    # Read only the splits the targets use (an in-distribution-only data folder is enough).
    eval_in = _load_split(data_dir, "eval_in") if set(spec.targets) - {"ood_pass1"} else []
    eval_ood = _load_split(data_dir, "eval_ood") if "ood_pass1" in spec.targets else []
    snap = load_snapshot(policy, adapter, merge=spec.merge_adapter,
                         attn_implementation=spec.attn_implementation, dtype=dtype,
                         device=device)
    models = feedback_models or FeedbackModels()
    scorer, prm_name = _resolve_prm(prm, spec, results_dir, device, models, snap.tokenizer)
    reward_fn, reward_desc = _resolve_reward(reward, spec, snap.tokenizer, results_dir, device,
                                             models)
    evaluator = Evaluator(snap, eval_in, eval_ood, spec, prm=scorer, reward=reward_fn,
                          engine=engine)
    results = evaluator.run()
    payload = {
        "format": EVAL_FORMAT,
        "phase": "eval",  # kept apart from the training budget (race.flops.ledger.BUDGET_PHASES)
        "policy": snap.policy,
        "adapter": snap.adapter,
        "adapter_merged": snap.merged,
        "lora_flops_charged": snap.lora is not None,
        "rung": rung,
        "settings": {**asdict(spec), "targets": list(spec.targets), "engine": engine,
                     "prm": prm_name,
                     "reward": reward_desc, "sample_sharing": _sharing_note(spec)},
        "targets": {t: r.to_json() for t, r in results.items()},
        "charged_total": flops_json(add_flops(*(r.flops for r in results.values()))),
        "executed_total": flops_json(evaluator.executed_total),
        "wall_s": 0.0,
    }
    payload["wall_s"] = round(time.perf_counter() - t0, 4)
    if out is not None:
        write_json_atomic(out, payload)
    return payload


def _sharing_note(spec: EvalSpec) -> str:
    if not spec.share_samples:
        return ("maj_k, prm_bon and native_reward draw their own samples; each ledger is what "
                "it ran")
    return ("maj_k and prm_bon share one pool of max(k, bon_n) samples per prompt, and "
            "native_reward uses the head of sampled_pass1's pool; each target is charged the "
            "generation of its own samples as if run alone (plus scoring for prm_bon and "
            "native_reward); executed_total counts each pool once")


def run_evaluation(job):
    """``race evaluate``: every snapshot of a :class:`race.core.jobs.EvalJob` (each on its own
    targets when the snapshot names them), one after the other in this process (the policy is
    reloaded per snapshot: merging an adapter changes its weights; each feedback model is
    loaded once, on the first snapshot that uses it, and kept for the others). Yields
    ``(eval.json path, payload)`` as each is written; with live MLflow the metrics also go to
    the cell's run at the rung's training step."""
    from race.study.inputs import check_adapter_dir

    # Every adapter before the first snapshot is evaluated: a bad one fails the job before it
    # writes anything, so no good eval.json of this job is written only to be deleted.
    for snapshot in job.snapshots:
        if snapshot.adapter is not None:
            check_adapter_dir(snapshot.adapter)
    models = FeedbackModels()
    for snapshot in job.snapshots:
        spec = job.spec if snapshot.targets is None else job.spec.with_overrides(
            targets=tuple(snapshot.targets))
        payload = evaluate(job.policy, job.data_dir, snapshot.out, spec,
                           adapter=snapshot.adapter, reward=job.reward, prm=job.prm,
                           results_dir=job.results_dir, dtype=job.dtype, device=job.device,
                           feedback_models=models, engine=job.engine)
        if job.mlflow is not None and job.mlflow.enabled and snapshot.adapter is not None:
            from race.tracking.eval_metrics import log_to_mlflow

            log_to_mlflow(payload, job.run_dir, job.mlflow, study=job.study)
        yield snapshot.out, payload
