"""Typed jobs: everything one model verb needs, as plain data with a JSON round trip.

``race <verb> --job JSON`` reads one of :data:`JOBS`; :mod:`race.study.builders` builds it from
(study, cell, rung), the same builder for the Snakemake rule and for a person running
``race <verb> --config FILE --cell KEY``. Building or encoding a job imports no model code, so
the Snakemake process stays light.

Every job carries ``device`` (the config's ``device``: auto, cpu or cuda, resolved where the
job runs by :mod:`race.policy.device`). Train and evaluate jobs carry ``dtype``
(``training.dtype``: the dtype the policy is loaded and computed in; base-policy and PRM
training stay float32). Threads are not part of a job: the rule passes the threads Snakemake
gave it (``resources.<rule>.threads``, capped by ``--cores``) as ``--threads``, so changing
them reruns nothing. A job's run options (:data:`RUN_OPTIONS`: live MLflow logging,
checkpoint cadence, the step limit ``race train`` checks its budget against) are passed apart
for the same reason.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, replace

from race.core.engines import DECODE_DEFAULT
from race.core.schema import default
from race.core.specs import (
    Allocation,
    EvalSpec,
    MlflowSpec,
    PretrainSpec,
    PRMSpec,
    RewardSpec,
    TeacherSpec,
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
    reward: RewardSpec = field(default_factory=RewardSpec)
    seed: int = 0
    run_key: str = ""
    study: str = "race"
    # Run options (RUN_OPTIONS): how the job runs, not what it computes.
    mlflow: MlflowSpec | None = None  # live logging from the training job; None: files only
    save_every: int = _training("save_every")  # steps between checkpoints (for resuming)
    max_steps_per_run: int | None = None  # the step limit (None: race.study.plan's default)
    attn_implementation: str = _training("attn_implementation")
    gradient_checkpointing: bool = _training("gradient_checkpointing")
    dtype: str = _training("dtype")
    micro_batch_rows: int | None = None  # None: one micro-batch
    rollout_engine: str = _training("rollout_engine")  # race.core.engines
    device: str = default("device")
    results_dir: str = default("results_dir")
    tags: dict = field(default_factory=dict)
    # hub id -> revision, for the hub ids it loads (base, the reward's model): see
    # race.core.references. Left out of the JSON while empty (OMIT_DEFAULT).
    revisions: dict[str, str] = field(default_factory=dict)

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
        out.update({f"reward.{k}": v for k, v in self.reward.to_dict().items()})
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
    reward: RewardSpec | None = None  # the cell's rewards: entry (native_reward)
    prm: str | None = None  # PRM of prm_bon (directory or hub id); None: spec.prm
    results_dir: str = default("results_dir")
    dtype: str = _training("dtype")
    device: str = default("device")
    # Set by hand to log eval/<target> to a run's MLflow run as each snapshot is evaluated;
    # the workflow leaves it None (its mlflow_log job adds every evaluation).
    mlflow: MlflowSpec | None = None
    run_dir: str | None = None  # the cell's run folder (its mlflow_run_id)
    study: str = "race"
    # hub id -> revision, for the hub ids it loads (policy, reward model, PRM): see
    # race.core.references. Left out of the JSON while empty (OMIT_DEFAULT).
    revisions: dict[str, str] = field(default_factory=dict)
    # How it decodes (race.core.engines): the builder's eval.engine, else the training
    # engine; left out of the JSON while DECODE_DEFAULT (OMIT_DEFAULT).
    engine: str = DECODE_DEFAULT


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
    samples: str = ""  # a race prm-samples folder to train on; "": sample the policies here


@dataclass
class PrmSamplesJob:
    """The base policies' samples every PRM of the ladder learns from, drawn once
    (race.feedback.prm_sampling): the sampling keys of ``prm:``, nothing a PRM's training
    reads, so changing how a PRM trains draws no new samples."""

    policies: list[str]
    data_dir: str
    out_dir: str
    n_prompts: int = default("prm", "n_prompts")
    samples_per_prompt: int = default("prm", "samples_per_prompt")
    temperature: float = default("prm", "temperature")
    max_new_tokens: int = default("prm", "max_new_tokens")
    sample_batch_size: int = default("prm", "sample_batch_size")
    seed: int = default("prm", "seed")
    device: str = default("device")
    # How the policies decode (race.core.engines), as an EvalJob's engine (OMIT_DEFAULT).
    engine: str = DECODE_DEFAULT


JOBS = {"train": TrainJob, "evaluate": EvalJob, "pretrain": PretrainJob, "prm": PrmJob,
        "prm-samples": PrmSamplesJob}
#: Verbs whose job is the study's alone: ``race <verb> --config FILE`` takes no ``--cell``.
CELL_FREE = ("prm-samples",)
#: Fields of a verb's job that say how it runs, not what it computes: where a training job logs
#: live and how often it checkpoints. A Snakemake rule reruns its job when its params change,
#: so the rules keep these out of the job JSON in their params (:func:`params_json`) and pass
#: them apart (``--run-options``, :func:`run_options_json`): pointing live logging at a
#: tracking server or checkpointing more often reruns nothing. They are the same for every
#: cell of a study.
RUN_OPTIONS = {"train": ("mlflow", "save_every", "max_steps_per_run")}
_SPECS = {EvalJob: EvalSpec, PretrainJob: PretrainSpec, PrmJob: PRMSpec}
#: Fields a job's JSON (and a spec's inside it) leaves out while they hold their default
#: (:func:`from_json` restores it): a job that pins no hub revision, cuts no micro-batches,
#: generates with the default engine (or, evaluating, decodes as jobs did before engines
#: were configurable) keeps the JSON, hence the Snakemake params (no rerun of an existing
#: study) and the run fingerprint, it had before those fields existed.
OMIT_DEFAULT = ("revisions", "micro_batch_rows", "rollout_engine", "samples", "engine")


# --------------------------------------------------------------------------- JSON


def to_json(job, without: tuple[str, ...] = ()) -> str:
    """The job as JSON (what ``race <verb> --job`` reads), less the fields ``without`` and
    those of :data:`OMIT_DEFAULT` at their default."""
    payload = {name: getattr(job, name) for name in _field_names(type(job))
               if name not in without and not omitted(job, name)}
    return json.dumps(payload, sort_keys=True, default=as_dict)


def omitted(obj, name: str) -> bool:
    """Whether field ``name`` of the job or spec ``obj`` stays out of its JSON: one of
    :data:`OMIT_DEFAULT` holding its default."""
    defaults = _defaults(type(obj))
    return name in defaults and getattr(obj, name) == defaults[name]


@functools.cache
def _defaults(cls) -> dict:
    """The defaults of ``cls``'s fields named in :data:`OMIT_DEFAULT`."""
    return {f.name: f.default if f.default is not MISSING else f.default_factory()
            for f in fields(cls) if f.name in OMIT_DEFAULT}


def params_json(verb: str, job) -> str:
    """The job JSON of a Snakemake rule's params: :func:`to_json` less the verb's
    :data:`RUN_OPTIONS`, which the rule passes as :func:`run_options_json`."""
    return to_json(job, without=RUN_OPTIONS.get(verb, ()))


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


def as_dict(value):
    """``json.dumps``'s hook for what it cannot encode: a nested dataclass becomes the dict of
    its fields, uncopied (what ``dataclasses.asdict`` gives, without its deep copy), and the C
    encoder walks the rest. The rules build one job per cell in the Snakemake process, where
    this is most of a job's cost on a large grid (bench/performance/dag_scale.py)."""
    if isinstance(value, RewardSpec):
        return value.to_dict()
    if is_dataclass(value):
        return {name: getattr(value, name) for name in _field_names(type(value))
                if not omitted(value, name)}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def from_json(cls, text: str):
    """Inverse of :func:`to_json` for a job class of :data:`JOBS`. A number that is not finite
    (JSON's NaN and Infinity, or 1e400) is refused, naming its field."""
    payload = json.loads(text)
    if not isinstance(payload, dict):
        raise ValueError(f"{cls.__name__}: a job is a JSON object, not {type(payload).__name__}")
    if (where := _first_non_finite(payload)) is not None:
        raise ValueError(f"{where[0]}: {where[1]} is not a finite number")
    unknown = sorted(set(payload) - set(_field_names(cls)))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}")
    return cls(**_typed(cls, payload))


def _first_non_finite(value, where: str = "") -> tuple[str, float] | None:
    """(dotted field, value) of the first NaN or infinity in a parsed JSON value."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for key, item in items:
        name = f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)
        if (found := _first_non_finite(item, name)) is not None:
            return found
    return None


def _typed(cls, payload: dict) -> dict:
    """``payload`` (fields of job class ``cls`` read from JSON) with its nested specs rebuilt
    as their dataclasses."""
    if isinstance(payload.get("alloc"), dict):
        payload["alloc"] = Allocation(**payload["alloc"])
    if isinstance(payload.get("mlflow"), dict):
        payload["mlflow"] = MlflowSpec(**payload["mlflow"])
    if isinstance(payload.get("spec"), dict):
        payload["spec"] = _SPECS[cls](**payload["spec"])
    if isinstance(payload.get("reward"), dict):
        payload["reward"] = RewardSpec(**payload["reward"])
    if isinstance(payload.get("teacher"), dict):
        payload["teacher"] = TeacherSpec(**payload["teacher"])
    if "snapshots" in payload:
        payload["snapshots"] = [Snapshot(**s) for s in payload["snapshots"]]
    return payload
