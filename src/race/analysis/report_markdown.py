"""``report.md`` and ``summary.md`` as strings, from a :class:`~race.analysis.report_data.Report`:
the findings, the figures' captions (:data:`FIGURE_CAPTIONS`, also the Snakemake report's), the
sections behind the findings and the appendix tables (:func:`render`, :func:`summary_md`).
Pure functions of the tables: deterministic, no I/O."""

from __future__ import annotations

import math

import pandas as pd

from race.analysis import figures, paper_figures
from race.analysis.findings import (
    allocation_sentence,
    frontier_sentence,
    race_sentence,
    reward_sentence,
    rl_sentence,
    seeds_sentence,
    time_sentence,
    undecided_sentence,
)
from race.analysis.findings_tables import power_counts_md, power_md, split_md, time_md, winners_md
from race.analysis.frontier import DECIDED_Z, pooled, size_order, split_stages
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
from race.analysis.power import POWER, z_beta
from race.analysis.prm_quality import feedback_md
from race.analysis.report_data import FIGURE_DIR, Report

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


def asked(table: pd.DataFrame, missing: pd.DataFrame) -> pd.DataFrame:
    """The rows of a frontier or regime table that hold a question: a value, or a missing cell
    (:func:`race.analysis.frontier.missing_cells`) that should have given one. A row with no
    value and nothing missing is a target that by design does not run at that rung (a search
    target between the base and the top rung, a native reward at the base rung under another
    reward system), so the report shows no "no value" row for it."""
    if table.empty:
        return table
    by_size = "size" in table.columns
    gone: set[tuple] = set()
    for m in missing.itertuples(index=False):
        for t in (table["target"].unique() if m.target == "all" else [m.target]):
            gone.add((m.reward, t, m.budget) + ((m.size,) if by_size else ()))
    keys = ["reward", "target", "budget"] + (["size"] if by_size else [])
    expected = [tuple(k) in gone for k in table[keys].itertuples(index=False, name=None)]
    return table[(table["n_candidates"] > 0) | pd.Series(expected, index=table.index)]


def findings_md(rep: Report) -> str:
    """The study's answer (the Findings section and summary.md, without a heading): one
    sentence per question (race.analysis.findings), then the headline target's winners per
    reward and rung, and the allocations' splits and steps."""
    t, sizes = rep.headline, size_order(rep.runs) if len(rep.runs) else []
    agreement_table = rep.agreement.table if rep.agreement is not None else None
    sentences = [
        frontier_sentence(rep.frontier, t),
        rl_sentence(rep.summary, t, sizes),
        reward_sentence(rep.summary, rep.shares, t),
        allocation_sentence(rep.split, rep.steps),
        race_sentence(agreement_table, rep.cost, t),
        seeds_sentence(rep.seed_checks, t),
        undecided_sentence(rep.frontier, rep.regime, rep.power, t),
        time_sentence(rep.time, t),
    ]
    out = [f"Headline target: {target(t)}. Accuracies are fractions with 95% intervals, gaps "
           f"accuracy points; \"decided\" means z ≥ {DECIDED_Z:g}, and anything short of it is "
           "undecided: read it as no answer.", ""]
    out += [f"{i}. {s}" for i, s in enumerate(sentences, 1)]
    winners = winners_md(rep.frontier, t)
    if winners:
        out += ["", f"**Frontier winners on {target(t)}** (bold: decided; \"?\": undecided, "
                "with its z):", "", winners]
    split = split_md(rep.split, rep.steps, sizes)
    if split:
        out += ["", "**Allocations**: share of model FLOPs per phase at the largest rung (mean "
                "over sizes and reward systems) and the median optimizer steps to each rung:",
                "", split]
    return "\n".join(out)


def summary_md(rep: Report) -> str:
    """summary.md: the findings alone."""
    return f"# RACE findings: {rep.study}\n\n{findings_md(rep)}\n"


def figures_md(rep: Report) -> str:
    """Each figure's caption, its single-column (paper-sized) panels, and the overview grid."""
    out = []
    not_run = rep.not_run
    for name in figures.FIGURE_NAMES:
        png, svg = rep.figures[name]
        state = " **Not run** (the figure says why)." if name in not_run else ""
        panels = rep.panels.get(name, [])
        prefix = f"{FIGURE_DIR}/{name}/"
        out += [f"**{name}**: {FIGURE_CAPTIONS[name]}{state} Overview grid: [PNG]({png}) · "
                f"[SVG]({svg}).", ""]
        if panels:
            out += [" ".join(f"![{p.removeprefix(prefix).removesuffix('.png')}]({p})"
                             for p in panels), ""]
        else:
            out += ["  " + panel_links(panels, prefix), ""]
    return "\n".join(out)


def power_section(rep: Report) -> list[str]:
    zb = z_beta(POWER)
    scale = ((DECIDED_Z + z_beta(0.8)) / (DECIDED_Z + zb)) ** 2
    return ["## How far from an answer", "",
            "For each undecided comparison, the evaluation prompts and the training seeds that "
            f"would put its observed gap at z = {DECIDED_Z:g} if the gap held "
            "(`race.analysis.power`). Prompts: a paired comparison on the same prompts, n = "
            "(z · σ_d / d)² with σ_d² = σ_A² + σ_B², each σ² one prompt's score variance from "
            "the row's own interval (n · se²: p(1 − p) for greedy pass@1, the k-sample mean's "
            "for sampled pass@1); the two configs' correlation on shared prompts is not in "
            "the tables and is set to 0, so n is an upper bound. Seeds: k = z² · 2s² / d² per "
            "config, s² the seed variance pooled over every config × rung run on two or more "
            "seeds. Each count is the minimum with the other noise gone; with both, 2n prompts "
            "and 2k seeds reach z. These are the counts at which the expected z is "
            f"{DECIDED_Z:g} (even odds of deciding); 80% power needs {scale:.1f}× as many. "
            "`race plan --gap D --accuracy P` answers the same for a planned gap. Every "
            "undecided frontier winner and regime cell: `power.csv`; the largest rung's "
            "frontier winners:", "",
            power_md(rep.power), "", power_counts_md(rep.power, rep.targets), ""]


def time_section(rep: Report) -> list[str]:
    if rep.time.empty:
        return ["## Seconds beside FLOPs", "",
                "No run recorded its seconds: the frontier on measured time is not drawn.", ""]
    d = rep.time[rep.time["differs"].astype(bool)]
    return ["## Seconds beside FLOPs", "",
            f"The frontier at equal measured seconds on {rep.time['device'].iloc[0]} "
            "(`race.analysis.time_frontier`): each FLOP rung is matched with a time budget, "
            "the median over a reward system's configs of their seconds to that rung (rollout, "
            "learning and reward seconds of the run's ledger); within it each config delivers "
            "its last rung reached, and the winner is ranked as the FLOP frontier's. "
            f"The time winner differs from the FLOP winner in {len(d)} of {len(rep.time)} "
            f"(reward, target, rung) comparisons (`time_frontier.csv`). On {target(rep.headline)} "
            "(\"?\": not decided):", "",
            time_md(rep.time, rep.headline), ""]


def render(rep: Report) -> str:
    """report.md as a string (pure function of the tables: deterministic). The findings come
    first (the first 40 lines hold them), then the figures, the sections behind the findings,
    and the full frontier and regime tables as an appendix."""
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
    out += ["## Findings", "", findings_md(rep), ""]
    out += ["## Figures", "",
            "Each figure's single-column panels (3.4 in wide, for a paper) under its caption; "
            "the overview grid of every reward and target is linked.", "",
            figures_md(rep)]
    out += power_section(rep)
    out += time_section(rep)
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
    out += ["## Decided winners", "",
            f"A winner is decided when it leads every other candidate by z ≥ {DECIDED_Z:g} "
            "standard errors of the gap (the two-sided 95% level of every interval here; the "
            "z shown is the runner-up's). A tie, a smaller z, a missing z and a lone candidate "
            "(nothing to compare it with) count as undecided: read those as no answer, not as "
            "a win. Counted over the comparable rows: trained rungs (at the base rung every "
            "allocation is the same policy) with at least two candidates holding a value.", "",
            decided_md(rep.frontier, rep.regime, rep.targets), ""]
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
    out += ["## Feedback models", "",
            "Each PRM this study trained, on the sampled completions of prompts it was not "
            "trained on: step AUC over all steps, over the step lines alone (an answer line is "
            "correct whenever it repeats the last stated result, an easy positive), accuracy "
            "at 0.5, and per error family the AUC of the correct steps against that family's "
            "wrong steps (their number in brackets). A family near 0.5 is an error the PRM "
            "does not see: as a reward, it pays for it. `feedback.csv`.", "",
            feedback_md(rep.feedback), ""]
    out += ["## FLOP conventions", "", FLOP_CONVENTIONS, ""]
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
            "can rank allocations differently (\"Seconds beside FLOPs\").", ""]
    frontier_rows = asked(rep.frontier, rep.missing)
    out += ["## Frontier: the best config at each budget (appendix)", "",
            "Per reward × target × budget rung, the (size, allocation) with the highest mean "
            "accuracy over seeds, pooled over the pilot, validation and full grids (a run "
            "present in two grids counts once). One seed: the evaluation's own 95% interval; "
            "several: mean ± 1.96·se with se² = max(seed variance / k, mean binomial variance) "
            "(the seeds share the evaluation prompts, so the evaluation's variance is a floor "
            "that does not shrink with k). The gap is to the runner-up, in accuracy points; "
            "z = gap / its standard error. "
            "Ties are listed as a|b, never broken. A target that by design does not run at a "
            "rung (eval.search_at) has no row there. `frontier.csv`.", "",
            frontier_md(frontier_rows, max_rows=None) if len(frontier_rows) else "No runs.", ""]
    out += ["## Regime: the winning allocation per size (appendix)", "",
            "Per reward × target: the allocation with the highest mean accuracy at each policy "
            "size and budget rung (`regime.csv` has accuracies, gaps and runner-ups). A cell "
            f"names its winner only when decided (z ≥ {DECIDED_Z:g}); otherwise it reads "
            "\"undecided (leader vs runner-up, z)\".", "",
            regime_md(asked(rep.regime, rep.missing), sizes, rep.targets), ""]
    return "\n".join(out)
