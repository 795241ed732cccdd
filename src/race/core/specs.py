"""Typed sections of the study config: defaults, types, ranges and enums from the schema.

Each dataclass here is one config section as a stage reads it: :class:`TaskSpec` (the
arithmetic task's shape under ``task``), :class:`TeacherSpec`, :class:`Allocation`
(``allocations.<name>`` over ``training``), :class:`EvalSpec`, :class:`PretrainSpec`,
:class:`PRMSpec`, :class:`RewardSpec` (one ``rewards:`` entry) and :class:`MlflowSpec`;
:class:`race.core.study.Study` holds them all. Field defaults come from ``config.schema.yaml``
(:func:`race.core.schema.default`), and every value a section is built with is checked
against the schema's type, range and enum (:func:`_check_against_schema`), so each of those
rules is written once, in the schema. The ``__post_init__`` methods hold only the rules
between keys. A section with a key the dataclass does not know is an error naming the key.

The lists every stage shares live here once, read off the schema's enums: :data:`TARGETS`
(evaluation targets, in report order), :data:`ALL_PROJECTIONS`, :data:`PRM_AGGREGATES`,
:data:`DEVICES`, :data:`ATTN_IMPLEMENTATIONS`; the
FLOP phases are :mod:`race.flops.ledger`'s, the rollout engines :mod:`race.core.engines`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from race.core.errors import ConfigError
from race.core.schema import check, default, properties, schema

#: Evaluation targets, in report order (``eval.targets`` names a subset; null means all).
TARGETS: tuple[str, ...] = tuple(properties("eval")["targets"]["items"]["enum"])
#: Test-time search targets: with ``eval.search_at: base_and_top`` they run only on the base
#: policy and each cell's top rung.
SEARCH_TARGETS: tuple[str, ...] = ("maj_k", "prm_bon")
#: How step scores become one score (race.feedback.scores.aggregate).
PRM_AGGREGATES: tuple[str, ...] = tuple(properties("eval")["prm_aggregate"]["enum"])
#: The values of the ``device`` key, and the attention kernels a model may run.
DEVICES: tuple[str, ...] = tuple(schema()["properties"]["device"]["enum"])
ATTN_IMPLEMENTATIONS: tuple[str, ...] = tuple(
    properties("training")["attn_implementation"]["enum"])
def _check_against_schema(spec, *sections: str) -> None:
    """Every field of ``spec`` that is a key of one of ``sections`` (the first that has it)
    against the schema (:func:`race.core.schema.check`); None is an optional key left unset."""
    for f in fields(spec):
        value = getattr(spec, f.name)
        section = next((s for s in sections if f.name in properties(s)), None)
        if section is not None and value is not None:
            check(section, f.name, value)


def _from_section(cls, section: dict | None, name: str):
    """``cls(**section)``; an unknown key is an error naming it (a typo must not silently fall
    back to a default)."""
    section = dict(section or {})
    known = [f.name for f in fields(cls)]
    for key in section:
        if key not in known:
            raise ConfigError(f"{name}.{key}: unknown key (known: {', '.join(known)})")
    try:
        return cls(**section)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class _Section:
    """A typed config section: every value checked against the schema of ``SECTIONS`` (a
    key's node in the first of them that has it), and :meth:`from_config` from the section's
    mapping, an unknown key an error naming it. A subclass with rules between its keys
    checks them after ``super().__post_init__()``."""

    SECTIONS: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_against_schema(self, *self.SECTIONS)

    @classmethod
    def from_config(cls, section: dict | None):
        return _from_section(cls, section, cls.SECTIONS[0])


# --------------------------------------------------------------------------- LoRA


#: The seven Qwen2 projections LoRA can adapt, in forward order within a decoder layer.
ALL_PROJECTIONS: tuple[str, ...] = tuple(properties("training")["lora_targets"]["items"]["enum"])


@dataclass(frozen=True)
class LoraSpec:
    """Unmerged LoRA adapters of rank ``rank`` on the named projections of every layer."""

    rank: int
    targets: tuple[str, ...] = field(default=ALL_PROJECTIONS)

    def __post_init__(self) -> None:
        targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
        check("allocations", "lora_rank", self.rank)
        check("training", "lora_targets", targets)
        object.__setattr__(self, "targets", targets)

    def adapts(self, name: str) -> bool:
        return name in self.targets


# --------------------------------------------------------------------------- task, teacher


@dataclass(frozen=True)
class TaskSpec(_Section):
    """Shape of the arithmetic task; every field is a config key under ``task:``."""

    SECTIONS = ("task",)

    seed: int = field(default=default("task", "seed"))
    max_operand: int = field(default=default("task", "max_operand"))
    max_value: int = field(default=default("task", "max_value"))
    min_steps: int = field(default=default("task", "min_steps"))
    max_steps: int = field(default=default("task", "max_steps"))
    ood_min_steps: int = field(default=default("task", "ood_min_steps"))
    ood_max_steps: int = field(default=default("task", "ood_max_steps"))
    n_train: int = field(default=default("task", "n_train"))
    n_eval_in: int = field(default=default("task", "n_eval_in"))
    n_eval_ood: int = field(default=default("task", "n_eval_ood"))

    def __post_init__(self):
        super().__post_init__()
        if self.min_steps > self.max_steps:
            raise ValueError("task.min_steps must be <= task.max_steps")
        if self.ood_min_steps <= self.max_steps:
            raise ValueError("task.ood_min_steps must exceed task.max_steps (OOD = longer chains)")
        if self.ood_max_steps < self.ood_min_steps:
            raise ValueError("task.ood_max_steps must be >= task.ood_min_steps")
        if self.max_value < self.max_operand:
            raise ValueError("task.max_operand must be <= task.max_value")
        if self.max_value < 2 * self.max_operand - 1:
            # sample_problem flips an operation that would leave [0, max_value]; the flipped
            # one stays inside only if max_value >= 2 * max_operand - 1.
            raise ValueError("task.max_value must be >= 2 * task.max_operand - 1 (an operation "
                             "flipped to stay in range must land in [0, max_value])")

    @classmethod
    def from_config(cls, task: dict) -> TaskSpec:
        """From the ``task:`` section (its source keys -- kind, file paths, hub ids -- are
        not the shape of the arithmetic task and are left out); ValueError names a bad key."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in task.items() if k in names})



#: The ``task:`` keys that say where a task's records come from (the rest are TaskSpec's).
SOURCE_KEYS = ("kind", "train_jsonl", "eval_in_jsonl", "eval_ood_jsonl", "hf_id", "hf_config",
               "hf_ood_id", "hf_ood_config", "hf_data_files", "max_prompt_tokens")


@dataclass(frozen=True)
class TaskSource(_Section):
    """Where the task's records come from (``task.kind``: the embedded arithmetic task, user
    JSONL files, or a ``datasets`` id; race.data.sources)."""

    SECTIONS = ("task",)

    kind: str = field(default=default("task", "kind"))
    train_jsonl: str | None = None
    eval_in_jsonl: str | None = None
    eval_ood_jsonl: str | None = None
    hf_id: str | None = None
    hf_config: str | None = None
    hf_ood_id: str | None = None
    hf_ood_config: str | None = None
    hf_data_files: dict | None = None  # {train, test}: files for a builder hf_id such as json
    max_prompt_tokens: int | None = None  # planning only: the longest prompt, policy tokens

    @classmethod
    def from_config(cls, task: dict) -> TaskSource:
        return cls(**{k: v for k, v in task.items() if k in SOURCE_KEYS})


def _teacher(key: str):
    return field(default=default("teacher", key))


@dataclass(frozen=True)
class TeacherSpec(_Section):
    """Config keys under ``teacher:``: per-step slip rates by family and the truncation rate."""

    SECTIONS = ("teacher",)

    noisy: bool = _teacher("noisy")  # false: the clean-teacher ablation (reference solutions)
    operand_slip: float = _teacher("operand_slip")
    sign_slip: float = _teacher("sign_slip")
    arithmetic_slip: float = _teacher("arithmetic_slip")
    truncate: float = _teacher("truncate")
    truncate_min_steps: int = _teacher("truncate_min_steps")

    def __post_init__(self):
        super().__post_init__()
        if self.operand_slip + self.sign_slip + self.arithmetic_slip > 1.0:
            raise ValueError("teacher: operand_slip + sign_slip + arithmetic_slip must be <= 1 "
                             "(at most one slip per step)")

    @classmethod
    def from_config(cls, section: dict | None) -> TeacherSpec:
        """The ``teacher:`` section; an unknown key or a bad rate is an error naming it."""
        try:
            return cls(**(section or {}))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"teacher: {exc}") from None

    def rate(self, family: str) -> float:
        return getattr(self, f"{family}_slip")



# --------------------------------------------------------------------------- training


def _train(key: str):
    return field(default=default("training", key))


def _alloc(key: str):
    return field(default=default("allocations", key))


@dataclass(frozen=True)
class TrainingSpec(_Section):
    """The ``training:`` section: what every allocation shares (and may override, see
    :class:`Allocation`) and how a training job computes (checkpoint cadence, attention
    kernel, gradient checkpointing, dtype)."""

    SECTIONS = ("training",)

    learning_rate: float = _train("learning_rate")
    warmup_steps: int = _train("warmup_steps")
    scale_rewards: str = _train("scale_rewards")
    loss_type: str = _train("loss_type")
    max_grad_norm: float = _train("max_grad_norm")
    beta: float = _train("beta")
    temperature: float = _train("temperature")
    lora_targets: tuple[str, ...] = _train("lora_targets")
    max_completion_length: int = _train("max_completion_length")
    save_every: int = _train("save_every")
    attn_implementation: str = _train("attn_implementation")
    gradient_checkpointing: bool = _train("gradient_checkpointing")
    dtype: str = _train("dtype")
    micro_batch_rows: int | None = None  # None (unset): the step's rows at once
    rollout_engine: str = _train("rollout_engine")  # race.core.engines

    def __post_init__(self):
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        super().__post_init__()


    def allocation(self, name: str, entry: dict) -> Allocation:
        """The named ``allocations:`` entry over this section: an allocation may override the
        learning rate, beta, temperature and completion cap; the rest is shared."""
        entry = dict(entry)
        for key in ("learning_rate", "beta", "temperature", "max_completion_length"):
            entry.setdefault(key, getattr(self, key))
        for key in ("lora_targets", "warmup_steps", "scale_rewards", "loss_type",
                    "max_grad_norm"):
            entry[key] = getattr(self, key)
        try:
            return Allocation(**entry)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"allocations.{name}: {exc}") from None


@dataclass(frozen=True)
class Allocation(_Section):
    """How a step's compute is shaped: one named entry under ``allocations:``, whose missing
    keys come from ``training:`` (learning rate, beta, temperature, completion cap, LoRA
    targets)."""

    SECTIONS = ("allocations", "training")

    num_generations: int = _alloc("num_generations")  # completions per prompt: search width
    prompts_per_step: int = _alloc("prompts_per_step")
    num_iterations: int = _alloc("num_iterations")  # updates per generation batch
    max_completion_length: int = _train("max_completion_length")
    lora_rank: int = _alloc("lora_rank")
    lora_alpha: float | None = None  # None: 2 x rank
    lora_targets: tuple[str, ...] = _train("lora_targets")
    learning_rate: float = _train("learning_rate")  # constant: nested rungs need it
    beta: float = _train("beta")  # KL coefficient; > 0 adds a reference forward
    temperature: float = _train("temperature")
    # Shared by every allocation (training: only): the optimiser recipe.
    warmup_steps: int = _train("warmup_steps")  # linear warmup in optimizer steps, then constant
    scale_rewards: str = _train("scale_rewards")  # TRL: group | batch | none
    loss_type: str = _train("loss_type")  # TRL: grpo | bnpo | dr_grpo | dapo
    max_grad_norm: float = _train("max_grad_norm")

    def __post_init__(self):
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        super().__post_init__()

    @property
    def rows(self) -> int:
        return self.num_generations * self.prompts_per_step

    @property
    def lora(self) -> LoraSpec:
        return LoraSpec(self.lora_rank, self.lora_targets)

    @property
    def alpha(self) -> float:
        """The LoRA alpha the adapter is built with."""
        return 2 * self.lora_rank if self.lora_alpha is None else self.lora_alpha


# --------------------------------------------------------------------------- evaluation


def _eval(key: str):
    return field(default=default("eval", key))


@dataclass(frozen=True)
class EvalSpec(_Section):
    """The config keys under ``eval:`` (see :mod:`race.evaluation.eval_job` for each target)."""

    SECTIONS = ("eval",)

    targets: tuple[str, ...] | None = _eval("targets")  # which targets run (None: all)
    n_in: int = _eval("n_in")
    n_ood: int = _eval("n_ood")
    max_new_tokens: int = _eval("max_new_tokens")
    max_new_tokens_ood: int = _eval("max_new_tokens_ood")
    sample_prompts: int = _eval("sample_prompts")
    k: int = _eval("k")
    bon_n: int = _eval("bon_n")
    share_samples: bool = _eval("share_samples")
    temperature: float = _eval("temperature")
    native_prompts: int = _eval("native_prompts")
    native_samples: int = _eval("native_samples")
    train_temperature: float = _eval("train_temperature")  # each cell's training temperature
    sampled_prompts: int = _eval("sampled_prompts")
    sampled_k: int = _eval("sampled_k")
    prm: str | None = _eval("prm")
    prm_aggregate: str = _eval("prm_aggregate")
    verifier: str = _eval("verifier")
    batch_size: int = _eval("batch_size")
    seed: int = _eval("seed")
    engine: str | None = None  # None (unset): training.rollout_engine (race.core.engines)
    merge_adapter: bool = _eval("merge_adapter")
    attn_implementation: str = _eval("attn_implementation")
    bootstrap_reps: int = _eval("bootstrap_reps")
    search_at: str = _eval("search_at")  # every_rung | base_and_top (maj_k, prm_bon)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "targets", tuple(self.targets or TARGETS))


    def with_overrides(self, **overrides) -> EvalSpec:
        """This spec with the non-None overrides applied (validated again)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _race(key: str):
    return field(default=default("race", key))


@dataclass(frozen=True)
class RaceSpec(_Section):
    """The ``race:`` section: the pilot grid (its rungs, the targets it ranks, how many
    configs it selects) and the validation (budget, seeds, the baseline always validated).
    None: the default the study resolves (:class:`race.core.study.Study`)."""

    SECTIONS = ("race",)

    enabled: bool = _race("enabled")
    pilot_rungs: tuple[float, ...] | None = None
    validation_budget: float | None = None
    validation_seeds: tuple[int, ...] = _race("validation_seeds")
    top_k: int = _race("top_k")
    baseline: str | None = None
    targets: tuple[str, ...] | None = None

    def __post_init__(self):
        for name in ("pilot_rungs", "validation_seeds", "targets"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        super().__post_init__()



# --------------------------------------------------------------------------- base policies


def _pre(key: str):
    return field(default=default("pretrain", key))


@dataclass(frozen=True)
class PretrainSpec(_Section):
    """Config keys under ``pretrain:`` (the same for every size)."""

    SECTIONS = ("pretrain",)

    token_budget: int = _pre("token_budget")
    batch_size: int = _pre("batch_size")
    learning_rate: float = _pre("learning_rate")
    warmup_frac: float = _pre("warmup_frac")
    min_lr_frac: float = _pre("min_lr_frac")
    weight_decay: float = _pre("weight_decay")
    seed: int = _pre("seed")
    eval_examples: int = _pre("eval_examples")
    eval_max_new_tokens: int = _pre("eval_max_new_tokens")



# --------------------------------------------------------------------------- feedback models


def _prm(key: str):
    return field(default=default("prm", key))


@dataclass(frozen=True)
class PRMSpec(_Section):
    """Config keys under ``prm:`` besides ``sizes`` (see race.feedback.prm_training)."""

    SECTIONS = ("prm",)

    n_prompts: int = _prm("n_prompts")  # train-split prompts the base policies sample on
    samples_per_prompt: int = _prm("samples_per_prompt")  # per prompt per base policy
    temperature: float = _prm("temperature")  # 1.0: the policies' own mistakes
    max_new_tokens: int = _prm("max_new_tokens")
    sample_batch_size: int = _prm("sample_batch_size")
    target_positive_rate: float = _prm("target_positive_rate")  # balance towards this rate ...
    balance_tolerance: float = _prm("balance_tolerance")  # ... when farther than this from it
    heldout_frac: float = _prm("heldout_frac")  # prompts held out for AUC / accuracy
    steps: int = _prm("steps")
    batch_size: int = _prm("batch_size")
    learning_rate: float = _prm("learning_rate")  # AdamW peak; warmup then cosine to 10%
    warmup_frac: float = _prm("warmup_frac")
    weight_decay: float = _prm("weight_decay")
    init: str = _prm("init")  # random | base | auto (base when a same-size policy is given)
    attn_implementation: str = _prm("attn_implementation")
    seed: int = _prm("seed")

    @classmethod
    def from_config(cls, section: dict | None) -> PRMSpec:
        """From the config's ``prm:`` section (``sizes`` is the workflow's, not ours)."""
        section = {k: v for k, v in (section or {}).items() if k != "sizes"}
        return _from_section(cls, section, "prm")


# --------------------------------------------------------------------------- rewards, MLflow


#: Options a feedback-model reward passes to its model (race.feedback.loading).
MODEL_OPTIONS = ("batch_size", "attn_implementation", "device", "dtype", "chat_template")
#: The keys of a ``rewards:`` entry that its type reads (besides ``type``).
REWARD_KEYS = {
    "rule": ("verifier",),
    "prm": ("prm", "aggregate", "verifier", *MODEL_OPTIONS),
    "rule+prm": ("prm", "aggregate", "weight", "verifier", *MODEL_OPTIONS),
    "orm": ("orm", *MODEL_OPTIONS),
}
#: The key naming a reward's feedback model, by type (a rule reward reads none).
REWARD_MODEL_KEY = {"rule": None, "prm": "prm", "rule+prm": "prm", "orm": "orm"}


def _reward(key: str):
    return field(default=default("rewards", key))


@dataclass(frozen=True)
class RewardSpec(_Section):
    """One ``rewards:`` entry: a rule (the verifier), a PRM's aggregated step scores, their
    weighted sum, or an ORM's score (race.feedback.rewards). Which keys a type reads is
    :data:`REWARD_KEYS`; the model options (:data:`MODEL_OPTIONS`) are None unless set, and
    :meth:`to_dict` leaves unset ones out, so a job's JSON holds the entry as written plus the
    schema's defaults."""

    SECTIONS = ("rewards",)

    type: str = "rule"
    prm: str | None = None  # prm, rule+prm: ladder PRM name, folder or hub id
    orm: str | None = None  # orm: folder or hub id
    aggregate: str = _reward("aggregate")
    weight: float = _reward("weight")  # rule+prm: weight of the PRM term
    verifier: str = _reward("verifier")
    batch_size: int | None = None
    attn_implementation: str | None = None
    device: str | None = None
    dtype: str | None = None
    chat_template: bool | None = None

    @property
    def model(self) -> str | None:
        """The feedback model this reward runs (its PRM or ORM), or None for a rule reward."""
        key = REWARD_MODEL_KEY[self.type]
        return None if key is None else getattr(self, key)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def from_config(cls, entry: dict, name: str = "reward") -> RewardSpec:
        return _from_section(cls, entry, f"rewards.{name}")


@dataclass(frozen=True)
class MlflowSpec(_Section):
    """Where MLflow runs go (``mlflow:``; the experiment defaults to the study name)."""

    SECTIONS = ("mlflow",)

    experiment: str
    enabled: bool = field(default=default("mlflow", "enabled"))
    tracking_uri: str = field(default=default("mlflow", "tracking_uri"))
    artifact_root: str = field(default=default("mlflow", "artifact_root"))

    @property
    def sqlite_db(self) -> Path | None:
        """The file of a ``sqlite:///`` tracking store (relative to where the study runs);
        None for a tracking server."""
        uri = self.tracking_uri
        return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
