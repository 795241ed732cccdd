"""Start-up floor of the smoke study: what its jobs pay before doing any work.

    python bench/job_floor.py [CONFIG] [CORES]

Every Snakemake job is a fresh ``python -m race.cli`` process, and the stages that touch a model
import torch and transformers' modeling stack first (training also TRL). This bench takes the
jobs of a dry run of CONFIG (default configs/smoke.yaml) per rule, times a fresh interpreter
importing what that rule's entry point imports (median of REPEATS), and prints the sum: the CPU
seconds the study spends on start-up alone, and that sum over CORES (default 2) -- a lower
bound on the wall time that no change inside a job can beat. Prints, never asserts.
"""

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from race.snakemake_plan import job_counts

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 3
MODEL = "import torch; from transformers import Qwen2ForCausalLM; "
#: What each rule's entry point imports before it computes anything.
IMPORTS = {
    "data": "import race.cli_data, race.task",
    "tokenizer": "import race.char_tokenizer, transformers",
    "base": MODEL + "import race.pretrain",
    "prm": MODEL + "import race.prm",
    "train": ("import os; os.environ['DISABLE_MLFLOW_INTEGRATION'] = 'TRUE'; " + MODEL
              + "import peft, datasets, race.train; from trl import GRPOTrainer"),
    "evaluate": MODEL + "import peft, race.evaluate, race.prm",
    "mlflow_init": "import race.study_cli; from mlflow.tracking import MlflowClient",
    "aggregate_pilot": "import pandas, race.aggregate",
    "select": "import race.report_cli, race.race_protocol",
    "aggregate": "import pandas, race.aggregate",
    "mlflow_log": "import race.mlflow_mirror, race.evaluate; from mlflow.tracking import "
                  "MlflowClient",
    "report": "import race.report, race.figures",
}
SAME_AS = {"train_validation": "train", "evaluate_base": "evaluate"}


def start_up(statement: str) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
    measured: dict[str, float] = {}
    total = 0.0
    for rule, n in counts.items():
        key = SAME_AS.get(rule, rule)
        if key not in measured:
            measured[key] = start_up(IMPORTS[key])
        total += n * measured[key]
        print(f"  {rule:16s} {n:4d} jobs x {measured[key]:5.2f} s start-up = "
              f"{n * measured[key]:6.1f} s")
    print(f"start-up: {total:.0f} CPU s in all; over {cores} cores at least {total / cores:.0f} s "
          f"of wall time before any job computes")


if __name__ == "__main__":
    main()
