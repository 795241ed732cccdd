"""Are gates A and B robust to the task draw? The rule-reward study on other task seeds.

    python bench/study/task_seeds.py [--seeds 1 2] [--config config.yaml]
        [--out bench_out/task_seeds] [--rewards rule] [--cores 2] [--set section.key=value ...]

For each task seed, writes ``<out>/seed~S/config.yaml``: the config with ``task.seed = S`` (new
train / eval prompts, so new SFT data, new base policies, new PRMs), only the ``--rewards``
kept (default: the rule reward, what gate B reads; every allocation and rung kept), the RACE
pilot and validation as configured (its second seed gives gate B's validation spread), MLflow
off. Then runs the workflow on it (``snakemake --directory <out>/seed~S``: its own results/,
reports/, logs; the repository's are untouched) and prints, from that folder,

- gate A: ``bench/calibration/base_headroom.py --from-results`` (pass@16, sampled pass@1,
  format-valid, maj@16 vs the strong PRM's best-of-16, every PRM's step AUC per error family);
- gates B and C: ``bench/study/study_gates.py`` (gains, Spearman, C_mid, held-out error,
  validation spread, decided regime cells).

Seed 0 is the default study itself: compare with the same two benches on ``results/`` and
``reports/`` after ``make run``. A second invocation reuses finished jobs (Snakemake), so an
interrupted run resumes. About 15 to 30 minutes per seed on 2 cores with the default config
(14:28 and 17:10 measured on one machine, 28:52 and 23:29 on a slower one, each with other
jobs running beside it).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import yaml

from bench.common import BENCH, ROOT, add_set_option, apply_overrides, run, run_workflow
from race.study.config import load_config


def seed_config(config: dict, seed: int, rewards: list[str], overrides: list[str]) -> dict:
    """The study on task seed ``seed`` with only ``rewards`` (a new study name, MLflow off)."""
    unknown = sorted(set(rewards) - set(config["rewards"]))
    if unknown:
        raise SystemExit(f"--rewards: {unknown} not among the config's rewards "
                         f"{sorted(config['rewards'])}")
    config = apply_overrides(config, [f"task.seed={seed}", "mlflow.enabled=false", *overrides])
    config["study"] = f"{config['study']}-task-seed-{seed}"
    config["rewards"] = {name: config["rewards"][name] for name in rewards}
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rewards", nargs="+", default=["rule"])
    parser.add_argument("--out", default="bench_out/task_seeds", type=Path)
    parser.add_argument("--cores", type=int, default=2)
    add_set_option(parser)
    args = parser.parse_args()
    base = load_config(args.config)
    for seed in args.seeds:
        folder = (args.out / f"seed~{seed}").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        config = seed_config(base, seed, args.rewards, args.overrides)
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        print(f"=== task seed {seed}: {folder}", flush=True)
        run_workflow(folder, args.cores)
        run([sys.executable, str(BENCH / "calibration" / "base_headroom.py"), "--config",
             "config.yaml", "--from-results"], folder)
        run([sys.executable, str(BENCH / "study" / "study_gates.py"), "reports", "--results",
             config["results_dir"], "--alloc", config["race"].get("baseline", "g8")], folder)


if __name__ == "__main__":
    main()
