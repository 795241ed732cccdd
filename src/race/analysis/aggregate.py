"""``race aggregate``: the runs tables, from the run folders (the source of truth).

``results/runs.csv`` has one row per cell x budget rung (columns: :mod:`race.analysis.columns`;
``stage`` is ``full`` for a grid cell and ``validation`` for a validation-only seed), plus the
flags ``in_pilot`` (the pilot's seed at a pilot rung) and ``in_validation`` (a selected config,
a validation seed, at the validation budget). Base policies appear as budget-0 rows
(``stage`` ``base``, no FLOPs spent): the starting point of every curve.

``results/race/pilot.csv`` (``--pilot``) holds the pilot alone: what ``race select`` ranks.

``results/stages.csv`` is what the reports read: the same rows repeated once per RACE stage they
belong to (``pilot``, ``validation``, ``full``), so the pilot ranking, the validation and the
full grid each see their own rows.
"""

from __future__ import annotations

from pathlib import Path

from race.analysis import columns as cols
from race.core import cells as C
from race.core.outputs import read_output
from race.core.study import Study
from race.flops.peak import utilisation


def _eval_columns(ev: dict, targets: list[str]) -> dict:
    out = {}
    results = ev.get("targets", ev)
    for t in targets:
        r = results.get(t) or {}
        flops = r.get("flops") or {}
        out.update({f"acc_{t}": r.get("acc"), f"acc_{t}_lo": r.get("lo"),
                    f"acc_{t}_hi": r.get("hi"), f"n_{t}": r.get("n"),
                    f"eval_flops_{t}": flops.get("model")})
    return out


def _knobs(study: Study, alloc: str) -> dict:
    a = study.allocations[alloc]
    return {k: getattr(a, k) for k in cols.KNOB_COLUMNS}


def rung_row(study: Study, cell: C.Cell, budget: float, stage: str) -> dict:
    rung = C.rung_dir(study.run_dir(cell), budget)
    ledger = read_output(rung / "ledger.json")
    phases = ledger["phases"]
    base = size_params(study, cell.size)
    row = {"study": study.name, "stage": stage, "cell": cell.key, "size": cell.size,
           "reward": cell.reward, "alloc": cell.alloc, "seed": cell.seed, "budget": budget,
           **_knobs(study, cell.alloc),
           "steps": ledger["steps"], "updates": ledger["updates"],
           "rollouts": ledger["rollouts"], "prompts_seen": ledger["prompts_seen"],
           "flops_total": ledger["model_flops"], "exec_flops_total": ledger["executed_flops"],
           "p_learning": ledger["p_learning"], "max_step_flops": ledger["max_step_model_flops"],
           "wall_s": sum(p["wall_s"] for p in phases.values()),
           **base}
    for p in cols.BUDGET_PHASES:
        row[f"flops_{p}"] = phases[p]["model_flops"]
        row[f"exec_flops_{p}"] = phases[p]["executed_flops"]
        row[f"tokens_{p}"] = phases[p]["tokens"]
    row.update(perf_columns(phases, study.run_dir(cell)))
    row.update(_eval_columns(read_output(rung / "eval.json"), study.eval_targets))
    return row


def perf_columns(phases: dict, run_dir: Path) -> dict:
    """Seconds, achieved FLOP/s and utilisation per phase (:data:`columns.PERF_COLUMNS`)
    from a rung's ledger phases and the run's ``perf.json`` (its device and peak)."""
    perf_file = Path(run_dir) / C.PERF
    perf = read_output(perf_file) if perf_file.exists() else {}
    peak = perf.get("flops_per_s")
    row: dict = {"device": perf.get("name"), "peak_flops": peak}
    for p in cols.BUDGET_PHASES:
        seconds, executed = phases[p]["wall_s"], phases[p]["executed_flops"]
        row[f"seconds_{p}"] = seconds
        row[f"exec_flops_per_s_{p}"] = executed / seconds if seconds > 0 else None
        row[f"mfu_{p}"] = utilisation(executed, seconds, peak)
    return row


def size_params(study: Study, size: str) -> dict:
    """``params`` and ``non_embedding_params`` of a size: a ladder policy's ``pre.json``;
    otherwise its architecture (a model folder's config, or a known architecture), None for
    a hub id whose architecture is not known offline."""
    if C.is_ladder(size):
        pre = read_output(Path(study.base_dir(size)) / "pre.json")
        return {k: pre[k] for k in ("params", "non_embedding_params")}
    from race.flops.analytic import resolve_arch

    try:
        arch = resolve_arch(size)
    except (ValueError, KeyError, FileNotFoundError):
        return {"params": None, "non_embedding_params": None}
    return {"params": arch.params(), "non_embedding_params": arch.non_embedding_params()}


def base_rows(study: Study) -> list[dict]:
    """Budget-0 rows: each base policy, once per reward x allocation it starts."""
    rows = []
    for size in study.sizes:
        ev = read_output(study.base_eval(size))
        for reward in study.rewards:
            for alloc in study.allocations:
                row = {"study": study.name, "stage": "base",
                       "cell": C.cell_key(size, reward, alloc, study.seeds[0]),
                       "size": size, "reward": reward, "alloc": alloc,
                       "seed": study.seeds[0], "budget": 0.0, **_knobs(study, alloc),
                       "steps": 0, "updates": 0, "rollouts": 0, "prompts_seen": 0,
                       "p_learning": 0.0, "max_step_flops": 0, "wall_s": 0.0,
                       **size_params(study, size)}
                for p in ("total", *cols.BUDGET_PHASES):
                    row[f"flops_{p}"] = 0
                    row[f"exec_flops_{p}"] = 0
                for p in cols.BUDGET_PHASES:
                    row[f"tokens_{p}"] = 0
                    row[f"seconds_{p}"] = 0.0
                row.update(_eval_columns(ev, study.eval_targets))
                if not _same_reward(ev, study.reward(reward).to_dict()):
                    _blank_native(row)
                rows.append(row)
    return rows


def _same_reward(ev: dict, spec: dict) -> bool:
    """Whether an evaluation's native_reward was measured with the reward ``spec``."""
    measured = (ev.get("settings") or {}).get("reward")
    return measured is None or measured == spec


def _blank_native(row: dict) -> None:
    """A base policy is evaluated once, its native reward under one reward system (the
    first in the config): for the other systems that number would be another reward's, so
    it is left empty (the report lists it as missing) rather than shown as theirs."""
    for key in ("acc_native_reward", "acc_native_reward_lo", "acc_native_reward_hi",
                "n_native_reward", "eval_flops_native_reward"):
        if key in row:
            row[key] = None


def collect(study: Study, selected: list[dict] | None) -> list[dict]:
    """Every cell x rung row with its RACE membership flags."""
    pilot = {float(b) for b in study.pilot_rungs()}
    vb = study.validation_budget()
    chosen = {(s["size"], s["reward"], s["alloc"]) for s in selected or []}
    vseeds = set(study.race.validation_seeds)
    rows = []
    cells = [(c, "full") for c in study.grid_cells()]
    cells += [(c, "validation") for c in study.validation_cells(selected or [])]
    for cell, stage in cells:
        for budget in study.evaluated_rungs(cell):
            row = rung_row(study, cell, budget, stage)
            row["in_pilot"] = stage == "full" and cell.seed == study.seeds[0] and (
                budget in pilot)
            row["in_validation"] = ((cell.size, cell.reward, cell.alloc) in chosen
                                    and cell.seed in vseeds and budget == vb)
            rows.append(row)
    return rows


def stage_rows(rows: list[dict]) -> list[dict]:
    """Rows repeated once per stage they belong to (what the reports read)."""
    out = []
    for row in rows:
        if row["stage"] == "base":
            out.append(dict(row, stage="full"))
            continue
        if row["stage"] == "full":
            out.append(dict(row, stage="full"))
        if row["in_pilot"]:
            out.append(dict(row, stage="pilot"))
        if row["in_validation"]:
            out.append(dict(row, stage="validation"))
    return out


def pilot_rows(study: Study) -> list[dict]:
    """The pilot alone: every grid cell of the first seed at each pilot rung (``stage``
    ``pilot``). Only these evaluations are needed to select, so the validation runs can start
    while the grid's larger rungs are still being evaluated."""
    seed = study.seeds[0]
    rows = []
    for cell in study.grid_cells():
        if cell.seed != seed:
            continue
        for budget in study.pilot_rungs():
            row = rung_row(study, cell, float(budget), "pilot")
            rows.append(dict(row, in_pilot=True, in_validation=False))
    return rows


def _columns(study: Study) -> list[str]:
    return cols.all_columns(study.eval_targets) + ["in_pilot", "in_validation"]


def write_pilot_table(study: Study, out: str | Path) -> Path:
    """``race aggregate --pilot``: the pilot table that ``race select`` ranks."""
    import pandas as pd

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(pilot_rows(study), columns=_columns(study)).to_csv(out, index=False)
    return out


def write_tables(study: Study, out: str | Path, selected_path: str | None = None) -> Path:
    import pandas as pd

    selected = read_output(selected_path)["selected"] if selected_path else []
    rows = base_rows(study) + collect(study, selected)
    for row in rows:
        row.setdefault("in_pilot", False)
        row.setdefault("in_validation", False)
    columns = _columns(study)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=columns).to_csv(out, index=False)
    stages = out.with_name(out.stem.replace("runs", "stages") + out.suffix) if (
        "runs" in out.stem) else out.with_name(out.stem + "_stages.csv")
    pd.DataFrame(stage_rows(rows), columns=columns).to_csv(stages, index=False)
    return out
