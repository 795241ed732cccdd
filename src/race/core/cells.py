"""Cells, rungs and the paths they live at: the names every stage agrees on.

A *cell* is one training run: (size, reward, allocation, seed). Its run key is the
Paramspace-style path ``size~S/reward~R/alloc~A/seed~N`` (a hub id's ``/`` becomes ``--`` so the
key stays one folder per level); it is the folder under ``results/runs/``, the MLflow run name
and the ``run_key`` tag. A *rung* is one of the nested budgets (model FLOPs) a run passes; its
snapshot lives in ``budget~<B>/`` inside the run folder, ``B`` written by :func:`format_budget`.

This module reads the config as a plain mapping and imports nothing heavier than the ladder's
names, so the Snakemake process can use it freely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from race.core.atomic import write_text_atomic
from race.core.errors import ConfigError
from race.core.ladder import LADDER_DIALS

#: Marker file of a finished run folder and of a complete rung snapshot.
DONE = "DONE"
#: A run folder's device, thread count and peak FLOP/s (race.flops.peak), written by its
#: training job: the divisor of its utilisation columns.
PERF = "perf.json"


#: What each cell-key field may hold: the workflow's wildcard constraints, and what the config
#: check accepts for a size's or PRM's slug, a reward name and an allocation name.
WILDCARDS = {"size": r"[A-Za-z0-9_.+-]+", "reward": r"[A-Za-z0-9_.+-]+",
             "alloc": r"[A-Za-z0-9_.-]+", "seed": r"\d+", "budget": r"[0-9.e+-]+"}


def fits_wildcard(field: str, value: str) -> bool:
    return re.fullmatch(WILDCARDS[field], value) is not None


def slug(spec: str) -> str:
    """A size / PRM spec as one path component: ``Qwen/Qwen2.5-0.5B`` -> ``Qwen--Qwen2.5-0.5B``."""
    return spec.replace("/", "--")


def is_ladder(spec: str) -> bool:
    return spec in LADDER_DIALS


#: A Hugging Face hub id, ``org/name``. A relative path of the same shape that is not an
#: existing folder reads as a hub id, as ``from_pretrained`` reads it; write ``./org/name``
#: to mean the path.
HUB_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def is_hub_id(spec: str) -> bool:
    """``org/name`` as the hub spells repository ids: each part starts with a letter, digit
    or ``_``, and neither holds ``..`` or ``--`` (so ``./x``, ``../x`` and ``.hidden/x`` are
    paths, never ids)."""
    text = str(spec)
    return bool(HUB_ID.match(text)) and ".." not in text and "--" not in text


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


def unslug(config: dict, value: str) -> str:
    """The size (or PRM size) spec of the config whose slug is ``value``."""
    for spec in list(config["sizes"]) + list(config["prm"]["sizes"]):
        if slug(spec) == value:
            return spec
    raise ConfigError(f"no size in the config has the slug {value!r}")


def parse_key(key: str) -> dict[str, str]:
    """``size~S/reward~R/...`` as ``{"size": "S", "reward": "R", ...}``."""
    try:
        return dict(p.split("~", 1) for p in key.strip("/").split("/"))
    except ValueError:
        raise ConfigError(f"cell {key!r}: expected key~value parts joined by '/'") from None


def parse_cell(key: str, config: dict) -> Cell:
    """Invert :func:`cell_key` against the config (slugs map back to size specs)."""
    parts = parse_key(key)
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
    seeds = [*config["seeds"], *config["race"]["validation_seeds"]]
    if not parts["seed"].isdigit() or int(parts["seed"]) not in seeds:
        raise ConfigError(f"cell {key!r}: seed {parts['seed']!r} is neither in seeds nor in "
                          f"race.validation_seeds ({sorted(set(seeds))})")
    return Cell(sizes[parts["size"]], parts["reward"], parts["alloc"], int(parts["seed"]))


# --------------------------------------------------------------------------- the grid


def grid_cells(config: dict) -> list[Cell]:
    """The full grid: every size x reward x allocation x seed (runs to the largest rung)."""
    return [Cell(s, r, a, seed) for s in config["sizes"] for r in config["rewards"]
            for a in config["allocations"] for seed in config["seeds"]]


def pilot_rungs(config: dict) -> list[float]:
    budgets = config["budgets"]
    return list(config["race"].get("pilot_rungs") or budgets[:-1] or budgets)


def validation_budget(config: dict) -> float:
    return float(config["race"].get("validation_budget") or config["budgets"][-1])


def baseline_alloc(config: dict) -> str:
    """The allocation RACE always validates (``race.baseline``, else the first allocation)."""
    return config["race"].get("baseline") or next(iter(config["allocations"]))


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


def is_validation_only(config: dict, cell: Cell) -> bool:
    """A seed the grid does not run: the cell exists only as a RACE validation run."""
    return cell.seed not in config["seeds"]


def cell_rungs(config: dict, cell: Cell) -> list[float]:
    """Budget rungs a cell's run passes: all of them for the grid, up to the validation
    budget for a validation-only seed."""
    budgets = [float(b) for b in config["budgets"]]
    if not is_validation_only(config, cell):
        return budgets
    return [b for b in budgets if b <= validation_budget(config)]


def evaluated_rungs(config: dict, cell: Cell) -> list[float]:
    """The rungs a cell is evaluated at: every rung of a grid cell, the validation budget
    alone for a validation-only seed."""
    if is_validation_only(config, cell):
        return [validation_budget(config)]
    return cell_rungs(config, cell)


# --------------------------------------------------------------------------- paths


def results(config: dict) -> Path:
    return Path(config["results_dir"])


#: The file in a results directory that names the study whose files it holds.
STUDY_MARKER = "STUDY"


def claim_results_dir(config: dict, check_only: bool = False) -> None:
    """Refuse a ``results_dir`` that holds another study's files (its :data:`STUDY_MARKER`
    names another ``study``): that study's data, base policies and PRMs sit at the same paths,
    so running this one would rebuild them over it, and that one would then retrain every cell
    from step 1. Marks an unmarked folder as this study's unless ``check_only`` (a dry run)."""
    marker = Path(config["results_dir"]) / STUDY_MARKER
    if marker.is_file():
        owner = marker.read_text().strip()
        if owner and owner != config["study"]:
            raise ConfigError(f"results_dir: {config['results_dir']} holds the study {owner!r} "
                              f"({marker}), not {config['study']!r}: give each study its own "
                              "results_dir (and reports_dir)")
    elif not check_only:
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(marker, config["study"] + "\n")


def base_dir(config: dict, size: str) -> str:
    """Directory (or hub id) of a size's base policy."""
    if is_ladder(size):
        return str(results(config) / "base" / f"size~{size}")
    return size


def prm_dir(config: dict, prm: str) -> str:
    if is_ladder(prm):
        return str(results(config) / "prm" / f"size~{prm}")
    return prm


def run_dir(config: dict, cell: Cell) -> Path:
    return results(config) / "runs" / cell.key


def rung_dir(run_folder: str | Path, budget: float) -> Path:
    """The snapshot folder of one rung inside a run folder."""
    return Path(run_folder) / f"budget~{format_budget(budget)}"
