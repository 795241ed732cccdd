"""The study config: loading, validation, and the grid of cells it expands into.

``load_config`` reads YAML (rejecting duplicate keys, which plain YAML silently overwrites),
validates it against ``workflow/schemas/config.schema.yaml`` (filling defaults: the schema is
the single source of defaults), then runs the cross-field checks of :func:`check_config`.
Every error is a :class:`ConfigError` whose message starts with the offending key, raised before
anything is written under ``results/``.

A *cell* is one training run: (size, reward, allocation, seed). Its run key is the
Paramspace-style path ``size~S/reward~R/alloc~A/seed~N`` (a hub id's ``/`` becomes ``--`` so the
key stays one folder per level); it is the folder under ``results/runs/``, the MLflow run name
and the ``run_key`` tag.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from race.ladder import LADDER_DIALS

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
KNOWN_TARGETS = ("in_pass1", "ood_pass1", "maj_k", "prm_bon", "native_reward")
_HUB_ID = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class ConfigError(ValueError):
    """An invalid study config; the message names the key."""


# --------------------------------------------------------------------------- loading


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1}): "
                              "names must be unique")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _construct_mapping)


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (safe loader)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a mapping")
    return data


def validate_schema(config: dict) -> dict:
    """Schema validation with defaults filled in (the same call the Snakefile makes)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    try:
        validate(config, str(SCHEMA), set_default=True)
    except WorkflowError as exc:
        raise ConfigError(_schema_message(exc)) from None
    return config


def _schema_message(exc) -> str:
    text = str(exc)
    # Keep jsonschema's first line and the path it reports ("On instance['budgets'][1]").
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    where = next((ln for ln in lines if ln.startswith("On instance")), "")
    head = next((ln for ln in lines if "Error validating config" not in ln), text)
    return f"config schema: {head} {where}".strip()


def load_config(path: str | Path) -> dict:
    """A validated config from a YAML file, or -- when ``path`` is inline JSON (starts with
    ``{``) -- the config slice a workflow rule passes to its command, already validated when
    the Snakefile was parsed (so it is returned as is)."""
    text = str(path).lstrip()
    if text.startswith("{"):
        return json.loads(text)
    return check_config(validate_schema(read_yaml(path)))


def config_slice(config: dict, *keys: str) -> str:
    """JSON of the named top-level sections: what a rule hands its command (and what
    Snakemake's params trigger compares, so editing another section reruns nothing here)."""
    return json.dumps({k: config[k] for k in keys if k in config}, sort_keys=True)


# --------------------------------------------------------------------------- names


def slug(spec: str) -> str:
    """A size / PRM spec as one path component: ``Qwen/Qwen2.5-0.5B`` -> ``Qwen--Qwen2.5-0.5B``."""
    return spec.replace("/", "--")


def is_model_spec(spec: str) -> bool:
    """A ladder name, an existing local directory, a known architecture or a hub id."""
    from race.known_configs import is_known

    return (spec in LADDER_DIALS or Path(spec).is_dir() or is_known(spec)
            or bool(_HUB_ID.match(spec)))


def is_ladder(spec: str) -> bool:
    return spec in LADDER_DIALS


def unslug(config: dict, value: str) -> str:
    """The size spec of the config whose slug is ``value``."""
    for spec in list(config["sizes"]) + list(config["prm"]["sizes"]):
        if slug(spec) == value:
            return spec
    raise ConfigError(f"no size in the config has the slug {value!r}")


def format_budget(budget: float) -> str:
    """Compact, exact name for a rung: 3e10, 1.5e11 (parsed back with float())."""
    mantissa, exponent = f"{float(budget):.6e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def cell_key(size: str, reward: str, alloc: str, seed: int) -> str:
    return f"size~{slug(size)}/reward~{reward}/alloc~{alloc}/seed~{seed}"


@dataclass(frozen=True)
class Cell:
    size: str  # the size spec as written in the config
    reward: str
    alloc: str
    seed: int

    @property
    def key(self) -> str:
        return cell_key(self.size, self.reward, self.alloc, self.seed)


def parse_cell(key: str, config: dict) -> Cell:
    """Invert :func:`cell_key` against the config (slugs map back to size specs)."""
    parts = dict(p.split("~", 1) for p in key.strip("/").split("/"))
    missing = {"size", "reward", "alloc", "seed"} - set(parts)
    if missing:
        raise ConfigError(f"cell {key!r}: missing {sorted(missing)}")
    sizes = {slug(s): s for s in config["sizes"]}
    if parts["size"] not in sizes:
        raise ConfigError(f"cell {key!r}: size {parts['size']!r} is not in sizes")
    if parts["reward"] not in config["rewards"]:
        raise ConfigError(f"cell {key!r}: reward {parts['reward']!r} is not in rewards")
    if parts["alloc"] not in config["allocations"]:
        raise ConfigError(f"cell {key!r}: allocation {parts['alloc']!r} is not in allocations")
    return Cell(sizes[parts["size"]], parts["reward"], parts["alloc"], int(parts["seed"]))


# --------------------------------------------------------------------------- derived settings


def allocation(config: dict, name: str):
    """The :class:`race.train.Allocation` of a named allocation (training defaults applied)."""
    from race.train import Allocation

    shared = config["training"]
    entry = dict(config["allocations"][name])
    for key in ("learning_rate", "beta", "temperature", "max_completion_length"):
        entry.setdefault(key, shared[key])
    entry["lora_targets"] = tuple(shared["lora_targets"])
    try:
        return Allocation(**entry)
    except ValueError as exc:
        raise ConfigError(f"allocations.{name}: {exc}") from None


def pilot_rungs(config: dict) -> list[float]:
    budgets = config["budgets"]
    return list(config["race"].get("pilot_rungs") or budgets[:-1] or budgets)


def validation_budget(config: dict) -> float:
    return float(config["race"].get("validation_budget") or config["budgets"][-1])


def baseline_alloc(config: dict) -> str:
    return config["race"].get("baseline") or next(iter(config["allocations"]))


def race_targets(config: dict) -> list[str]:
    return list(config["race"].get("targets") or eval_targets(config))


def eval_targets(config: dict) -> list[str]:
    return list(config["eval"].get("targets") or KNOWN_TARGETS)


def experiment(config: dict) -> str:
    return config["mlflow"].get("experiment") or config["study"]


def mlflow_spec(config: dict):
    from race.tracking import MlflowSpec

    m = config["mlflow"]
    return MlflowSpec(enabled=m["enabled"], tracking_uri=m["tracking_uri"],
                      artifact_root=m["artifact_root"], experiment=experiment(config))


def mlflow_live(config: dict) -> bool:
    """Whether training jobs log to MLflow themselves (``mlflow.enabled`` and ``live``)."""
    return bool(config["mlflow"]["enabled"] and config["mlflow"].get("live", True))


def grid_cells(config: dict) -> list[Cell]:
    """The full grid: every size x reward x allocation x seed (runs to the largest rung)."""
    return [Cell(s, r, a, seed) for s in config["sizes"] for r in config["rewards"]
            for a in config["allocations"] for seed in config["seeds"]]


def validation_cells(config: dict, selected: list[dict]) -> list[Cell]:
    """Selected configs x validation seeds that the grid does not already run."""
    grid = {c.key for c in grid_cells(config)}
    cells = []
    for item in selected:
        for seed in config["race"]["validation_seeds"]:
            cell = Cell(item["size"], item["reward"], item["alloc"], int(seed))
            if cell.key not in grid and cell not in cells:
                cells.append(cell)
    return cells


def cell_rungs(config: dict, cell: Cell) -> list[float]:
    """Budget rungs a cell's run passes: all of them for the grid, up to the validation
    budget for a validation-only seed."""
    budgets = [float(b) for b in config["budgets"]]
    if cell.seed in config["seeds"]:
        return budgets
    return [b for b in budgets if b <= validation_budget(config)]


def evaluated_rungs(config: dict, cell: Cell, validation: bool) -> list[float]:
    """The rungs a cell is evaluated at: every rung of a grid cell, the validation budget
    alone for a validation-only seed."""
    return [validation_budget(config)] if validation else cell_rungs(config, cell)


# --------------------------------------------------------------------------- paths


def results(config: dict) -> Path:
    return Path(config["results_dir"])


def base_dir(config: dict, size: str) -> str:
    """Directory (or hub id) of a size's base policy."""
    if size in LADDER_DIALS:
        return str(results(config) / "base" / f"size~{size}")
    return size


def prm_dir(config: dict, prm: str) -> str:
    if prm in LADDER_DIALS:
        return str(results(config) / "prm" / f"size~{prm}")
    return prm


def run_dir(config: dict, cell: Cell) -> Path:
    return results(config) / "runs" / cell.key


def reward_spec(config: dict, name: str) -> dict:
    spec = dict(config["rewards"][name])
    if "prm" in spec:
        spec["prm"] = prm_dir(config, spec["prm"])
    return spec


def train_job(config: dict, cell: Cell):
    from race.train import TrainJob

    t = config["training"]
    return TrainJob(
        base=base_dir(config, cell.size),
        train_data=str(results(config) / "data" / "train.jsonl"),
        run_dir=str(run_dir(config, cell)),
        rungs=cell_rungs(config, cell),
        alloc=allocation(config, cell.alloc),
        reward=reward_spec(config, cell.reward),
        seed=cell.seed,
        run_key=cell.key,
        study=config["study"],
        # Live logging from the training job; otherwise the mlflow_log job mirrors the folder.
        mlflow=mlflow_spec(config) if mlflow_live(config) else None,
        save_every=t["save_every"],
        attn_implementation=t["attn_implementation"],
        gradient_checkpointing=t["gradient_checkpointing"],
        results_dir=str(results(config)),
        tags={"size": cell.size, "reward": cell.reward, "alloc": cell.alloc,
              "seed": str(cell.seed)},
    )


def train_job_json(config: dict, cell: Cell) -> str:
    from race.train import job_to_json

    return job_to_json(train_job(config, cell))


# --------------------------------------------------------------------------- cross-field checks


def _unique(items: list, key: str) -> None:
    seen = set()
    for i, item in enumerate(items):
        if item in seen:
            raise ConfigError(f"{key}[{i}]: duplicate entry {item!r}")
        seen.add(item)


def _max_prompt_tokens(task: dict) -> int | None:
    """Longest training prompt in characters (= tokens of the char tokenizer): the start
    value, then ``max_steps`` operations, then ``=?\n``."""
    if task["kind"] != "arithmetic":
        return None
    return (len(str(task["max_value"])) + task["max_steps"] * (1 + len(str(task["max_operand"])))
            + 3)


def _arch(config: dict, spec: str):
    """Architecture of a size spec for the budget check, or None when not resolvable offline."""
    from race import flops

    if spec in LADDER_DIALS:
        from race.cli_models import DEFAULT_VOCAB

        return flops.resolve_arch(spec, vocab=DEFAULT_VOCAB)
    try:
        return flops.resolve_arch(spec)
    except (ValueError, FileNotFoundError, KeyError):
        return None


def smallest_step_check(config: dict) -> None:
    """Every cell's first rung must afford one step (its worst case: longest prompt, full
    completions, the reward model included)."""
    from race import flops
    from race.meter import BatchShapes, StepMeter

    max_prompt = _max_prompt_tokens(config["task"])
    if max_prompt is None:
        return  # prompt lengths are known only once the data is built; race train checks
    first = float(config["budgets"][0])
    for size in config["sizes"]:
        arch = _arch(config, size)
        if arch is None:
            continue
        for alloc_name in config["allocations"]:
            alloc = allocation(config, alloc_name)
            worst = BatchShapes.worst_case(alloc.rows, max_prompt, alloc.max_completion_length)
            meter = StepMeter(arch, alloc.lora, beta=alloc.beta,
                              num_iterations=alloc.num_iterations,
                              grad_ckpt=config["training"]["gradient_checkpointing"])
            for reward_name, reward in config["rewards"].items():
                reward_bound = 0
                model = reward.get("prm") or reward.get("orm")
                prm_arch = _arch(config, model) if model else None
                if prm_arch is not None:
                    reward_bound = alloc.rows * flops.reward_model_flops(
                        prm_arch, max_prompt + 2 * alloc.max_completion_length)
                bound = meter.step_bound(True, worst, None, reward_bound)
                if bound > first:
                    raise ConfigError(
                        f"budgets[0]: {first:.3g} FLOPs is below one step of cell "
                        f"{cell_key(size, reward_name, alloc_name, 0)} (up to {bound:.3g} "
                        "model FLOPs): raise the first rung or shrink that allocation")


def check_config(config: dict) -> dict:
    """Cross-field checks the schema cannot express; returns the config unchanged."""
    _unique(config["sizes"], "sizes")
    for i, size in enumerate(config["sizes"]):
        if not is_model_spec(size):
            raise ConfigError(f"sizes[{i}]: unknown size {size!r} (a ladder name "
                              f"{sorted(LADDER_DIALS)}, a local directory or a hub id)")
    prm_sizes = config["prm"]["sizes"]
    _unique(prm_sizes, "prm.sizes")
    for i, size in enumerate(prm_sizes):
        if not is_model_spec(size):
            raise ConfigError(f"prm.sizes[{i}]: unknown PRM size {size!r}")
    for name, reward in config["rewards"].items():
        if not re.match(r"^[A-Za-z0-9_.+-]+$", name):
            raise ConfigError(f"rewards.{name}: names may use letters, digits and _ . + -")
        if reward["type"] in ("prm", "rule+prm"):
            prm = reward.get("prm")
            if prm is None:
                raise ConfigError(f"rewards.{name}.prm: a {reward['type']} reward needs a PRM")
            if prm not in prm_sizes and not (Path(prm).is_dir() or _HUB_ID.match(prm)):
                raise ConfigError(f"rewards.{name}.prm: {prm!r} is not one of prm.sizes "
                                  f"{prm_sizes} nor a path / hub id")
        if reward["type"] == "orm" and not reward.get("orm"):
            raise ConfigError(f"rewards.{name}.orm: an orm reward needs a model path or hub id")
    for name, entry in config["allocations"].items():
        if not re.match(r"^[A-Za-z0-9_.-]+$", name):
            raise ConfigError(f"allocations.{name}: names may use letters, digits and _ . -")
        if entry.get("num_generations", 8) < 2:
            raise ConfigError(f"allocations.{name}.num_generations: must be >= 2 (GRPO "
                              "compares completions within a group)")
        allocation(config, name)
    from race.flops import ALL_PROJECTIONS

    for target in config["training"]["lora_targets"]:
        if target not in ALL_PROJECTIONS:
            raise ConfigError(f"training.lora_targets: unknown module {target!r} "
                              f"(known: {', '.join(ALL_PROJECTIONS)})")
    budgets = config["budgets"]
    for i in range(1, len(budgets)):
        if budgets[i] <= budgets[i - 1]:
            raise ConfigError(f"budgets[{i}]: rungs must be strictly increasing "
                              f"({budgets[i - 1]:.3g} then {budgets[i]:.3g})")
    _unique(config["seeds"], "seeds")
    for i, target in enumerate(config["eval"].get("targets") or []):
        if target not in KNOWN_TARGETS:
            raise ConfigError(f"eval.targets[{i}]: unknown target {target!r} "
                              f"(known: {', '.join(KNOWN_TARGETS)})")
    bon_prm = config["eval"].get("prm")
    if bon_prm is not None and bon_prm not in prm_sizes and not is_model_spec(bon_prm):
        raise ConfigError(f"eval.prm: {bon_prm!r} is not one of prm.sizes")
    race = config["race"]
    for i, rung in enumerate(race.get("pilot_rungs") or []):
        if float(rung) not in [float(b) for b in budgets]:
            raise ConfigError(f"race.pilot_rungs[{i}]: {rung:.3g} is not one of budgets")
    if race.get("validation_budget") is not None and float(race["validation_budget"]) not in [
            float(b) for b in budgets]:
        raise ConfigError("race.validation_budget: must be one of budgets")
    if race.get("baseline") is not None and race["baseline"] not in config["allocations"]:
        raise ConfigError(f"race.baseline: {race['baseline']!r} is not an allocation")
    for i, target in enumerate(race.get("targets") or []):
        if target not in KNOWN_TARGETS:
            raise ConfigError(f"race.targets[{i}]: unknown target {target!r}")
    _unique(race["validation_seeds"], "race.validation_seeds")
    smallest_step_check(config)
    return config


def dump_resolved(config: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(config, indent=1, sort_keys=True, default=str))
