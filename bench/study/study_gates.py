"""Issue-21 gates B and C from a finished study's tables (reports/ after `make run`).

    python bench/study/study_gates.py [reports] [--alloc g8] [--results results]

For the rule reward and sampled pass@1: base -> top-rung accuracy [95% interval] and Spearman
rho over rungs per size (default allocation); each fit's C_mid and held-out top-rung error; the
validation seeds' spread per config; per reward, how many (size, rung) regime cells have a
decided allocation (z >= 2), and the same gap's z from the per-prompt paired difference
(both allocations were sampled on the same eval-in prompts: what a paired test would decide);
rule+prm vs rule at the top rung per size and allocation; and the reward phase's share of the
model FLOPs each cell spent at the top rung (min-max over allocations, per reward and size).

The paired z is a diagnostic, not the report's test: it removes the prompts' shared difficulty
from the evaluation noise, and like the report's z at one seed it holds nothing of the
training seed's noise, which the validation seeds measure (the spread printed above). A gap
that is paired-significant but smaller than that spread would not survive a retraining.
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from race.core.cells import cell_key, format_budget

T = "sampled_pass1"
SIZES = ["nano", "micro", "mini"]


def interval(row) -> str:
    return f"{row[f'acc_{T}']:.3f} [{row[f'acc_{T}_lo']:.3f}, {row[f'acc_{T}_hi']:.3f}]"


def per_prompt(results: Path, size: str, reward: str, alloc: str, budget: float) -> np.ndarray:
    """sampled_pass1's correct share per eval-in prompt, averaged over the seeds evaluated at
    this rung (eval.json details.correct_per_prompt)."""
    runs = []
    for seed_dir in sorted((results / "runs" / cell_key(size, reward, alloc, 0)).parent.glob(
            "seed~*")):
        path = seed_dir / f"budget~{format_budget(budget)}" / "eval.json"
        if path.is_file():
            d = json.loads(path.read_text())["targets"][T]["details"]
            runs.append(np.asarray(d["correct_per_prompt"]) / d["samples_per_prompt"])
    return np.mean(runs, axis=0)


def paired_z(results: Path, row) -> float:
    """The regime cell's winner-minus-runner-up gap over its paired standard error (the
    per-prompt differences' standard deviation over sqrt(prompts)); NaN for a tie."""
    if "|" in str(row.best_alloc) or "|" in str(row.runner_up):
        return math.nan
    d = (per_prompt(results, row["size"], row.reward, row.best_alloc, row.budget)
         - per_prompt(results, row["size"], row.reward, row.runner_up, row.budget))
    se = d.std(ddof=1) / math.sqrt(len(d))
    return d.mean() / se if se > 0 else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="?", default="reports")
    parser.add_argument("--alloc", default="g8", help="the default allocation (race.baseline)")
    parser.add_argument("--results", default="results", type=Path,
                        help="the study's results folder (per-prompt evaluations)")
    args = parser.parse_args()
    runs = pd.read_csv(f"{args.reports}/runs.csv")
    regime = pd.read_csv(f"{args.reports}/regime.csv")
    fits = pd.read_csv(f"{args.reports}/fits.csv")
    full = runs[runs.stage == "full"]
    top = runs["budget"].max()
    print(f"== gate B: rule reward, alloc {args.alloc}, {T}")
    for size in SIZES:
        cell = full[(full["size"] == size) & (full.reward == "rule")
                    & (full.alloc == args.alloc)].sort_values("budget")
        base, last = cell.iloc[0], cell.iloc[-1]
        accs = list(cell[f"acc_{T}"])
        rho = spearmanr(range(len(accs)), accs).statistic
        gain = 100 * (last[f"acc_{T}"] - base[f"acc_{T}"])
        print(f"{size}: base {interval(base)} -> top {interval(last)} gain {gain:+.1f} pts, "
              f"disjoint {last[f'acc_{T}_lo'] > base[f'acc_{T}_hi']}, "
              f"rungs {[round(a, 3) for a in accs]}, spearman {rho:.2f}")
    f = fits[(fits.reward == "rule") & (fits.target == T)]
    print(f[["size", "alloc", "status", "C_mid", "holdout_error_points"]].to_string(index=False))
    lo = runs[runs.budget > 0].budget.min()
    inside = sorted(set(f[(f.C_mid >= lo) & (f.C_mid <= top)]["size"]))
    ok = int((f.holdout_error_points.abs() <= 5).sum())
    print(f"C_mid inside the rungs for {inside}; held-out |error| <= 5 points: {ok} of "
          f"{int(f.holdout_error_points.notna().sum())}")
    print(f"== validation seeds ({T} at the validation budget)")
    for (size, reward, alloc), g in runs[runs.stage == "validation"].groupby(
            ["size", "reward", "alloc"]):
        v = g.sort_values("seed")[f"acc_{T}"].tolist()
        print(f"  {size}/{reward}/{alloc}: {[round(x, 3) for x in v]} "
              f"spread {100 * (max(v) - min(v)):.1f} pts")
    print(f"== gate C: decided regime cells ({T}, budget > 0)")
    for reward, g in regime[(regime.target == T) & (regime.budget > 0)].groupby("reward"):
        won = ", ".join(f"{r['size']}@{r.budget:.2g}:{r.best_alloc} (z={r.gap_z:.1f})"
                        for _, r in g[g.decided].iterrows())
        print(f"  {reward}: {int(g.decided.sum())} of {len(g)} decided; {won}")
        paired = [paired_z(args.results, r) for _, r in g.iterrows()]
        print(f"    paired per-prompt z >= 2: {sum(z >= 2 for z in paired)} of {len(g)} "
              f"(z: {', '.join(f'{z:.1f}' for z in paired)})")
    at_top = full[full.budget == top]
    if not {"rule", "rule+prm"} <= set(at_top.reward):
        return  # a study without both rewards (bench/study/task_seeds.py: rule only)
    print("== rule+prm vs rule at the top rung")
    for size in SIZES:
        table = at_top[at_top["size"] == size].pivot_table(
            index="alloc", columns="reward", values=f"acc_{T}")
        print(f"  {size}: {table.round(3).to_dict('index')}; best rule "
              f"{table['rule'].max():.3f}, best rule+prm {table['rule+prm'].max():.3f}")
    print("== reward share of the model FLOPs at the top rung (min-max over allocations)")
    share = (at_top.flops_reward / at_top.flops_total).groupby(
        [at_top.reward, at_top["size"]]).agg(["min", "max"])
    for (reward, size), (lo, hi) in share.iterrows():
        print(f"  {reward} {size}: {100 * lo:.1f}-{100 * hi:.1f}%")


if __name__ == "__main__":
    main()
