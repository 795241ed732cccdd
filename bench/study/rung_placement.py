"""Where must the budget rungs sit for the compute-performance fit to predict its top rung?

    python bench/study/rung_placement.py [--extra 2.1e11] [--results results]
        [--config config.yaml] [--out bench_out/rung_placement] [--cores 2]

Gate B wants the sigmoid fit (:mod:`race.analysis.fit`), refitted without the top rung, to
predict the top rung within 5 points for two thirds of the rule configs. This reruns the
study's rule-reward cells with the ``--extra`` rungs added to the config's, on the study's own
base policies and PRMs (copied from ``--results``, after ``make run``: nothing is pretrained
again), in ``<out>`` (its own results/ and logs). The runs are deterministic and a rung's
snapshot does not depend on the other rungs, so the config's rungs reproduce the study's
accuracies exactly and the extra ones add points on the same curves.

Prints, per rung set -- the config's, all of them, and every set of the config's size that
keeps its lowest and highest rung -- each rule config's held-out top-rung error (points) and
how many are within 5. Prints, never asserts; about 7 minutes on 2 cores with one extra rung.
"""

import argparse
import itertools
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import pandas as pd
import yaml

from bench.common import ROOT, apply_overrides, results_folder, run_workflow
from race.analysis.fit import fit_table
from race.study.config import load_config

TARGET = "sampled_pass1"
#: What the rule cells read from a finished study: copied, so nothing is trained again.
INPUTS = ("data", "tokenizer", "base", "prm")


def holdout_line(runs: pd.DataFrame, rungs: list[float]) -> str:
    """The rule configs' held-out errors when only ``rungs`` (and the base) are measured."""
    fits = fit_table(runs[(runs.budget == 0) | runs.budget.isin(rungs)], [TARGET])
    fits = fits[fits.reward == "rule"].sort_values(["size", "alloc"])
    errors = fits.holdout_error_points
    within = int((errors.abs() <= 5).sum())
    cells = "  ".join(f"{s}/{a} {e:+.1f}" for s, a, e in
                      zip(fits["size"], fits.alloc, errors, strict=True))
    return (f"rungs {[f'{b:.2g}' for b in rungs]}: within 5 points {within} of "
            f"{int(errors.notna().sum())} | {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--results", default=None, type=Path,
                        help="the finished study's results folder (default: its results_dir)")
    parser.add_argument("--extra", nargs="+", type=float, default=[2.1e11])
    parser.add_argument("--out", default="bench_out/rung_placement", type=Path)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    config = load_config(args.config)
    source = results_folder(config, args.results)
    folder = args.out.resolve()
    for name in INPUTS:
        if not (folder / "results" / name).exists():
            shutil.copytree(source / name, folder / "results" / name)  # keeps modification times
    rungs = sorted(config["budgets"])
    config = apply_overrides(config, ["mlflow.enabled=false", "race.enabled=false"])
    config["rewards"] = {"rule": config["rewards"]["rule"]}
    config["budgets"] = sorted(set(rungs) | set(args.extra))
    config["results_dir"] = "results"
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run_workflow(folder, args.cores, "results/runs.csv")
    runs = pd.read_csv(folder / "results" / "runs.csv")
    print(holdout_line(runs, rungs) + "   <- the config's")
    print(holdout_line(runs, config["budgets"]) + "   <- all")
    interior = config["budgets"][1:-1]
    for keep in itertools.combinations(interior, len(rungs) - 2):
        chosen = [config["budgets"][0], *keep, config["budgets"][-1]]
        if chosen != rungs:
            print(holdout_line(runs, chosen))


if __name__ == "__main__":
    main()
