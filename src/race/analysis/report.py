"""``reports/``: the tables, the six figures and ``report.md``, from one runs table.

Entry point: :func:`write_reports`. Inputs and conventions:

- One runs table (columns: :mod:`race.analysis.columns`) whose ``stage`` column separates the RACE
  grids: "pilot", "validation", "full" (a table without the column is one full grid). Separate
  tables may be given for any stage (``pilot_csv`` ...): each replaces that stage's rows, and all
  of its rows are taken as that stage.
- ``config`` (a mapping, a YAML path, or None; the study config of :mod:`race.study.config`) is read
  for ``study`` (the name; a mapping with ``name`` works too; default: the table's ``study``
  column), ``eval.targets`` (the targets to report, in that order; default: every target with
  a value), and ``rewards`` / ``eval.prm`` (which rewards each PRM serves). A configured target
  without a value in the table is listed in the report as not evaluated rather than failing.
- ``prm_records``: the ``prm.json`` files of the PRMs the study trained (the feedback-model
  table, :mod:`race.analysis.prm_quality`); none for a study without one.
- Output (all paths relative to ``out_dir``): runs.csv (the input, sorted), frontier.csv,
  regime.csv, missing.csv, pilot_rankings.csv, agreement.csv, agreement_ranks.csv,
  race_cost.csv, fits.csv, feedback.csv, figures/<name>.png|svg (the overview grids),
  report.md, and the single-column figures for a paper (:mod:`race.analysis.paper_figures`):
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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from race.analysis import figures, paper_figures
from race.analysis.fit import band_table, fit_table, rung_points
from race.analysis.frontier import (
    CELL_KEYS,
    DECIDED_Z,
    config_summary,
    frontier_table,
    load_runs,
    missing_cells,
    pooled,
    regime_table,
    size_order,
    sort_runs,
    split_stages,
    targets_in,
)
from race.analysis.markdown import (
    FLOP_CONVENTIONS,
    agreement_md,
    decided_counts,
    decided_md,
    fits_md,
    flops,
    frontier_md,
    missing_md,
    panel_links,
    pct,
    pts,
    regime_md,
    target,
)
from race.analysis.prm_quality import FEEDBACK_COLUMNS, feedback_md, feedback_table, read_records
from race.analysis.protocol import (
    AGREEMENT_COLUMNS,
    RANK_COLUMNS,
    RANKING_COLUMNS,
    Agreement,
    PilotCost,
    agreement,
    cost_dict,
    pilot_cost,
    rank_pilot,
)

#: Ten significant digits: budgets stay exact keys, accuracies stay readable.
FLOAT_FORMAT = "%.10g"
FIGURE_DIR = "figures"

_CAPTIONS = {
    "frontier": "accuracy vs training compute per size × allocation; the grey line joins each "
                "budget's best config; error bars are 95% intervals.",
    "compute_breakdown": "share of model FLOPs spent in rollout, learning and reward per "
                         "config at its largest rung.",
    "same_flop": "optimizer updates and rollouts each allocation buys at the same budget "
                 "(linear count axes).",
    "regime_map": "winning allocation per budget rung and policy size, coloured only when "
                  f"decided (z ≥ {DECIDED_Z:g}); grey: tie; hatched: undecided, with its z.",
    "race_agreement": "pilot rank vs validation rank per config, with Spearman ρ, regret and "
                      "top-1 agreement.",
    "fits": "mean accuracy per rung and the fitted sigmoid R(C) per config, drawn only over "
            "the FLOPs that config was run at (no extrapolation), with a shaded pointwise 95% "
            "band: the spread of refits to the rungs redrawn within their evaluation intervals "
            "(parametric bootstrap, 200 replicates).",
}


def _panel_note(name: str) -> str:
    split = ("reward and RACE target (race.targets; all targets without one)"
             if name in paper_figures.PER_TARGET else "reward")
    return (f" Single-column versions, one per {split} ({paper_figures.COLUMN_W:g} in wide, "
            f"text ≥ {paper_figures.MIN_PT} pt): `{FIGURE_DIR}/{paper_figures.pattern(name)}"
            ".png` and `.svg`.")


#: Each figure's caption (report.md and the Snakemake report), naming its single-column files.
FIGURE_CAPTIONS = {name: caption + _panel_note(name) for name, caption in _CAPTIONS.items()}


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


# ----------------------------------------------------------------------------------------------
# Derived numbers


@dataclass(frozen=True)
class NestedSavings:
    """Model FLOPs with nested rungs (one run per cell) vs one run per (cell, rung)."""

    n_cells: int
    n_rungs: int  # (cell, rung) rows
    separate_flops: float  # sum over cells of the FLOPs used at every rung
    nested_flops: float  # sum over cells of the FLOPs used at the largest rung
    saved_flops: float

    @property
    def saved_share(self) -> float:
        return self.saved_flops / self.separate_flops if self.separate_flops else math.nan


def nested_savings(runs: pd.DataFrame) -> NestedSavings:
    """Saved = sum over runs of (sum over its rungs of FLOPs used - the largest rung's).

    A run is a cell (size, reward, alloc, seed), whichever grids name it: the pilot is the
    first seed's grid cells at the cheap rungs, and a validated config at a seed the grid runs
    is that same run carried on to the validation budget. So each (cell, rung) counts once,
    not once per grid that lists it; the base rows (budget 0: no RL step) are no rung.
    """
    rungs = runs[runs["budget"] > 0].drop_duplicates(CELL_KEYS + ["budget"])
    g = rungs.groupby(CELL_KEYS)["flops_total"]
    separate, nested = float(g.sum().sum()), float(g.max().sum())
    return NestedSavings(int(g.ngroups), int(len(rungs)), separate, nested, separate - nested)


def median_interval_width(runs: pd.DataFrame, targets: list[str]) -> float:
    """Median width (fraction) of the per-row 95% evaluation intervals over all targets."""
    widths = [runs[f"acc_{t}_hi"] - runs[f"acc_{t}_lo"] for t in targets
              if f"acc_{t}_hi" in runs.columns and f"acc_{t}_lo" in runs.columns]
    if not widths:
        return math.nan
    return float(pd.concat(widths).median())


def seed_spread(runs: pd.DataFrame, target: str) -> tuple[float, float, int]:
    """How far one config's seeds land apart at one rung: (largest, median, how many groups),
    accuracy points (max - min over the seeds of a (size, reward, alloc, budget) with two or
    more seeds, stages pooled). NaNs and 0 groups when no config ran on two seeds."""
    col = f"acc_{target}"
    pool = pooled(runs).dropna(subset=[col])
    g = pool.groupby(["size", "reward", "alloc", "budget"])[col]
    spread = 100 * (g.max() - g.min())[g.count() >= 2]
    if spread.empty:
        return math.nan, math.nan, 0
    return float(spread.max()), float(spread.median()), int(len(spread))


def seed_spread_text(runs: pd.DataFrame, targets: list[str]) -> str:
    """The caveat that one seed's interval holds no training noise, with the measured spread."""
    parts = []
    for t in targets:
        top, median, n = seed_spread(runs, t)
        if n:
            parts.append(f"{target(t)}: up to {pts(top)} points (median {pts(median)}, "
                         f"{n} configs × rungs)")
    measured = ("; where a config ran on several seeds, they land this far apart: "
                + "; ".join(parts)
                + ". A one-seed gap of that size can come from the training seed alone"
                if parts else "; no config ran on two seeds here, so that noise is not measured")
    return ("- A one-seed interval holds the evaluation's noise only, not the training seed's"
            f"{measured}. The z of a gap adds the two configs' evaluation variances as if "
            "independent, although both are scored on the same prompts (paired, the evaluation "
            "part of a gap's noise is smaller; `bench/study/study_gates.py` prints that z): the "
            "excess stands in for the training noise a one-seed z cannot measure.")


# ----------------------------------------------------------------------------------------------
# The writer


@dataclass
class Report:
    """Everything the tables, figures and report.md are made from (:func:`analyse`)."""

    study: str
    runs: pd.DataFrame  # all stages, sorted
    targets: list[str]
    summary: pd.DataFrame  # seed summary per reward, target, budget, size, alloc
    frontier: pd.DataFrame
    regime: pd.DataFrame
    missing: pd.DataFrame
    points: pd.DataFrame  # fit inputs: mean FLOPs and accuracy per config, target and rung
    fits: pd.DataFrame
    bands: pd.DataFrame  # the fits' drawn curves and 95% bands (race.analysis.fit.band_table)
    rankings: pd.DataFrame  # pilot ranking (empty without pilot rows)
    agreement: Agreement | None  # None without pilot or validation rows
    cost: PilotCost | None  # None without pilot rows
    savings: NestedSavings
    #: name -> [png, svg] relative to the report's directory (filled when written)
    figures: dict[str, list[str]] = field(default_factory=dict)
    #: name -> its single-column PNGs relative to the report's directory (filled when written)
    panels: dict[str, list[str]] = field(default_factory=dict)
    #: configured targets with no value in the table
    targets_not_evaluated: list[str] = field(default_factory=list)
    #: the trained PRMs' held-out quality (race.analysis.prm_quality), empty without one
    feedback: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=FEEDBACK_COLUMNS))

    def figure_data(self) -> figures.FigureData:
        return figures.FigureData(runs=self.runs, summary=self.summary, frontier=self.frontier,
                                  regime=self.regime, points=self.points, fits=self.fits,
                                  bands=self.bands, targets=self.targets,
                                  agreement=self.agreement)

    @property
    def not_run(self) -> list[str]:
        """Figures that say "not run" (their input grid is absent)."""
        return figures.not_run_figures(self.figure_data())


def analyse(runs: pd.DataFrame, targets: list[str] | None = None,
            study: str = "unnamed study", search_only_at_top: bool = False,
            workers: int = 1) -> Report:
    """Every table of the report from a normalised runs table (all stages); no I/O.
    ``search_only_at_top``: the study ran maj_k / prm_bon only at the base policy and each
    cell's top rung (``eval.search_at: base_and_top``). ``workers``: processes for the fits
    and their bands (the same tables for any number)."""
    runs = sort_runs(runs)
    targets = targets_in(runs, targets)
    if not targets:
        raise ValueError("no acc_<target> column has a value; nothing to report")
    stages = split_stages(runs)
    pilot, val, full = (stages.get(s) for s in ("pilot", "validation", "full"))
    summary = config_summary(runs, targets)
    points, fits = rung_points(runs, targets), fit_table(runs, targets, workers=workers)
    return Report(
        study=study, runs=runs, targets=targets, summary=summary,
        frontier=frontier_table(runs, targets, summary),
        regime=regime_table(runs, targets, summary),
        missing=missing_cells(runs, targets, search_only_at_top),
        points=points, fits=fits, bands=band_table(points, fits, workers=workers),
        rankings=(rank_pilot(pilot, targets) if pilot is not None
                  else pd.DataFrame(columns=RANKING_COLUMNS)),
        agreement=(agreement(pilot, val, full, targets)
                   if pilot is not None and val is not None else None),
        cost=pilot_cost(pilot, val, full) if pilot is not None else None,
        savings=nested_savings(runs),
    )


def _stage_line(runs: pd.DataFrame) -> str:
    lines = []
    stages = split_stages(runs)
    for stage in ["pilot", "validation", "full"] + sorted(set(stages) - {"pilot", "validation",
                                                                            "full"}):
        if stage not in stages:
            lines.append(f"- **{stage}**: not run.")
            continue
        g = stages[stage]
        n_cfg = len(g[["size", "reward", "alloc"]].drop_duplicates())
        budgets = ", ".join(flops(b) for b in sorted(g["budget"].unique()))
        lines.append(f"- **{stage}**: {len(g)} rows, {n_cfg} configs (size × reward × alloc), "
                     f"{g['seed'].nunique()} seed(s), budget rungs {budgets} model FLOPs.")
    return "\n".join(lines)


def render(rep: Report) -> str:
    """report.md as a string (pure function of the tables: deterministic)."""
    runs = rep.runs
    sizes = size_order(runs) if len(runs) else []
    # Over the comparable rows, as the decided counts (no base rung, no "no value" rows).
    f = rep.frontier
    comparable = f[(f["budget"] > 0) & (f["n_candidates"] >= 2)]
    n_overlap = sum(1 for v in comparable["overlap"] if v is not pd.NA and bool(v))
    n_tie = int(comparable["tie"].sum()) if len(comparable) else 0
    f_dec, f_all = decided_counts(rep.frontier)
    r_dec, r_all = decided_counts(rep.regime)
    width = median_interval_width(runs, rep.targets)
    win_width = float((rep.frontier["acc_hi"] - rep.frontier["acc_lo"]).median()) \
        if len(rep.frontier) else math.nan
    seeds = {s: g["seed"].nunique() for s, g in split_stages(runs).items()}
    sv = rep.savings

    out = [f"# RACE report: {rep.study}", ""]
    out += ["## The question", "",
            "Under a fixed RL post-training FLOP budget, where should the compute go: into a "
            "larger policy, more updates of a smaller one, more rollouts per prompt (search), or "
            "a stronger reward model? Each table answers it per reward system, evaluation target "
            "and budget rung: the frontiers differ by target.", ""]
    out += ["## What was run", "",
            f"Policy sizes: {', '.join(sizes) or '–'}. Reward systems: "
            f"{', '.join(sorted(runs['reward'].unique())) if len(runs) else '–'}. Allocations: "
            f"{', '.join(sorted(runs['alloc'].unique())) if len(runs) else '–'}. Targets: "
            f"{', '.join(target(t) for t in rep.targets) or '–'}."
            + (f" Configured but not evaluated (no values in the table): "
               f"{', '.join(target(t) for t in rep.targets_not_evaluated)}."
               if rep.targets_not_evaluated else ""), "",
            _stage_line(runs), ""]
    out += ["## FLOP conventions", "", FLOP_CONVENTIONS, ""]
    out += ["## Feedback models", "",
            "Each PRM this study trained, on the sampled completions of prompts it was not "
            "trained on: step AUC over all steps, over the step lines alone (an answer line is "
            "correct whenever it repeats the last stated result, an easy positive), accuracy "
            "at 0.5, and per error family the AUC of the correct steps against that family's "
            "wrong steps (their number in brackets). A family near 0.5 is an error the PRM "
            "does not see: as a reward, it pays for it. `feedback.csv`.", "",
            feedback_md(rep.feedback), ""]
    out += ["## Frontier: the best config at each budget", "",
            "Per reward × target × budget rung, the (size, allocation) with the highest mean "
            "accuracy over seeds, pooled over the pilot, validation and full grids (a run "
            "present in two grids counts once). One seed: the evaluation's own 95% interval; "
            "several: mean ± 1.96·se with se² = max(seed variance / k, mean binomial variance) "
            "(the seeds share the evaluation prompts, so the evaluation's variance is a floor "
            "that does not shrink with k). The gap is to the runner-up, in accuracy points; "
            "z = gap / its standard error. "
            "Ties are listed as a|b, never broken. Full table: `frontier.csv`.", "",
            frontier_md(rep.frontier) if len(rep.frontier) else "No runs.", ""]
    out += ["## Decided winners", "",
            f"A winner is decided when it leads every other candidate by z ≥ {DECIDED_Z:g} "
            "standard errors of the gap (the two-sided 95% level of every interval here; the "
            "z shown is the runner-up's). A tie, a smaller z, a missing z and a lone candidate "
            "(nothing to compare it with) count as undecided: read those as no answer, not as "
            "a win. Counted over the comparable rows: trained rungs (at the base rung every "
            "allocation is the same policy) with at least two candidates holding a value.", "",
            decided_md(rep.frontier, rep.regime, rep.targets), ""]
    out += ["## Regime: the winning allocation per size", "",
            "Per reward × target: the allocation with the highest mean accuracy at each policy "
            "size and budget rung (`regime.csv` has accuracies, gaps and runner-ups). A cell "
            f"names its winner only when decided (z ≥ {DECIDED_Z:g}); otherwise it reads "
            "\"undecided (leader vs runner-up, z)\".", "",
            regime_md(rep.regime, sizes, rep.targets), ""]
    out += ["## RACE: does the pilot predict the validation ranking?", "",
            "A diagnostic, not a guarantee: the pilot ranks every config cheaply with one seed at "
            "small budgets; the selected top-k plus the baseline are rerun at the validation "
            "budget with more seeds. `agreement.csv`, `agreement_ranks.csv`, "
            "`pilot_rankings.csv`, `race_cost.csv`.", "",
            agreement_md(rep.agreement, rep.cost), ""]
    out += ["## Compute–performance fits", "",
            "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) per config and target, least squares in "
            "log C over the mean accuracy per rung (A: asymptote, B: steepness per e-fold of "
            "compute, C_mid: FLOPs at the midpoint; R0 is the base policy's accuracy where it "
            "was evaluated, else fitted). Held-out error = 100 × (prediction − observation) at "
            "the largest rung from a fit to the others. Fewer rungs than free parameters: "
            "\"insufficient rungs\", no fit. The fits figure draws each curve only over the FLOPs "
            "its config was run at, with a pointwise 95% band from refits to the rungs redrawn "
            "within their evaluation intervals (parametric bootstrap). Full table: `fits.csv`.",
            "",
            fits_md(rep.fits) if len(rep.fits) else "No runs.", ""]
    out += ["## Figures", ""]
    not_run = rep.not_run
    for name in figures.FIGURE_NAMES:
        png, svg = rep.figures[name]
        state = " **Not run** (the figure says why)." if name in not_run else ""
        out += [f"- **{name}**: {FIGURE_CAPTIONS[name]}{state} ([SVG]({svg}))", "",
                f"  ![{name}]({png})", "",
                "  " + panel_links(rep.panels.get(name, []), f"{FIGURE_DIR}/{name}/"), ""]
    out += ["## Nested budget rungs", "",
            f"Each of the {sv.n_cells} cells (size × reward × alloc × seed; one run, whichever "
            "of the pilot, validation and full grids list it) is evaluated at its rungs in the "
            f"table ({sv.n_rungs} cell × rung pairs; a validation-only seed at the validation "
            "budget alone). Run "
            f"separately, the rungs would cost {flops(sv.separate_flops)} model FLOPs (sum over "
            f"cells of the FLOPs used at every rung); nested, they cost "
            f"{flops(sv.nested_flops)} (the largest rung of each cell): "
            f"{flops(sv.saved_flops)} saved ({pct(sv.saved_share)}). This holds for a "
            "budget-independent (constant) learning-rate schedule; a schedule that depends on "
            "the budget needs one run per rung.", ""]
    out += ["## Missing cells", "", missing_md(rep.missing), ""]
    seeds_txt = ", ".join(f"{s}: {n}" for s, n in sorted(seeds.items())) or "–"
    out += ["## Caveats", "",
            "- RACE is a diagnostic, not a guarantee: a pilot ranking at small budgets can "
            "reorder at larger ones (see ρ and regret above), and only the selected configs are "
            "checked at the validation budget unless the full grid was run.",
            f"- Seeds per stage: {seeds_txt}. Pilot rankings rest on one seed; intervals across "
            "2–3 seeds use a normal approximation and are optimistic.",
            seed_spread_text(runs, rep.targets),
            f"- Median width of a row's 95% evaluation interval: {pts(100 * width)} accuracy "
            f"points; of the frontier winners' intervals: {pts(100 * win_width)} points. "
            f"{n_overlap} of {len(comparable)} comparable frontier winners overlap their "
            f"runner-up's interval, and {n_tie} are exact ties: read those as undecided. Decided "
            f"(z ≥ {DECIDED_Z:g}): {f_dec} of {f_all} comparable frontier winners, {r_dec} of "
            f"{r_all} comparable regime cells.",
            "- Fits extrapolate a four-parameter curve from a handful of rungs; trust the "
            "held-out error, not the asymptote, when they disagree.",
            "- FLOPs are analytic model FLOPs (see conventions); wall time and executed FLOPs "
            "can rank allocations differently.", ""]
    return "\n".join(out)


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
    rep = analyse(runs, targets, study_name(cfg, runs), search_at == "base_and_top", workers)
    rep.targets_not_evaluated = [t for t in wanted if t not in available]
    rep.feedback = feedback_table(records, cfg)
    paths = write_tables(rep, out)
    data = rep.figure_data()
    figs = figures.write_all(data, out / FIGURE_DIR, workers)
    rep.figures = {n: [p.relative_to(out).as_posix() for p in ps] for n, ps in figs.items()}
    race = cfg.get("race") if isinstance(cfg.get("race"), Mapping) else {}
    panels = paper_figures.write_panels(data, out / FIGURE_DIR, race.get("targets"), workers)
    rep.panels = {n: [p.relative_to(out).as_posix() for p in ps if p.suffix == ".png"]
                  for n, ps in panels.items()}
    md = out / "report.md"
    md.write_text(render(rep))
    paths.append(md)
    paths += [p for ps in figs.values() for p in ps]
    paths += [p for ps in panels.values() for p in ps]
    return sorted(paths)
