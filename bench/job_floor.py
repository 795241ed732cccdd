"""Start-up floor of the smoke study: what its jobs pay before doing any work.

    python bench/job_floor.py [CONFIG] [CORES]

Every Snakemake job is a fresh process, and a cold ``python -m race.cli`` of a stage that
touches a model imports torch and transformers' modeling stack first (training also TRL). This
bench takes the jobs of a dry run of CONFIG (default configs/smoke.yaml) per rule and measures,
side by side, the start-up of each (median of REPEATS):

- cold: a fresh interpreter importing what the rule's entry point imports;
- warm (``warm_start: true``, model rules only): ``python -m race.warm.client SUBCOMMAND --help``
  against a running warm server -- client start, fork, and the child's argument parsing.

It prints both sums: the CPU seconds the study spends on start-up alone, and that sum over
CORES (default 2), a lower bound on the wall time that no change inside a job can beat. Prints,
never asserts.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from race.study.dry_run import job_counts

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 3
MODEL = "import torch; from transformers import Qwen2ForCausalLM; "
#: What each rule's entry point imports before it computes anything.
IMPORTS = {
    "data": "import race.cli.data, race.data.task",
    "tokenizer": "import race.data.tokenizer, transformers",
    "base": MODEL + "import race.policy.pretrain",
    "prm": MODEL + "import race.feedback.models",
    "train": ("import os; os.environ['DISABLE_MLFLOW_INTEGRATION'] = 'TRUE'; " + MODEL
              + "import peft, datasets, race.train; from trl import GRPOTrainer"),
    "evaluate": MODEL + "import peft, race.evaluation.evaluate, race.feedback.models",
    "mlflow_init": "import race.study_cli; from mlflow.tracking import MlflowClient",
    "aggregate_pilot": "import pandas, race.analysis.aggregate",
    "select": "import race.cli.report, race.analysis.protocol",
    "aggregate": "import pandas, race.analysis.aggregate",
    "mlflow_log": "import race.tracking.mirror, race.evaluate; from mlflow.tracking import "
                  "MlflowClient",
    "report": "import race.analysis.report, race.analysis.figures",
}
SAME_AS = {"train_validation": "train", "evaluate_base": "evaluate"}
#: Rules whose jobs go through race.warm.client, and the subcommand each runs.
WARM_SUBCOMMAND = {"train": "train", "evaluate": "evaluate", "base": "pretrain", "prm": "prm"}


def median_wall(command: list[str], env: dict | None = None) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cold_start_up(rule: str) -> float:
    return median_wall([sys.executable, "-c", IMPORTS[rule]])


def warm_start_up(rule: str, env: dict) -> float:
    return median_wall([sys.executable, "-m", "race.warm.client", WARM_SUBCOMMAND[rule],
                        "--help"], env)


def main() -> None:
    config = sys.argv[1] if len(sys.argv) > 1 else "configs/smoke.yaml"
    cores = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp)
        for name in ("Snakefile", "config.yaml"):
            shutil.copy(ROOT / name, wd / name)
        for name in ("workflow", "configs", "envs"):
            shutil.copytree(ROOT / name, wd / name)
        plan = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1",
                               "--configfile", config], cwd=wd, capture_output=True,
                              text=True, check=True).stdout
    counts = job_counts(plan)
    counts.pop("all", None)
    # The validation runs sit behind the RACE checkpoint: a dry run cannot count them.
    print(f"{config}: {sum(counts.values())} jobs before the RACE checkpoint")
    with tempfile.TemporaryDirectory(prefix="rw", dir="/tmp") as sockets:
        # A private server that exits soon after the bench (its first job pays its start).
        env = {**os.environ, "RACE_WARM_SOCKET": os.path.join(sockets, "s.sock"),
               "RACE_WARM_IDLE": "10"}
        subprocess.run([sys.executable, "-m", "race.warm.client", "train", "--help"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        cold: dict[str, float] = {}
        warm: dict[str, float] = {}
        totals = {"cold": 0.0, "warm": 0.0}
        print(f"  {'rule':16s} {'jobs':>4s}   cold s/job   warm s/job")
        for rule, n in counts.items():
            key = SAME_AS.get(rule, rule)
            if key not in cold:
                cold[key] = cold_start_up(key)
                warm[key] = warm_start_up(key, env) if key in WARM_SUBCOMMAND else cold[key]
            totals["cold"] += n * cold[key]
            totals["warm"] += n * warm[key]
            print(f"  {rule:16s} {n:4d}   {cold[key]:10.2f}   {warm[key]:10.2f}")
    for mode, total in totals.items():
        print(f"start-up {mode}: {total:.0f} CPU s in all; over {cores} cores at least "
              f"{total / cores:.0f} s of wall time before any job computes")


if __name__ == "__main__":
    main()
