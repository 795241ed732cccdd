"""Metering overhead: vanilla TRL GRPOTrainer vs ``race train`` on the same config, paired in
one process, N steps each. Prints the ratio of median step times (target <= 1.03).

    python bench/overhead.py [STEPS] [ROUNDS]      # default 30 steps x 4 rounds

Both run the same tiny policy (micro), data, LoRA config and GRPOConfig (checkpoints every 10
steps included). The vanilla run has no meter and no MLflow; the race run is what a study runs:
the per-step meter, ledger, budget callback, metrics file and MLflow logging (sqlite in a
temporary directory), flushed at each checkpoint. A step's time is from one ``on_step_begin``
to the next: the whole loop iteration, callbacks, logging and checkpointing included. Neither
prints per-step logs (``race train`` replaces TRL's printer with metrics.jsonl; the vanilla run
drops it too, so stdout is not timed on one side only). The two alternate over ROUNDS rounds
(vanilla, race, race, vanilla, ...) so that drifting machine load hits both alike; the first
two steps of every run are warm-up and not timed. Prints the ratio of median step times (the
target) and of mean step times (which also carries the checkpoint steps).
"""

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from race.core.jobs import TrainJob
from race.core.specs import Allocation, TaskSpec
from race.data.task import write_splits
from race.data.tokenizer import load_tokenizer, save_tokenizer
from race.grpo.run import _dataset, run_training
from race.grpo.trainer import grpo_config
from race.policy.ladder import build_ladder_model

ALLOC = Allocation(num_generations=8, prompts_per_step=4, max_completion_length=32)


class StepTimer:
    """A TrainerCallback timing each loop iteration, ``on_step_begin`` to ``on_step_begin``."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                now = time.perf_counter()
                if timer.t0 is not None:
                    timer.times.append(now - timer.t0)
                timer.t0 = now

        self.times, self.t0, self.callback = [], None, _Cb()


def vanilla(job: TrainJob, steps: int, device: str = "cpu") -> list[float]:
    """Step times of TRL's own GRPOTrainer on ``job``'s policy, data and LoRA, ``steps`` steps."""
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from race.feedback.rewards import RuleReward
    from race.policy.ladder import load_policy

    tok = load_tokenizer(job.base)
    dataset, _ = _dataset(job.train_data, tok)
    timer = StepTimer()
    args = grpo_config(job, steps, device)
    trainer = GRPOTrainer(model=load_policy(job.base, dtype=getattr(torch, job.dtype)),
                          reward_funcs=[RuleReward()], args=args, train_dataset=dataset,
                          processing_class=tok, callbacks=[timer.callback],
                          peft_config=LoraConfig(r=job.alloc.lora_rank,
                                                 lora_alpha=job.alloc.alpha,
                                                 target_modules=list(job.alloc.lora_targets),
                                                 task_type="CAUSAL_LM"))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return timer.times


def race_run(job: TrainJob, steps: int) -> list[float]:
    """Step times of ``race train`` on ``job``, stopped after ``steps`` steps."""
    import race.grpo.run as rt

    timer = StepTimer()
    original = rt.budget_callback_class

    def with_stop():
        cls = original()

        class Stop(cls):
            def on_step_end(self, args, state, control, **kw):
                out = super().on_step_end(args, state, control, **kw)
                if state.global_step >= steps:
                    control.should_training_stop = True
                    self.run.finished = True
                return out

            def on_step_begin(self, args, state, control, **kw):
                timer.callback.on_step_begin(args, state, control)

        return Stop

    rt.budget_callback_class = with_stop
    try:
        run_training(job)
    finally:
        rt.budget_callback_class = original
    return timer.times


def paired(job: TrainJob, steps: int, rounds: int, device: str = "cpu",
           skip: int = 2) -> tuple[list[float], list[float]]:
    """(vanilla, race) step times over ``rounds`` alternating rounds of ``steps`` steps each,
    the first ``skip`` steps of every run left out (warm-up). Each round gets fresh run
    folders beside ``job.run_dir``."""
    vanilla_times, race_times = [], []
    for r in range(rounds):
        race_job = dataclasses.replace(job, run_dir=f"{job.run_dir}/race{r}",
                                       run_key=f"{job.run_key}/round~{r}")
        plain_job = dataclasses.replace(job, run_dir=f"{job.run_dir}/vanilla{r}")
        for kind in (["vanilla", "race"] if r % 2 == 0 else ["race", "vanilla"]):
            if kind == "vanilla":
                vanilla_times += vanilla(plain_job, steps, device)[skip:]
            else:
                race_times += race_run(race_job, steps)[skip:]
    return vanilla_times, race_times


def tiny_study(root: Path, build=None) -> tuple[Path, Path]:
    """(base policy folder, train JSONL) under ``root``: a small train split and the random-init
    policy ``build(tokenizer)`` (default: the ladder's micro rung)."""
    write_splits(TaskSpec(n_train=500, n_eval_in=10, n_eval_ood=10), root / "data")
    tok = load_tokenizer(save_tokenizer(root / "tok"))
    model = build(tok) if build else build_ladder_model("micro", tok)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return root / "base", root / "data" / "train.jsonl"


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
