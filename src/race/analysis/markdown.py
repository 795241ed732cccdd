"""The pieces of ``report.md``: number formats, Markdown tables, and the text that states the
FLOP conventions (used by :func:`race.analysis.report_markdown.render`)."""

from __future__ import annotations

import math

import pandas as pd

from race.analysis.columns import TARGET_LABELS
from race.analysis.frontier import DECIDED_Z
from race.analysis.protocol import Agreement, PilotCost

#: Rows of a long table shown in report.md; the rest are in the CSV (the report says so).
MD_MAX_ROWS = 60


def num(x: object, fmt: str) -> str:
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, fmt)


def flops(x: object) -> str:
    return num(x, ".2e").replace("e+", "e")


def acc(x: object) -> str:
    return num(x, ".3f")


def pts(x: object) -> str:
    return num(x, ".1f")


def interval(lo: object, hi: object) -> str:
    return f"[{acc(lo)}, {acc(hi)}]"


def yes(x: object) -> str:
    if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return "yes" if bool(x) else "no"


def md_table(rows: list[list[str]], header: list[str]) -> str:
    """A pipe table; "|" inside a cell (ties) is escaped."""
    def cell(v: str) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def truncated(n_rows: int, csv_name: str) -> str:
    if n_rows <= MD_MAX_ROWS:
        return ""
    return f"\n\nFirst {MD_MAX_ROWS} of {n_rows} rows shown; all of them are in `{csv_name}`."


def target(t: str) -> str:
    return TARGET_LABELS.get(t, t)


def frontier_md(frontier: pd.DataFrame, max_rows: int | None = MD_MAX_ROWS) -> str:
    """The frontier table, its first ``max_rows`` rows (None: all of them)."""
    header = ["reward", "target", "budget (FLOPs)", "best size/alloc", "accuracy", "95% interval",
              "seeds", "runner-up", "gap (pts)", "gap z", "intervals overlap",
              f"decided (z ≥ {DECIDED_Z:g})"]
    rows = []
    shown = frontier if max_rows is None else frontier.head(max_rows)
    for r in shown.itertuples(index=False):
        best = r.best + (" (tie)" if r.tie else "") if r.best else "no value"
        rows.append([r.reward, target(r.target), flops(r.budget), best, acc(r.acc),
                     interval(r.acc_lo, r.acc_hi), str(r.n_seeds), r.runner_up or "–",
                     pts(100 * r.gap if pd.notna(r.gap) else math.nan),
                     num(r.gap_z, ".2f"), yes(r.overlap), yes(r.decided)])
    return md_table(rows, header) + (truncated(len(frontier), "frontier.csv")
                                     if max_rows is not None else "")


def regime_cell_md(r: object) -> str:
    """One regime-map cell: the allocation only when decided, else why not."""
    if not r.best_alloc:
        return "no value"
    if r.tie:
        return f"{r.best_alloc} (tie)"
    if r.decided:
        return r.best_alloc
    if not r.runner_up:
        return f"undecided ({r.best_alloc} alone)"
    return f"undecided ({r.best_alloc} vs {r.runner_up}, z={num(r.gap_z, '.1f')})"


def decided_counts(table: pd.DataFrame) -> tuple[int, int]:
    """(decided rows, comparable rows). A row is comparable when it has a question to answer:
    a trained rung (budget > 0: at the base rung every allocation is the same base policy)
    with at least two candidates holding a value (a search target between the base and the
    top rung has none). A comparable row that is tied or below the z line is undecided."""
    comparable = (table["budget"] > 0) & (table["n_candidates"] >= 2)
    return int((table["decided"].astype(bool) & comparable).sum()), int(comparable.sum())


def decided_md(frontier: pd.DataFrame, regime: pd.DataFrame, targets: list[str]) -> str:
    """Per reward and target, how many frontier winners and regime cells are decided."""
    rewards = sorted(set(frontier["reward"]) | set(regime["reward"]))
    lines = []
    for reward in rewards:
        for t in targets:
            f = frontier[(frontier["reward"] == reward) & (frontier["target"] == t)]
            g = regime[(regime["reward"] == reward) & (regime["target"] == t)]
            if f.empty and g.empty:
                continue
            (fd, fn), (gd, gn) = decided_counts(f), decided_counts(g)
            lines.append(f"- {reward} reward · {target(t)}: {fd} of {fn} comparable frontier "
                         f"winners and {gd} of {gn} comparable regime cells decided "
                         f"(z ≥ {DECIDED_Z:g}).")
    return "\n".join(lines) or "No runs."


def regime_md(regime: pd.DataFrame, sizes: list[str], targets: list[str]) -> str:
    """One budget x size table per (reward, target), cells = the winning allocation when
    decided, else "undecided (a vs b, z=…)" (:func:`regime_cell_md`)."""
    if regime.empty:
        return "No runs."
    parts = []
    for reward in sorted(regime["reward"].unique()):
        for t in targets:
            sub = regime[(regime["reward"] == reward) & (regime["target"] == t)]
            if sub.empty:
                continue
            budgets = sorted(sub["budget"].unique())  # a rung the target never ran: no column
            cells = {(r.size, r.budget): regime_cell_md(r) for r in sub.itertuples(index=False)}
            rows = [[s] + [cells.get((s, b), "not run") for b in budgets] for s in sizes]
            parts.append(f"**{reward} reward · {target(t)}**\n\n"
                         + md_table(rows, ["size \\ budget"] + [flops(b) for b in budgets]))
    return "\n\n".join(parts)


def agreement_md(ag: Agreement | None, cost: PilotCost | None) -> str:
    if ag is None:
        out = ("Not run: the table has no validation rows, so the pilot ranking could not be "
               "checked. The pilot ranking itself is in `pilot_rankings.csv`.")
    else:
        header = ["reward", "target", "configs", "Spearman ρ", "top-1 agrees", "pilot pick",
                  "validation best", "regret (pts)", "full-grid best", "regret vs full (pts)"]
        rows = [[r.reward, target(r.target), str(r.n_common), num(r.spearman_rho, ".2f"),
                 yes(r.top1_agree), r.pilot_pick if isinstance(r.pilot_pick, str) else "–",
                 r.validation_best if isinstance(r.validation_best, str) else "–",
                 pts(r.regret_points),
                 r.full_best if isinstance(r.full_best, str) else (
                     "–" if r.n_common == 0 else "not run"),
                 pts(r.regret_full_points)] for r in ag.table.itertuples(index=False)
                if r.n_common > 0]
        out = (md_table(rows, header) + "\n\nρ and top-1 are over the configs run in both grids; "
               "regret = 100 × (validation best − validation accuracy of the pilot's pick); "
               "regret vs full = 100 × (full grid's best − full grid's accuracy of RACE's final "
               "choice, the validation best), at the validation budget "
               f"{flops(ag.table['validation_budget'].iloc[0]) if len(ag.table) else '–'} "
               "FLOPs. A target the pilot measured no value for (a search target runs only at the "
               "base and top rungs) has no pilot ranking to score and no row.")
    if cost is not None and not math.isnan(cost.full_grid_flops):
        est = (" (an estimate: the full grid was not run, so it is n_configs × validation "
               f"seeds × validation budget = {cost.n_configs} × {cost.n_validation_seeds} × "
               f"{flops(cost.validation_budget)})" if cost.full_grid_estimated else "")
        out += (f"\n\nCost: the pilot used {flops(cost.pilot_flops)} model FLOPs, "
                f"{pct(cost.pilot_share)} of the full grid's {flops(cost.full_grid_flops)} "
                f"(every config at the validation budget and the validation's "
                f"{cost.n_validation_seeds} seed(s)){est}; pilot plus validation (a validated "
                "run that continues a pilot run counted once) used "
                f"{flops(cost.pilot_flops + cost.validation_flops)}, {pct(cost.race_share)} "
                "of it.")
    elif cost is not None:
        out += (f"\n\nCost: the pilot used {flops(cost.pilot_flops)} model FLOPs; its share of "
                "the full grid is unknown without a validation budget.")
    return out


def pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f}%"


def fits_md(fits: pd.DataFrame) -> str:
    header = ["reward", "target", "size/alloc", "status", "rungs", "A", "B", "C_mid (FLOPs)",
              "R0", "held-out error (pts)"]
    rows = []
    for r in fits.head(MD_MAX_ROWS).itertuples(index=False):
        r0 = acc(r.R0) + (" (base)" if r.r0_fixed and r.status == "ok" else "")
        held = (pts(r.holdout_error_points) if r.holdout_status == "ok"
                else str(r.holdout_status))
        rows.append([r.reward, target(r.target), f"{r.size}/{r.alloc}", r.status,
                     str(r.n_rungs), acc(r.A), num(r.B, ".2f"), flops(r.C_mid),
                     r0 if r.status == "ok" else "–", held])
    return md_table(rows, header) + truncated(len(fits), "fits.csv")


def panel_links(pngs: list[str], prefix: str) -> str:
    """One line linking a figure's single-column PNGs, each labelled by its path after
    ``prefix`` without the suffix (``rule/in_pass1``); "none" when there are none."""
    if not pngs:
        return "Single-column files: none (the figure is not run)."
    links = [f"[{p.removeprefix(prefix).removesuffix('.png')}]({p})" for p in pngs]
    return "Single-column files: " + ", ".join(links) + "."


def missing_md(missing: pd.DataFrame) -> str:
    if missing.empty:
        return ("None: every config of each stage has a value at every seed, budget and "
                "target of that stage.")
    header = ["stage", "size", "reward", "alloc", "seed", "budget (FLOPs)", "target", "reason"]
    rows = [[r.stage, r.size, r.reward, r.alloc, str(r.seed), flops(r.budget), r.target,
             r.reason] for r in missing.head(MD_MAX_ROWS).itertuples(index=False)]
    return (f"{len(missing)} missing (config, seed, budget, target) entries. They are left out "
            "of the means above (a config's accuracy at a rung is the mean of the seeds that "
            "have one; its `n_seeds` says how many).\n\n"
            + md_table(rows, header) + truncated(len(missing), "missing.csv"))


FLOP_CONVENTIONS = """\
Every FLOP in this report comes from one analytic model of a Qwen2-style decoder, counting \
matrix multiplications only: the q, k, v, o, gate, up and down weights of every layer and the \
LM head (d × V, tied or not; the embedding lookup is free), 2 FLOPs per weight per token in the \
forward pass plus causal attention, 4·L·H·d_h·c for a token attending to c keys. Biases, norms, \
rotary, softmax and activations are not counted (well under 1%). **Model FLOPs**, what a cell's \
budget is charged and what every FLOP axis and column here shows (`flops_*`), count real tokens \
only, causal attention, and logits only where they are used (the update's head at the \
completion positions, generation's at each new token): the same count on every device. \
**Executed FLOPs** (`exec_flops_*`) are what the hardware did: padding, full attention blocks, \
logits the kernels computed anyway and recomputation included; they are never smaller and \
serve only for utilisation. The backward pass follows \
autograd: a frozen layer costs only the gradient of its input where one is needed, a trainable \
weight adds its own gradient, and LoRA adapters add 2·r·(d_in + d_out) FLOPs per token per \
adapted module to every forward, generation included.

A GRPO step charges three phases. **Rollout**: the KV-cached generation of every completion by \
the policy with its adapters (one prefill over the prompt, then one cached decode step per \
further token). **Learning**: the policy's forward and backward over prompt and completion, the \
reference policy's forward when beta > 0, and the old policy's log-prob forward when a \
generation batch is reused (num_iterations > 1); steps that reuse a batch generate nothing but \
are still charged. **Reward**: the feedback model's forward over prompt and completion (PRM or \
ORM); a rule-based verifier costs 0 FLOPs. Evaluation and pre-training (the base policy's SFT, \
PRM training) are reported apart and never charged to a cell's budget. A run stops before the \
step that would take it past its budget, so FLOPs used ≤ budget and the shortfall is less than \
one step; rungs are matched by budget, and plotted at the FLOPs actually used."""
