"""Cells, rungs and the paths they live at: the names every stage agrees on.

A *cell* is one training run: (size, reward, allocation, seed). Its run key is the
Paramspace-style path ``size~S/reward~R/alloc~A/seed~N`` (a hub id's ``/`` becomes ``--`` so the
key stays one folder per level); it is the folder under ``results/runs/``, the MLflow run name
and the ``run_key`` tag. A *rung* is one of the nested budgets (model FLOPs) a run passes; its
snapshot lives in ``budget~<B>/`` inside the run folder, ``B`` written by :func:`format_budget`.

The grid a study makes of these, and the paths of its cells, are :class:`race.core.study.Study`'s;
this module holds only the names, and imports nothing heavier than the ladder's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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


def only_dots(name: str) -> bool:
    """``.``, ``..``, ...: a name the wildcards let through that a path reads as this or the
    parent folder (a study, reward or allocation name must not be one)."""
    return bool(name) and not name.strip(".")


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


def parse_key(key: str) -> dict[str, str]:
    """``size~S/reward~R/...`` as ``{"size": "S", "reward": "R", ...}``."""
    try:
        return dict(p.split("~", 1) for p in key.strip("/").split("/"))
    except ValueError:
        raise ConfigError(f"cell {key!r}: expected key~value parts joined by '/'") from None


def rung_dir(run_folder: str | Path, budget: float) -> Path:
    """The snapshot folder of one rung inside a run folder."""
    return Path(run_folder) / f"budget~{format_budget(budget)}"
