"""The peak-memory estimate (race.study.memory) against a measurement, on the rehearsal's
stand-ins (``make rehearsal`` first: it writes them and the data).

    python bench/calibration/memory_estimate.py [--config configs/rehearsal.yaml]
                                                [--cells 3] [--profiler]

For the first ``--cells`` training cells, at every micro-batch size of the list below, and
for their evaluation jobs: the estimate, the measured peak of live tensor memory
(race.study.memory_probe.LiveTensorBytes) and their ratio. ``--profiler`` measures the first
training job again with torch.profiler's memory timeline (``profile_memory``; minutes on a CPU)
beside it. Prints; asserts nothing.
"""

import argparse
import shutil
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch

from race.evaluation.eval_job import run_evaluation
from race.grpo.run import run_training
from race.study.builders import eval_job, train_job
from race.study.config import load_study
from race.study.memory import eval_job_memory, train_job_memory
from race.study.memory_probe import LiveTensorBytes

MICRO_BATCHES = (None, 32)
warnings.filterwarnings("ignore")  # library deprecation notes stay out of the table


def profiler_peak(run) -> int:
    """Peak bytes of torch.profiler's memory timeline on the CPU over ``run()``."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        run()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(
        torch.device("cpu"))
    return max(sum(s) for s in sizes)


def measured(run) -> int:
    with LiveTensorBytes() as probe:
        run()
    return probe.peak


def row(label: str, estimate, peak: int) -> str:
    return (f"{label:<44} estimate {estimate.total / 1e6:9.1f} MB  measured {peak / 1e6:9.1f} "
            f"MB  ratio {estimate.total / peak:5.2f}  (peak phase: {estimate.peak_phase})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/rehearsal.yaml")
    p.add_argument("--cells", type=int, default=3)
    p.add_argument("--profiler", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    study = load_study(args.config)
    prompt = study.source.max_prompt_tokens
    scratch = Path(tempfile.mkdtemp())
    print(f"{args.config}: tensor memory, estimate (longest prompt {prompt} tokens, every "
          "completion at the cap) vs measured")
    for i, cell in enumerate(study.grid_cells()[:args.cells]):
        for micro in MICRO_BATCHES:
            job = replace(train_job(study, cell), run_dir=str(scratch / f"run{i}{micro}"),
                          rungs=[study.budgets[0]], micro_batch_rows=micro)
            peak = measured(lambda job=job: run_training(job))
            print(row(f"train {cell.reward}/{cell.alloc} micro {micro}",
                      train_job_memory(job, prompt), peak), flush=True)
            if args.profiler and i == 0 and micro is None:
                shutil.rmtree(job.run_dir)
                print(f"  torch.profiler's memory timeline, same job: "
                      f"{profiler_peak(lambda job=job: run_training(job)) / 1e6:.1f} MB")
        ev = eval_job(study, cell)
        ev = replace(ev, snapshots=[replace(s, out=str(scratch / f"eval{i}.json"))
                                    for s in ev.snapshots[:1]])
        peak = measured(lambda ev=ev: list(run_evaluation(ev)))
        print(row(f"evaluate {cell.reward}/{cell.alloc}", eval_job_memory(ev, prompt), peak))
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
