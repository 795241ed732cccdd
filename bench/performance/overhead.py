"""Metering overhead: vanilla TRL GRPOTrainer vs ``race train`` on the same config, paired in
one process, N steps each. Prints the ratio of median step times (target <= 1.03).

    python bench/performance/overhead.py [STEPS] [ROUNDS]  # default 30 steps x 4 rounds

Both run the same tiny policy (micro), data, LoRA config and GRPOConfig (checkpoints every 10
steps included). The vanilla run has no meter and no MLflow; the race run is what a study runs:
the per-step meter, ledger, budget callback, metrics file and MLflow logging (sqlite in a
temporary directory), flushed at each checkpoint. A step's time is from one ``on_step_begin``
to the next: the whole loop iteration, callbacks, logging and checkpointing included. Neither
prints per-step logs (``race train`` replaces TRL's printer with metrics.jsonl; the vanilla run
drops it too, so stdout is not timed on one side only). The two alternate over ROUNDS rounds
(vanilla, race, race, vanilla, ...) so that drifting machine load hits both alike; the first
two steps of every run are warm-up and not timed. Prints the ratio of median step times (the
target) and of mean step times (which also carries the checkpoint steps). The paired runs
live in ``bench.common`` (``paired``), which ``bench/performance/gpu_check.py`` runs too.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch

from bench.common import ALLOC, paired, tiny_study
from race.core.jobs import TrainJob


def main() -> None:
    from race.core.specs import MlflowSpec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="?", type=int, default=30)
    parser.add_argument("rounds", nargs="?", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base, data = tiny_study(root)
        mlflow = MlflowSpec(tracking_uri=f"sqlite:///{root}/mlflow.db",
                            artifact_root=str(root / "artifacts"), experiment="overhead")
        job = TrainJob(base=str(base), train_data=str(data), run_dir=str(root / "runs"),
                       rungs=[1e15], alloc=ALLOC, save_every=10, run_key="overhead",
                       mlflow=mlflow, device="cpu")
        vanilla_times, race_times = paired(job, args.steps, args.rounds)
    b, o = statistics.median(vanilla_times), statistics.median(race_times)
    mean_ratio = statistics.mean(race_times) / statistics.mean(vanilla_times)
    print(f"overhead: {args.rounds} rounds x {args.steps} steps each; median step vanilla "
          f"{b * 1e3:.1f} ms, race train {o * 1e3:.1f} ms, ratio {o / b:.3f} (target <= 1.03); "
          f"ratio of means {mean_ratio:.3f}")


if __name__ == "__main__":
    main()
