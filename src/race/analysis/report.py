"""``reports/``: the tables, the six figures, ``report.md`` and ``summary.md``, from one runs
table: read the inputs, :func:`analyse` them into a :class:`~race.analysis.report_data.Report`
(:mod:`race.analysis.report_data`), and write every file (the Markdown comes from
:mod:`race.analysis.report_markdown`).

Entry point: :func:`write_reports`. Inputs and conventions:

- One runs table (columns: :mod:`race.analysis.columns`) whose ``stage`` column separates the RACE
  grids: "pilot", "validation", "full" (a table without the column is one full grid). Separate
  tables may be given for any stage (``pilot_csv`` ...): each replaces that stage's rows, and all
  of its rows are taken as that stage.
- ``config`` (a mapping, a YAML path, or None; the study config of :mod:`race.study.config`) is read
  for ``study`` (the name; a mapping with ``name`` works too; default: the table's ``study``
  column), ``eval.targets`` (the targets to report, in that order; default: every target with
  a value), ``race.targets`` (the first the report has is the findings' headline target;
  default: the first reported target), and ``rewards`` / ``eval.prm`` (which rewards each PRM
  serves). A configured target
  without a value in the table is listed in the report as not evaluated rather than failing.
- ``prm_records``: the ``prm.json`` files of the PRMs the study trained (the feedback-model
  table, :mod:`race.analysis.prm_quality`); none for a study without one.
- Output (all paths relative to ``out_dir``): runs.csv (the input, sorted), frontier.csv,
  regime.csv, missing.csv, pilot_rankings.csv, agreement.csv, agreement_ranks.csv,
  race_cost.csv, fits.csv, feedback.csv, power.csv (the prompts and seeds each undecided
  comparison needs: race.analysis.power), seed_checks.csv (race.analysis.seeds),
  time_frontier.csv (race.analysis.time_frontier), allocation_split.csv
  (race.analysis.splits), figures/<name>.png|svg (the overview grids), report.md (the
  findings first: its first 40 lines hold them), summary.md (the findings alone:
  race.analysis.findings), and the single-column figures for a paper
  (:mod:`race.analysis.paper_figures`):
  figures/<name>/<reward>/<target>.png|svg for frontier, regime_map, race_agreement and fits,
  figures/<name>/<reward>.png|svg for compute_breakdown and same_flop. Every file but the
  single-column ones is written on every run (empty tables keep their header; a figure whose
  input was not run says so), so a workflow can declare them all as outputs; the single-column
  files depend on the rewards and targets in the table, so each figure's folder
  (figures/<name>/) is the output to declare: it always exists, empty when the figure is not
  run, and holds exactly this report's files.
- Deterministic: rows sorted, floats written with ``%.10g`` (runs.csv keeps the input's values),
  no timestamps, no absolute paths in report.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from race.analysis import figures, paper_figures
from race.analysis.findings import headline_target
from race.analysis.fit import band_table, fit_table, rung_points
from race.analysis.frontier import (
    config_summary,
    frontier_table,
    load_runs,
    missing_cells,
    regime_table,
    sort_runs,
    split_stages,
    targets_in,
)
from race.analysis.power import power_table
from race.analysis.prm_quality import feedback_table, read_records
from race.analysis.protocol import (
    AGREEMENT_COLUMNS,
    RANK_COLUMNS,
    RANKING_COLUMNS,
    PilotCost,
    agreement,
    cost_dict,
    pilot_cost,
    rank_pilot,
)
from race.analysis.report_data import FIGURE_DIR, Report, nested_savings
from race.analysis.report_markdown import render, summary_md
from race.analysis.seeds import every_seed
from race.analysis.splits import allocation_split, reward_shares, steps_table
from race.analysis.time_frontier import time_frontier

#: Ten significant digits: budgets stay exact keys, accuracies stay readable.
FLOAT_FORMAT = "%.10g"


# ----------------------------------------------------------------------------------------------
# Inputs


def read_config(config: Mapping | str | Path | None) -> dict:
    """The study config as a dict: a mapping as is, None as {}, anything else through the one
    config reader (a YAML file, validated, or the workflow's JSON slice)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    from race.study.config import load_config

    return load_config(config)


def study_name(config: dict, runs: pd.DataFrame) -> str:
    study = config.get("study")
    if isinstance(study, Mapping):
        study = study.get("name")
    if study:
        return str(study)
    if "study" in runs.columns and runs["study"].notna().any():
        return ", ".join(sorted(runs["study"].dropna().astype(str).unique()))
    return "unnamed study"


def load_tables(runs_csv: str | Path, pilot_csv: str | Path | None = None,
                validation_csv: str | Path | None = None,
                full_csv: str | Path | None = None) -> pd.DataFrame:
    """The runs table with any per-stage table replacing that stage's rows."""
    runs = load_runs(runs_csv)
    for stage, path in (("pilot", pilot_csv), ("validation", validation_csv),
                        ("full", full_csv)):
        if path is None:
            continue
        extra = load_runs(path).assign(stage=stage)
        runs = pd.concat([runs[runs["stage"] != stage], extra], ignore_index=True)
    return runs


def analyse(runs: pd.DataFrame, targets: list[str] | None = None,
            study: str = "unnamed study", search_only_at_top: bool = False,
            workers: int = 1, race_targets: list[str] | None = None) -> Report:
    """Every table of the report from a normalised runs table (all stages); no I/O.
    ``search_only_at_top``: the study ran maj_k / prm_bon only at the base policy and each
    cell's top rung (``eval.search_at: base_and_top``). ``workers``: processes for the fits
    and their bands (the same tables for any number). ``race_targets``: the study's RACE
    targets, the first of which the findings speak of."""
    runs = sort_runs(runs)
    targets = targets_in(runs, targets)
    if not targets:
        raise ValueError("no acc_<target> column has a value; nothing to report")
    stages = split_stages(runs)
    pilot, val, full = (stages.get(s) for s in ("pilot", "validation", "full"))
    summary = config_summary(runs, targets)
    points, fits = rung_points(runs, targets), fit_table(runs, targets, workers=workers)
    frontier = frontier_table(runs, targets, summary)
    regime = regime_table(runs, targets, summary)
    seed_checks = every_seed(runs, frontier, regime, targets)
    return Report(
        study=study, runs=runs, targets=targets, summary=summary,
        frontier=frontier, regime=regime,
        missing=missing_cells(runs, targets, search_only_at_top),
        points=points, fits=fits, bands=band_table(points, fits, workers=workers),
        rankings=(rank_pilot(pilot, targets) if pilot is not None
                  else pd.DataFrame(columns=RANKING_COLUMNS)),
        agreement=(agreement(pilot, val, full, targets)
                   if pilot is not None and val is not None else None),
        cost=pilot_cost(pilot, val, full) if pilot is not None else None,
        savings=nested_savings(runs),
        headline=headline_target(targets, race_targets),
        power=power_table(runs, summary, frontier, regime, targets, seed_checks),
        seed_checks=seed_checks,
        time=time_frontier(runs, summary, frontier, targets),
        split=allocation_split(runs), steps=steps_table(runs), shares=reward_shares(runs),
    )


# ----------------------------------------------------------------------------------------------
# The writer


def _write_csv(df: pd.DataFrame, path: Path) -> Path:
    df.to_csv(path, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")
    return path


def write_tables(rep: Report, out: Path) -> list[Path]:
    """The CSV tables of a report (every file, header only when empty)."""
    ag = rep.agreement
    cost = [cost_dict(rep.cost)] if rep.cost else []
    return [
        _write_csv(rep.runs, out / "runs.csv"),
        _write_csv(rep.frontier, out / "frontier.csv"),
        _write_csv(rep.regime, out / "regime.csv"),
        _write_csv(rep.missing, out / "missing.csv"),
        _write_csv(rep.fits, out / "fits.csv"),
        _write_csv(rep.feedback, out / "feedback.csv"),
        _write_csv(rep.rankings, out / "pilot_rankings.csv"),
        _write_csv(ag.table if ag else pd.DataFrame(columns=AGREEMENT_COLUMNS),
                   out / "agreement.csv"),
        _write_csv(ag.ranks if ag else pd.DataFrame(columns=RANK_COLUMNS),
                   out / "agreement_ranks.csv"),
        _write_csv(pd.DataFrame(cost, columns=list(PilotCost.__dataclass_fields__)),
                   out / "race_cost.csv"),
        _write_csv(rep.power, out / "power.csv"),
        _write_csv(rep.seed_checks, out / "seed_checks.csv"),
        _write_csv(rep.time, out / "time_frontier.csv"),
        _write_csv(rep.split, out / "allocation_split.csv"),
    ]


def write_reports(runs_csv: str | Path, out_dir: str | Path,
                  config: Mapping | str | Path | None = None, *,
                  pilot_csv: str | Path | None = None, validation_csv: str | Path | None = None,
                  full_csv: str | Path | None = None, workers: int = 1,
                  prm_records: list[str | Path] | None = None) -> list[Path]:
    """Write every table, figure and report.md under ``out_dir``; return the paths, sorted.
    ``workers``: processes for the fits, bands and figures (the same files for any number);
    ``prm_records``: the trained PRMs' ``prm.json`` files."""
    cfg = read_config(config)
    records = read_records(prm_records or [])  # a bad record fails before any work
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_tables(runs_csv, pilot_csv, validation_csv, full_csv)
    section = cfg.get("eval")
    wanted = list(section.get("targets") or []) if isinstance(section, Mapping) else []
    available = targets_in(runs)
    targets = [t for t in wanted if t in available] or available
    search_at = section.get("search_at") if isinstance(section, Mapping) else None
    race = cfg.get("race") if isinstance(cfg.get("race"), Mapping) else {}
    rep = analyse(runs, targets, study_name(cfg, runs), search_at == "base_and_top", workers,
                  race.get("targets"))
    rep.targets_not_evaluated = [t for t in wanted if t not in available]
    rep.feedback = feedback_table(records, cfg)
    paths = write_tables(rep, out)
    data = rep.figure_data()
    figs = figures.write_all(data, out / FIGURE_DIR, workers)
    rep.figures = {n: [p.relative_to(out).as_posix() for p in ps] for n, ps in figs.items()}
    panels = paper_figures.write_panels(data, out / FIGURE_DIR, race.get("targets"), workers)
    rep.panels = {n: [p.relative_to(out).as_posix() for p in ps if p.suffix == ".png"]
                  for n, ps in panels.items()}
    md = out / "report.md"
    md.write_text(render(rep))
    summary = out / "summary.md"
    summary.write_text(summary_md(rep))
    paths += [md, summary]
    paths += [p for ps in figs.values() for p in ps]
    paths += [p for ps in panels.values() for p in ps]
    return sorted(paths)
