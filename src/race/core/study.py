"""The study: the config parsed once into typed sections, with the grid and the paths it
implies.

:class:`Study` is what the builders, the workflow, tracking and the CLI take instead of a
dict. :func:`race.study.config.load_study` makes one from a YAML file (read, checked against
the schema with its defaults filled in, then the cross-field checks); :meth:`Study.from_config`
makes one from a mapping already validated (Snakemake's ``config``, a job's config slice).

A rule hands its command only the sections it reads (:meth:`Study.slice`), so editing another
section reruns nothing: a Study built from such a slice holds None for every section the slice
does not carry, so code that reads one fails at once rather than seeing a default.

The vocabulary under it -- :class:`race.core.cells.Cell`, run keys, rung folders -- is
:mod:`race.core.cells`; the sections are :mod:`race.core.specs`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from race.core.atomic import write_text_atomic
from race.core.cells import Cell, is_ladder, parse_key, slug
from race.core.errors import ConfigError
from race.core.specs import (
    SEARCH_TARGETS,
    Allocation,
    EvalSpec,
    MlflowSpec,
    PretrainSpec,
    PRMSpec,
    RaceSpec,
    RewardSpec,
    TaskSource,
    TaskSpec,
    TeacherSpec,
    TrainingSpec,
)

#: The file in a results directory that names the study whose files it holds.
STUDY_MARKER = "STUDY"
#: Where the config sets how a training job runs, not what it computes (a job's run options,
#: race.core.jobs.RUN_OPTIONS): :meth:`Study.slice` leaves them out, so that changing one
#: reruns no table, mirror or report.
RUN_OPTION_KEYS = (("training", "save_every"), ("mlflow", "live"), ("max_steps_per_run",))


def _frozen(mapping: dict) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, eq=False)
class Study:
    """One study config, every section typed (None: a section the slice it was built from
    does not carry). ``config`` is the mapping it was built from, for the sections a rule
    hands on (:meth:`slice`) and what MLflow logs."""

    name: str | None
    results_dir: str | None
    config: Mapping = field(repr=False)
    reports_dir: str | None = None
    device: str | None = None
    source: TaskSource | None = None
    task: TaskSpec | None = None
    teacher: TeacherSpec | None = None
    pretrain: PretrainSpec | None = None
    sizes: tuple[str, ...] | None = None
    prm_sizes: tuple[str, ...] | None = None
    prm: PRMSpec | None = None
    rewards: Mapping[str, RewardSpec] | None = None  # as written: a PRM by its config name
    training: TrainingSpec | None = None
    allocations: Mapping[str, Allocation] | None = None
    budgets: tuple[float, ...] | None = None
    seeds: tuple[int, ...] | None = None
    eval: EvalSpec | None = None
    race: RaceSpec | None = None
    mlflow: MlflowSpec | None = None
    mlflow_live: bool | None = False  # training jobs log to MLflow themselves
    resources: Mapping | None = None
    # hub id -> the revision it is loaded at (race.core.references); None: a slice without it
    revisions: Mapping[str, str] | None = None
    gpu_memory_gb: float | None = None  # one GPU's memory: check-config fits every job in it
    max_steps_per_run: int | None = None  # None (unset): race.study.plan.MAX_STEPS_PER_RUN
    slurm: Mapping | None = None  # partition and account of the model jobs on SLURM

    @classmethod
    def from_config(cls, config: Mapping) -> Study:
        """The typed study of a validated config, or of a slice of one."""
        c = dict(config)
        get = c.get
        training = TrainingSpec.from_config(c["training"]) if "training" in c else None
        allocations = None  # an allocation is its entry over training: both or neither
        if "allocations" in c and training is not None:
            allocations = _frozen({name: training.allocation(name, entry)
                                   for name, entry in c["allocations"].items()})
        mlflow = get("mlflow")
        return cls(
            name=get("study"),
            results_dir=get("results_dir"),
            config=_frozen(c),
            reports_dir=get("reports_dir"),
            device=get("device"),
            source=TaskSource.from_config(c["task"]) if "task" in c else None,
            task=TaskSpec.from_config(c["task"]) if "task" in c else None,
            teacher=TeacherSpec.from_config(c["teacher"]) if "teacher" in c else None,
            pretrain=PretrainSpec.from_config(c["pretrain"]) if "pretrain" in c else None,
            sizes=tuple(c["sizes"]) if "sizes" in c else None,
            prm_sizes=tuple(c["prm"]["sizes"]) if "prm" in c else None,
            prm=PRMSpec.from_config(c["prm"]) if "prm" in c else None,
            rewards=_frozen({name: RewardSpec.from_config(entry, name)
                             for name, entry in c["rewards"].items()}) if "rewards" in c
            else None,
            training=training,
            allocations=allocations,
            budgets=tuple(float(b) for b in c["budgets"]) if "budgets" in c else None,
            seeds=tuple(int(s) for s in c["seeds"]) if "seeds" in c else None,
            eval=EvalSpec.from_config(c["eval"]) if "eval" in c else None,
            race=RaceSpec.from_config(c["race"]) if "race" in c else None,
            mlflow=None if mlflow is None else MlflowSpec(
                experiment=mlflow.get("experiment") or c["study"], enabled=mlflow["enabled"],
                tracking_uri=mlflow["tracking_uri"], artifact_root=mlflow["artifact_root"]),
            # None: a slice, which carries no run option (RUN_OPTION_KEYS)
            mlflow_live=None if mlflow is not None and "live" not in mlflow
            else bool(mlflow and mlflow["enabled"] and mlflow["live"]),
            resources=_frozen(c["resources"]) if "resources" in c else None,
            revisions=_frozen(c["revisions"]) if "revisions" in c else None,
            gpu_memory_gb=get("gpu_memory_gb"),
            max_steps_per_run=get("max_steps_per_run"),
            slurm=_frozen(c["slurm"]) if "slurm" in c else None,
        )

    def slice(self, *keys: str) -> str:
        """JSON of the named top-level sections less the run options (:data:`RUN_OPTION_KEYS`):
        what a rule hands its command (and what Snakemake's params trigger compares, so
        editing another section or a run option reruns nothing)."""
        out = {k: self.config[k] for k in keys if k in self.config}
        for *section, key in RUN_OPTION_KEYS:
            if not section:
                out.pop(key, None)
            elif isinstance(out.get(section[0]), Mapping):
                out[section[0]] = {k: v for k, v in out[section[0]].items() if k != key}
        return json.dumps(out, sort_keys=True)

    def data_slice(self) -> str:
        """The data rule's slice: ``task``, and ``revisions`` with the pins of the task's
        datasets when it pins any (else the JSON is ``slice("task")``'s: pinning a model
        reruns no data)."""
        source = self.source
        pins = self.revisions_of(source.hf_id, source.hf_ood_id) if source.kind == "hf" else {}
        return json.dumps({"task": self.config["task"], **({"revisions": pins} if pins else {})},
                          sort_keys=True)

    def revisions_of(self, *specs: str | None) -> dict[str, str]:
        """The pins (``revisions:``) of the hub ids among ``specs``: what a job loading them
        carries. None pinned when the study carries no ``revisions`` (the data rule's slice
        leaves them out when no dataset is pinned)."""
        pins = self.revisions or {}
        return {s: pins[s] for s in specs if s is not None and s in pins}

    # ------------------------------------------------------------------ targets
    @property
    def eval_targets(self) -> tuple[str, ...]:
        return self.eval.targets

    @property
    def search_only_at_top(self) -> bool:
        return self.eval.search_at == "base_and_top"

    @property
    def eval_prm(self) -> str | None:
        """The PRM that reranks best-of-n samples: ``eval.prm``, else the last of
        ``prm.sizes`` (the strong one, when they are listed weakest first as the default
        config does); None when there is none (``prm_bon`` is then skipped, with the reason
        recorded)."""
        return self.eval.prm or (self.prm_sizes[-1] if self.prm_sizes else None)

    @property
    def race_targets(self) -> tuple[str, ...]:
        """Targets the RACE pilot ranks: ``race.targets``, else every evaluated target the
        pilot rungs have a value for (not the search targets when they run only at the top
        rung, not ``prm_bon`` without a PRM)."""
        if self.race.targets:
            return self.race.targets
        return tuple(t for t in self.eval_targets
                     if not (self.search_only_at_top and t in SEARCH_TARGETS)
                     and not (t == "prm_bon" and self.eval_prm is None))

    # ------------------------------------------------------------------ rewards
    def reward(self, name: str) -> RewardSpec:
        """A ``rewards:`` entry with its PRM resolved to a directory (or hub id)."""
        spec = self.rewards[name]
        return replace(spec, prm=self.prm_dir(spec.prm)) if spec.prm else spec

    @property
    def base_reward(self) -> str:
        """The reward a base policy's native_reward is measured under: the first reward
        system (the other systems' base rows leave it empty rather than show another
        reward's number)."""
        return next(iter(self.rewards))

    # ------------------------------------------------------------------ the grid
    def grid_cells(self) -> list[Cell]:
        """The full grid: every size x reward x allocation x seed (runs to the largest rung)."""
        return [Cell(s, r, a, seed) for s in self.sizes for r in self.rewards
                for a in self.allocations for seed in self.seeds]

    def pilot_rungs(self) -> list[float]:
        return [float(b) for b in self.race.pilot_rungs or self.budgets[:-1] or self.budgets]

    def validation_budget(self) -> float:
        return float(self.race.validation_budget or self.budgets[-1])

    def baseline_alloc(self) -> str:
        """The allocation RACE always validates (``race.baseline``, else the first one)."""
        return self.race.baseline or next(iter(self.allocations))

    def validation_cells(self, selected: list[dict]) -> list[Cell]:
        """Selected configs x validation seeds that the grid does not already run."""
        grid = {c.key for c in self.grid_cells()}
        cells = []
        for item in selected:
            for seed in self.race.validation_seeds:
                cell = Cell(item["size"], item["reward"], item["alloc"], int(seed))
                if cell.key not in grid and cell not in cells:
                    cells.append(cell)
        return cells

    def is_validation_only(self, cell: Cell) -> bool:
        """A seed the grid does not run: the cell exists only as a RACE validation run."""
        return cell.seed not in self.seeds

    def cell_rungs(self, cell: Cell) -> list[float]:
        """Budget rungs a cell's run passes: all of them for the grid, up to the validation
        budget for a validation-only seed."""
        if not self.is_validation_only(cell):
            return list(self.budgets)
        return [b for b in self.budgets if b <= self.validation_budget()]

    def evaluated_rungs(self, cell: Cell) -> list[float]:
        """The rungs a cell is evaluated at: every rung of a grid cell, the validation budget
        alone for a validation-only seed."""
        if self.is_validation_only(cell):
            return [self.validation_budget()]
        return self.cell_rungs(cell)

    def unslug(self, value: str) -> str:
        """The size (or PRM size) spec whose slug is ``value``."""
        for spec in (*self.sizes, *self.prm_sizes):
            if slug(spec) == value:
                return spec
        raise ConfigError(f"no size in the config has the slug {value!r}")

    def parse_cell(self, key: str) -> Cell:
        """Invert :func:`race.core.cells.cell_key` (slugs map back to size specs)."""
        parts = parse_key(key)
        missing = {"size", "reward", "alloc", "seed"} - set(parts)
        if missing:
            raise ConfigError(f"cell {key!r}: missing {sorted(missing)}")
        sizes = {slug(s): s for s in self.sizes}
        if parts["size"] not in sizes:
            raise ConfigError(f"cell {key!r}: size {parts['size']!r} is not in sizes")
        if parts["reward"] not in self.rewards:
            raise ConfigError(f"cell {key!r}: reward {parts['reward']!r} is not in rewards")
        if parts["alloc"] not in self.allocations:
            raise ConfigError(f"cell {key!r}: allocation {parts['alloc']!r} is not in "
                              "allocations")
        seeds = [*self.seeds, *self.race.validation_seeds]
        if not parts["seed"].isdigit() or int(parts["seed"]) not in seeds:
            raise ConfigError(f"cell {key!r}: seed {parts['seed']!r} is neither in seeds nor "
                              f"in race.validation_seeds ({sorted(set(seeds))})")
        return Cell(sizes[parts["size"]], parts["reward"], parts["alloc"], int(parts["seed"]))

    # ------------------------------------------------------------------ paths
    @property
    def results(self) -> Path:
        return Path(self.results_dir)

    def base_dir(self, size: str) -> str:
        """Directory (or hub id) of a size's base policy."""
        return str(self.results / "base" / f"size~{size}") if is_ladder(size) else size

    def max_prompt_tokens(self) -> int | None:
        """The longest training prompt in policy tokens, before the data is built: for the
        arithmetic task its length in characters (= tokens of the char tokenizer: the start
        value, ``max_steps`` operations, ``=?\n``); otherwise ``task.max_prompt_tokens``
        (None when unset: known once the data is built)."""
        if self.source.kind != "arithmetic":
            return self.source.max_prompt_tokens
        task = self.task
        return len(str(task.max_value)) + task.max_steps * (1 + len(str(task.max_operand))) + 3

    def base_eval(self, size: str) -> Path:
        """The ``eval.json`` of a size's base policy, under ``results/base`` for every size
        (a hub id or a local folder is never written into)."""
        return self.results / "base" / f"size~{slug(size)}" / "eval.json"

    def prm_samples_dir(self) -> str:
        """Where the base policies' samples every ladder PRM learns from are drawn, once."""
        return str(self.results / "prm" / "samples")

    def prm_dir(self, prm: str) -> str:
        """Directory (or hub id) of a PRM: a ladder PRM is trained under results/prm."""
        return str(self.results / "prm" / f"size~{prm}") if is_ladder(prm) else prm

    def run_dir(self, cell: Cell) -> Path:
        return self.results / "runs" / cell.key

    def claim_results_dir(self, check_only: bool = False) -> None:
        """Refuse a ``results_dir`` that holds another study's files (its
        :data:`STUDY_MARKER` names another ``study``): that study's data, base policies and
        PRMs sit at the same paths, so running this one would rebuild them over it, and that
        one would then retrain every cell from step 1. Marks an unmarked folder as this
        study's unless ``check_only`` (a dry run)."""
        marker = self.results / STUDY_MARKER
        if marker.is_file():
            owner = marker.read_text().strip()
            if owner and owner != self.name:
                raise ConfigError(f"results_dir: {self.results_dir} holds the study {owner!r} "
                                  f"({marker}), not {self.name!r}: give each study its own "
                                  "results_dir (and reports_dir)")
        elif not check_only:
            marker.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(marker, self.name + "\n")
