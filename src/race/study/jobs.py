"""Typed jobs: everything one model verb needs, built from (config, cell, rung) by one function
per verb, and passed to ``race <verb> --job JSON``.

=============  ===================  ==========================================================
verb           job                  built by
=============  ===================  ==========================================================
``pretrain``   :class:`PretrainJob`  :func:`pretrain_job` (config, ladder size)
``prm``        :class:`PrmJob`       :func:`prm_job` (config, PRM ladder size)
``train``      :class:`TrainJob`     :func:`train_job` (config, cell)
``evaluate``   :class:`EvalJob`      :func:`eval_job` (config, cell[, budget]) and
                                     :func:`base_eval_job` (config, ladder size)
=============  ===================  ==========================================================

The Snakemake rules call these builders and hand the JSON to the verb; a human running
``race <verb> --config FILE --cell KEY [--budget B]`` goes through the same builder
(:func:`job_for_cell`), so both get the identical job. A job is plain data (JSON round trip
with :func:`to_json` / :func:`from_json`); building one imports no model code, so the
Snakemake process stays light.

Every job carries ``device`` (the config's ``device``: auto, cpu or cuda, resolved where the
job runs by :mod:`race.policy.device`). Train and evaluate jobs carry ``dtype``
(``training.dtype``: the dtype the policy is loaded and computed in; base-policy and PRM
training stay float32). Threads are not part of a job:
the rule passes the threads Snakemake gave it (``resources.<rule>.threads``, capped by
``--cores``) as ``--threads``, so changing them reruns nothing. A job's run options
(:data:`RUN_OPTIONS`: live MLflow logging, checkpoint cadence) are passed apart for the same
reason.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace

from race.data.teacher import TeacherSpec
from race.study import cells as C
from race.study.schema import default
from race.study.specs import (
    SEARCH_TARGETS,
    Allocation,
    EvalSpec,
    MlflowSpec,
    PretrainSpec,
    PRMSpec,
    allocation,
    eval_prm,
    mlflow_live,
    mlflow_spec,
    reward_spec,
)


def _training(key: str):
    return field(default=default("training", key))


@dataclass
class TrainJob:
    """One metered GRPO run of a cell (see race.grpo.run)."""

    base: str  # base policy directory (ladder, after race pretrain) or hub id / path
    train_data: str  # JSONL of prompt / answer records
    run_dir: str
    rungs: list[float]  # increasing budgets in model FLOPs; the last is the run's budget
    alloc: Allocation = field(default_factory=Allocation)
    reward: dict = field(default_factory=lambda: {"type": "rule"})
    seed: int = 0
    run_key: str = ""
    study: str = "race"
    # Run options (RUN_OPTIONS): how the job runs, not what it computes.
    mlflow: MlflowSpec | None = None  # live logging from the training job; None: files only
    save_every: int = _training("save_every")  # steps between checkpoints (for resuming)
    attn_implementation: str = _training("attn_implementation")
    gradient_checkpointing: bool = _training("gradient_checkpointing")
    dtype: str = _training("dtype")
    device: str = default("device")
    results_dir: str = default("results_dir")
    tags: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.rungs:
            raise ValueError("rungs: at least one budget is needed")
        if any(b <= a for a, b in zip(self.rungs, self.rungs[1:], strict=False)):
            raise ValueError(f"rungs must be strictly increasing, got {self.rungs}")
        if self.rungs[0] <= 0:
            raise ValueError("rungs must be positive")

    @property
    def budget(self) -> float:
        return self.rungs[-1]

    def params(self) -> dict:
        out = {f"alloc.{k}": v for k, v in asdict(self.alloc).items()}
        out["alloc.lora_alpha"] = self.alloc.alpha  # the effective alpha (default: 2 x rank)
        out.update({f"reward.{k}": v for k, v in self.reward.items()})
        out.update(base=self.base, seed=self.seed, budget=self.budget, rungs=self.rungs,
                   attn_implementation=self.attn_implementation,
                   gradient_checkpointing=self.gradient_checkpointing)
        return out


@dataclass
class Snapshot:
    """One policy snapshot to evaluate: a rung folder's adapter (None: the base policy) and the
    eval.json it gets."""

    adapter: str | None
    out: str
    targets: list[str] | None = None  # None: every target of the job's spec


@dataclass
class EvalJob:
    """Every target of every snapshot of one cell (or one base policy), in one process."""

    policy: str  # base policy directory or hub id
    data_dir: str  # folder with eval_in.jsonl / eval_ood.jsonl
    snapshots: list[Snapshot]
    spec: EvalSpec = field(default_factory=EvalSpec)
    reward: dict | None = None  # the cell's rewards: entry (native_reward)
    prm: str | None = None  # PRM of prm_bon (directory or hub id); None: spec.prm
    results_dir: str = default("results_dir")
    dtype: str = _training("dtype")
    device: str = default("device")
    # Set by hand to log eval/<target> to a run's MLflow run as each snapshot is evaluated;
    # the workflow leaves it None (its mlflow_log job adds every evaluation).
    mlflow: MlflowSpec | None = None
    run_dir: str | None = None  # the cell's run folder (its mlflow_run_id)
    study: str = "race"


@dataclass
class PretrainJob:
    """SFT of one ladder size into a base policy (see race.policy.pretrain)."""

    size: str
    data_dir: str
    tokenizer_dir: str
    out_dir: str
    spec: PretrainSpec = field(default_factory=PretrainSpec)
    teacher: TeacherSpec = field(default_factory=TeacherSpec)
    max_value: int = default("task", "max_value")  # the teacher's slips stay in [0, max_value]
    device: str = default("device")


@dataclass
class PrmJob:
    """Training of one PRM of the feedback ladder (see race.feedback.prm_training)."""

    size: str
    policies: list[str]  # base policy directories whose samples become the training data
    data_dir: str
    out_dir: str
    spec: PRMSpec = field(default_factory=PRMSpec)
    device: str = default("device")


JOBS = {"train": TrainJob, "evaluate": EvalJob, "pretrain": PretrainJob, "prm": PrmJob}
#: Fields of a verb's job that say how it runs, not what it computes: where a training job logs
#: live and how often it checkpoints. A Snakemake rule reruns its job when its params change,
#: so the rules keep these out of the job JSON in their params (:func:`params_json`) and pass
#: them apart (``--run-options``, :func:`run_options_json`): pointing live logging at a
#: tracking server or checkpointing more often reruns nothing. They are the same for every
#: cell of a study.
RUN_OPTIONS = {"train": ("mlflow", "save_every")}
_SPECS = {EvalJob: EvalSpec, PretrainJob: PretrainSpec, PrmJob: PRMSpec}


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


# --------------------------------------------------------------------------- JSON


def to_json(job, without: tuple[str, ...] = ()) -> str:
    """The job as JSON (what ``race <verb> --job`` reads), less the fields ``without``."""
    payload = {name: getattr(job, name) for name in _field_names(type(job))
               if name not in without}
    return json.dumps(payload, sort_keys=True, default=_as_dict)


def params_json(verb: str, job) -> str:
    """The job JSON of a Snakemake rule's params: :func:`to_json` less the verb's
    :data:`RUN_OPTIONS`, which the rule passes as :func:`run_options_json`."""
    return to_json(job, without=RUN_OPTIONS.get(verb, ()))


def run_options_json(verb: str, config: dict) -> str:
    """The verb's :data:`RUN_OPTIONS` from the config, as ``--run-options`` JSON."""
    options = train_run_options(config) if verb == "train" else {}
    return json.dumps(options, sort_keys=True, default=_as_dict)


def with_run_options(verb: str, job, text: str):
    """``job`` with the run options of ``--run-options`` JSON (:data:`RUN_OPTIONS` only)."""
    payload = json.loads(text)
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - set(RUN_OPTIONS.get(verb, ())))
    if unknown:
        raise ValueError(f"not a run option of race {verb}: {unknown} "
                         f"(run options: {list(RUN_OPTIONS.get(verb, ())) or 'none'})")
    return replace(job, **_typed(type(job), payload))


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _as_dict(value):
    """``json.dumps``'s hook for what it cannot encode: a nested dataclass becomes the dict of
    its fields, uncopied (what ``dataclasses.asdict`` gives, without its deep copy), and the C
    encoder walks the rest. The rules build one job per cell in the Snakemake process, where
    this is most of a job's cost on a large grid (bench/dag_scale.py)."""
    if is_dataclass(value):
        return {name: getattr(value, name) for name in _field_names(type(value))}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def from_json(cls, text: str):
    """Inverse of :func:`to_json` for a job class of :data:`JOBS`."""
    payload = json.loads(text)
    unknown = sorted(set(payload) - set(_field_names(cls)))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}")
    return cls(**_typed(cls, payload))


def _typed(cls, payload: dict) -> dict:
    """``payload`` (fields of job class ``cls`` read from JSON) with its nested specs rebuilt
    as their dataclasses."""
    if isinstance(payload.get("alloc"), dict):
        payload["alloc"] = Allocation(**payload["alloc"])
    if isinstance(payload.get("mlflow"), dict):
        payload["mlflow"] = MlflowSpec(**payload["mlflow"])
    if isinstance(payload.get("spec"), dict):
        payload["spec"] = _SPECS[cls](**payload["spec"])
    if isinstance(payload.get("teacher"), dict):
        payload["teacher"] = TeacherSpec(**payload["teacher"])
    if "snapshots" in payload:
        payload["snapshots"] = [Snapshot(**s) for s in payload["snapshots"]]
    return payload
