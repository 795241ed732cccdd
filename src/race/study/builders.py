"""One builder per model verb: a typed job (:mod:`race.core.jobs`) from the study and a cell.

=============  ===================  ==========================================================
verb           job                  built by
=============  ===================  ==========================================================
``pretrain``   :class:`PretrainJob`  :func:`pretrain_job` (study, ladder size)
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

from race.core import cells as C
from race.core.jobs import (
    EvalJob,
    PretrainJob,
    PrmJob,
    Snapshot,
    TrainJob,
    as_dict,
)
from race.core.specs import (
    SEARCH_TARGETS,
    EvalSpec,
    PretrainSpec,
    PRMSpec,
    TeacherSpec,
    allocation,
    eval_prm,
    mlflow_live,
    mlflow_spec,
    reward_spec,
)

# --------------------------------------------------------------------------- builders


def train_run_options(config: dict) -> dict:
    """A training job's :data:`RUN_OPTIONS` from the config."""
    return {
        # Live logging from the training job; otherwise the mlflow_log job mirrors the folder.
        "mlflow": mlflow_spec(config) if mlflow_live(config) else None,
        "save_every": config["training"]["save_every"],
    }


def train_job(config: dict, cell: C.Cell) -> TrainJob:
    t = config["training"]
    return TrainJob(
        base=C.base_dir(config, cell.size),
        train_data=str(C.results(config) / "data" / "train.jsonl"),
        run_dir=str(C.run_dir(config, cell)),
        rungs=C.cell_rungs(config, cell),
        alloc=allocation(config, cell.alloc),
        reward=reward_spec(config, cell.reward),
        seed=cell.seed,
        run_key=cell.key,
        study=config["study"],
        **train_run_options(config),
        attn_implementation=t["attn_implementation"],
        gradient_checkpointing=t["gradient_checkpointing"],
        dtype=t["dtype"],
        device=config["device"],
        results_dir=str(C.results(config)),
        tags={"size": cell.size, "reward": cell.reward, "alloc": cell.alloc,
              "seed": str(cell.seed)},
    )


def _eval_job(config: dict, policy: str, snapshots: list[Snapshot], reward: str,
              temperature: float, run_dir: str | None, spec: EvalSpec | None = None) -> EvalJob:
    prm = eval_prm(config)
    spec = spec or EvalSpec.from_config(config["eval"])
    return EvalJob(
        policy=policy,
        data_dir=str(C.results(config) / "data"),
        snapshots=snapshots,
        # native_reward is measured at the temperature the cell trained with.
        spec=spec.with_overrides(train_temperature=temperature),
        reward=reward_spec(config, reward),
        prm=C.prm_dir(config, prm) if prm else None,
        results_dir=str(C.results(config)),
        dtype=config["training"]["dtype"],
        device=config["device"],
        run_dir=run_dir,
        study=config["study"],
    )


def eval_job(config: dict, cell: C.Cell, budget: float | None = None) -> EvalJob:
    """Every evaluated rung of a cell (:func:`race.study.cells.evaluated_rungs`), or only
    ``budget``."""
    rungs = evaluated = C.evaluated_rungs(config, cell)
    if budget is not None:
        if float(budget) not in rungs:
            raise C.ConfigError(f"--budget {budget:g}: not an evaluated rung of {cell.key} "
                                f"({', '.join(C.format_budget(b) for b in rungs)})")
        rungs = [float(budget)]
    run = C.run_dir(config, cell)
    top = max(evaluated)
    spec = EvalSpec.from_config(config["eval"])
    # Below the top rung, eval.search_at: base_and_top leaves out maj_k and prm_bon.
    below_top = ([t for t in spec.targets if t not in SEARCH_TARGETS]
                 if spec.search_at == "base_and_top" else None)
    snapshots = [Snapshot(str(folder), str(folder / "eval.json"),
                          None if float(b) == float(top) else below_top)
                 for b in rungs for folder in [C.rung_dir(run, b)]]
    return _eval_job(config, C.base_dir(config, cell.size), snapshots, cell.reward,
                     allocation(config, cell.alloc).temperature, str(run), spec)


def base_reward(config: dict) -> str:
    """The reward a base policy's native_reward is measured under: the first reward system
    (the other systems' base rows leave it empty rather than show another reward's number)."""
    return next(iter(config["rewards"]))


def base_eval_job(config: dict, size: str) -> EvalJob:
    """A ladder base policy: the budget-0 point of its curves, its native reward under
    :func:`base_reward` at the shared training temperature."""
    base = C.base_dir(config, size)
    return _eval_job(config, base, [Snapshot(None, f"{base}/eval.json")], base_reward(config),
                     config["training"]["temperature"], None)


def pretrain_job(config: dict, size: str) -> PretrainJob:
    results = C.results(config)
    return PretrainJob(size=size, data_dir=str(results / "data"),
                       tokenizer_dir=str(results / "tokenizer"),
                       out_dir=C.base_dir(config, size),
                       spec=PretrainSpec.from_config(config["pretrain"]),
                       teacher=TeacherSpec.from_config(config.get("teacher")),
                       max_value=config["task"]["max_value"], device=config["device"])


def prm_job(config: dict, size: str) -> PrmJob:
    ladder = [s for s in config["sizes"] if C.is_ladder(s)]
    return PrmJob(size=size, policies=[C.base_dir(config, s) for s in ladder],
                  data_dir=str(C.results(config) / "data"), out_dir=C.prm_dir(config, size),
                  spec=PRMSpec.from_config(config["prm"]), device=config["device"])


def _ladder_size(key: str, sizes: list[str], what: str) -> str:
    parts = C.parse_key(key)
    size = parts.get("size")
    if set(parts) != {"size"} or size not in sizes or not C.is_ladder(size):
        raise C.ConfigError(f"--cell {key!r}: expected size~NAME with NAME a ladder {what} of "
                            f"the config ({', '.join(s for s in sizes if C.is_ladder(s))})")
    return size


def job_for_cell(verb: str, config: dict, key: str, budget: float | None = None):
    """The job of ``race <verb> --config FILE --cell KEY``: a grid or validation cell
    (``size~S/reward~R/alloc~A/seed~N``) for train and evaluate, a ladder size (``size~S``)
    for pretrain, prm and a base policy's evaluation."""
    if budget is not None and verb != "evaluate":
        raise C.ConfigError(f"--budget applies to evaluate only, not {verb}")
    if verb == "pretrain":
        return pretrain_job(config, _ladder_size(key, config["sizes"], "size"))
    if verb == "prm":
        return prm_job(config, _ladder_size(key, config["prm"]["sizes"], "PRM size"))
    if verb == "evaluate" and "/" not in key.strip("/"):
        if budget is not None:
            raise C.ConfigError("--budget: a base policy has no budget rungs")
        return base_eval_job(config, _ladder_size(key, config["sizes"], "size"))
    cell = C.parse_cell(key, config)
    return train_job(config, cell) if verb == "train" else eval_job(config, cell, budget)




def run_options_json(verb: str, config: dict) -> str:
    """The verb's :data:`RUN_OPTIONS` from the config, as ``--run-options`` JSON."""
    options = train_run_options(config) if verb == "train" else {}
    return json.dumps(options, sort_keys=True, default=as_dict)
