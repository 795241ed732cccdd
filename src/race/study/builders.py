"""One builder per model verb: a typed job (:mod:`race.core.jobs`) from the study and a cell.

=============  ===================  ==========================================================
verb           job                  built by
=============  ===================  ==========================================================
``pretrain``   :class:`PretrainJob`  :func:`pretrain_job` (study, ladder size)
``prm-samples`` :class:`PrmSamplesJob` :func:`prm_samples_job` (study)
``prm``        :class:`PrmJob`       :func:`prm_job` (study, PRM ladder size)
``train``      :class:`TrainJob`     :func:`train_job` (study, cell)
``evaluate``   :class:`EvalJob`      :func:`eval_job` (study, cell[, budget]) and
                                     :func:`base_eval_job` (study, ladder size)
=============  ===================  ==========================================================

The Snakemake rules call these builders and hand the JSON to the verb; a human running
``race <verb> --config FILE --cell KEY [--budget B]`` goes through the same builder
(:func:`job_for_cell`), so both get the identical job.
"""

from __future__ import annotations

import json

from race.core.cells import Cell, format_budget, is_ladder, parse_key, rung_dir
from race.core.errors import ConfigError
from race.core.jobs import (
    CELL_FREE,
    EvalJob,
    PretrainJob,
    PrmJob,
    PrmSamplesJob,
    Snapshot,
    TrainJob,
    as_dict,
)
from race.core.specs import SEARCH_TARGETS
from race.core.study import Study
from race.feedback.prm_sampling import settings_of

# --------------------------------------------------------------------------- builders


def train_run_options(study: Study) -> dict:
    """A training job's :data:`RUN_OPTIONS` from the study."""
    return {
        # Live logging from the training job; otherwise the mlflow_log job mirrors the folder.
        "mlflow": study.mlflow if study.mlflow_live else None,
        "save_every": study.training.save_every,
        # Only when set: the options' JSON of a study without it stays as it was.
        **({"max_steps_per_run": study.max_steps_per_run}
           if study.max_steps_per_run is not None else {}),
    }


def train_job(study: Study, cell: Cell) -> TrainJob:
    t = study.training
    return TrainJob(
        base=study.base_dir(cell.size),
        train_data=str(study.results / "data" / "train.jsonl"),
        run_dir=str(study.run_dir(cell)),
        rungs=study.cell_rungs(cell),
        alloc=study.allocations[cell.alloc],
        reward=study.reward(cell.reward),
        seed=cell.seed,
        run_key=cell.key,
        study=study.name,
        **train_run_options(study),
        attn_implementation=t.attn_implementation,
        gradient_checkpointing=t.gradient_checkpointing,
        dtype=t.dtype,
        micro_batch_rows=t.micro_batch_rows,
        rollout_engine=t.rollout_engine,
        device=study.device,
        results_dir=str(study.results),
        tags={"size": cell.size, "reward": cell.reward, "alloc": cell.alloc,
              "seed": str(cell.seed)},
        revisions=study.revisions_of(cell.size, study.rewards[cell.reward].model),
    )


def _eval_job(study: Study, policy: str, snapshots: list[Snapshot], reward: str,
              temperature: float, run_dir: str | None) -> EvalJob:
    prm = study.eval_prm
    return EvalJob(
        policy=policy,
        data_dir=str(study.results / "data"),
        snapshots=snapshots,
        # native_reward is measured at the temperature the cell trained with.
        spec=study.eval.with_overrides(train_temperature=temperature),
        reward=study.reward(reward),
        prm=study.prm_dir(prm) if prm else None,
        results_dir=str(study.results),
        dtype=study.training.dtype,
        device=study.device,
        run_dir=run_dir,
        study=study.name,
        revisions=study.revisions_of(policy, study.rewards[reward].model, prm),
        engine=decode_engine(study),
    )


def decode_engine(study: Study) -> str:
    """The rollout engine that evaluation, base-policy evaluation and PRM sampling decode
    with: ``eval.engine``, else ``training.rollout_engine`` (race.core.engines)."""
    return study.eval.engine or study.training.rollout_engine


def eval_job(study: Study, cell: Cell, budget: float | None = None) -> EvalJob:
    """Every evaluated rung of a cell (:meth:`race.core.study.Study.evaluated_rungs`), or
    only ``budget``."""
    rungs = evaluated = study.evaluated_rungs(cell)
    if budget is not None:
        if float(budget) not in rungs:
            raise ConfigError(f"--budget {budget:g}: not an evaluated rung of {cell.key} "
                              f"({', '.join(format_budget(b) for b in rungs)})")
        rungs = [float(budget)]
    run = study.run_dir(cell)
    top = max(evaluated)
    # Below the top rung, eval.search_at: base_and_top leaves out maj_k and prm_bon.
    below_top = ([t for t in study.eval.targets if t not in SEARCH_TARGETS]
                 if study.search_only_at_top else None)
    snapshots = [Snapshot(str(folder), str(folder / "eval.json"),
                          None if float(b) == float(top) else below_top)
                 for b in rungs for folder in [rung_dir(run, b)]]
    return _eval_job(study, study.base_dir(cell.size), snapshots, cell.reward,
                     study.allocations[cell.alloc].temperature, str(run))


def base_eval_job(study: Study, size: str) -> EvalJob:
    """A base policy (ladder, hub id or folder): the budget-0 point of its curves, its native
    reward under :attr:`race.core.study.Study.base_reward` at the shared training
    temperature."""
    return _eval_job(study, study.base_dir(size), [Snapshot(None, str(study.base_eval(size)))],
                     study.base_reward, study.training.temperature, None)


def pretrain_job(study: Study, size: str) -> PretrainJob:
    return PretrainJob(size=size, data_dir=str(study.results / "data"),
                       tokenizer_dir=str(study.results / "tokenizer"),
                       out_dir=study.base_dir(size), spec=study.pretrain,
                       teacher=study.teacher, max_value=study.task.max_value,
                       device=study.device)


def prm_samples_job(study: Study) -> PrmSamplesJob:
    """The one sampling of the base policies that every PRM of the study learns from."""
    return PrmSamplesJob(policies=_ladder_policies(study), data_dir=str(study.results / "data"),
                         out_dir=study.prm_samples_dir(), **settings_of(study.prm),
                         device=study.device, engine=decode_engine(study))


def prm_job(study: Study, size: str) -> PrmJob:
    return PrmJob(size=size, policies=_ladder_policies(study),
                  data_dir=str(study.results / "data"), out_dir=study.prm_dir(size),
                  spec=study.prm, device=study.device, samples=study.prm_samples_dir())


def _ladder_policies(study: Study) -> list[str]:
    return [study.base_dir(s) for s in study.sizes if is_ladder(s)]


def _ladder_size(key: str, sizes: tuple[str, ...], what: str) -> str:
    parts = parse_key(key)
    size = parts.get("size")
    if set(parts) != {"size"} or size not in sizes or not is_ladder(size):
        raise ConfigError(f"--cell {key!r}: expected size~NAME with NAME a ladder {what} of "
                          f"the config ({', '.join(s for s in sizes if is_ladder(s))})")
    return size


def job_for_cell(verb: str, study: Study, key: str | None, budget: float | None = None):
    """The job of ``race <verb> --config FILE --cell KEY``: a grid or validation cell
    (``size~S/reward~R/alloc~A/seed~N``) for train and evaluate, a ladder size (``size~S``)
    for pretrain, prm and a base policy's evaluation, no cell for prm-samples (``key``
    None)."""
    if budget is not None and verb != "evaluate":
        raise ConfigError(f"--budget applies to evaluate only, not {verb}")
    if verb in CELL_FREE:
        return prm_samples_job(study)
    if verb == "pretrain":
        return pretrain_job(study, _ladder_size(key, study.sizes, "size"))
    if verb == "prm":
        return prm_job(study, _ladder_size(key, study.prm_sizes, "PRM size"))
    if verb == "evaluate" and "/" not in key.strip("/"):
        if budget is not None:
            raise ConfigError("--budget: a base policy has no budget rungs")
        return base_eval_job(study, _ladder_size(key, study.sizes, "size"))
    cell = study.parse_cell(key)
    return train_job(study, cell) if verb == "train" else eval_job(study, cell, budget)


def run_options_json(verb: str, study: Study) -> str:
    """The verb's :data:`RUN_OPTIONS` from the study, as ``--run-options`` JSON."""
    options = train_run_options(study) if verb == "train" else {}
    return json.dumps(options, sort_keys=True, default=as_dict)
