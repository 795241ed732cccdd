"""One metered GRPO + LoRA run: every FLOP charged to a phase, an exact budget stop, nested
budget rungs, resume after a kill, and MLflow as a mirror of the run folder.

Run folder (``results/runs/<cell>/``)::

    budget~<B>/          one per rung: adapter (safetensors), ledger.json, DONE
    checkpoints/         TRL/Trainer checkpoints (adapter, optimizer, RNG, trainer state) plus
                         race_state.json (the ledger and metrics up to that step)
    ledger.json          the per-step ledger, rewritten at every checkpoint and at the end
    metrics.jsonl        per-step metrics, appended every step (what MLflow mirrors)
    mlflow_run_id        the MLflow run this cell logs to
    DONE                 the run reached its budget

Budget semantics. A step's model FLOPs are known only after it runs (completion lengths are
sampled), so the stop uses a bound: before step k+1 the run stops when
``total_k + bound_{k+1} > budget``, where the bound of a generation step is every row at the
longest training prompt and the completion cap, and the bound of a reuse step
(``num_iterations > 1``) is exact (the buffered batch's shapes are known). Hence
``total <= budget`` always and ``budget - total < bound_{k+1}`` (one step's worst case). A budget
below the first step's bound is an error before any training. Each smaller rung is "crossed" by
the same rule and snapshotted right there, so a rung's snapshot and ledger are exactly those of
a run launched with that rung as its budget (constant learning rate: the trajectory does not
depend on the budget).

Resume. Checkpoints are taken every ``save_every`` steps, rounded to a multiple of
``num_iterations`` so that a checkpoint never falls inside a reused generation batch (TRL would
regenerate it on resume). On rerun the run continues from its latest checkpoint with the ledger
and metrics truncated to that step; the replayed steps are recomputed identically (same RNG
state, same data order), so nothing is lost or counted twice. A finished run (``DONE``) is not
retrained.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from race.atomic import write_text_atomic
from race.flops import analytic as flops
from race.flops.ledger import BUDGET_PHASES, Ledger
from race.flops.meter import BatchShapes, StepMeter
from race.grpo.trainer import (
    budget_callback_class,
    fused_head_is_compact,
    grpo_config,
    metered_trainer_class,
)
from race.study.cells import DONE, format_budget, rung_dir
from race.study.jobs import TrainJob


class BudgetError(ValueError):
    """A budget (or rung) is smaller than one training step."""


def rung_complete(run_dir: str | Path, budget: float) -> bool:
    """A rung snapshot is complete when its ledger and DONE marker are both there (Snakemake
    deletes a rerun job's declared outputs, the ledgers, before running it)."""
    folder = rung_dir(run_dir, budget)
    return (folder / DONE).exists() and (folder / "ledger.json").exists()


# --------------------------------------------------------------------------- state on disk


def ledger_summary(ledger: Ledger, budget: float, counters: dict) -> dict:
    """The ``ledger.json`` of a rung: totals, per-phase split, learning share, what was bought."""
    totals = ledger.totals()
    total = ledger.model_total
    step_totals: dict[int, int] = {}
    for row in ledger.rows:
        if row.phase in BUDGET_PHASES:
            step_totals[row.step] = step_totals.get(row.step, 0) + row.model_flops
    return {
        "budget": budget,
        "steps": len(ledger.steps),
        "model_flops": total,
        "executed_flops": ledger.executed_total,
        "phases": {p: totals[p] for p in BUDGET_PHASES},
        "max_step_model_flops": max(step_totals.values(), default=0),
        "p_learning": totals["learning"]["model_flops"] / total if total else 0.0,
        **counters,
        "rows": ledger.to_dict()["rows"],
    }


# --------------------------------------------------------------------------- the trainer


class MeteredRun:
    """The bookkeeping of one run; the TRL trainer drives it through ``BudgetCallback``."""

    def __init__(self, job: TrainJob, arch: flops.Arch, reward, max_prompt_len: int):
        self.job = job
        self.run_dir = Path(job.run_dir)
        self.reward = reward
        self.meter = StepMeter(arch, job.alloc.lora, beta=job.alloc.beta,
                               num_iterations=job.alloc.num_iterations,
                               grad_ckpt=job.gradient_checkpointing,
                               attn_implementation=job.attn_implementation,
                               head_all_positions=not fused_head_is_compact())
        self.worst = BatchShapes.worst_case(job.alloc.rows, max_prompt_len,
                                            job.alloc.max_completion_length)
        self.reward_bound = reward.bound(job.alloc.rows, max_prompt_len,
                                         job.alloc.max_completion_length)
        # The bound of a generation step depends only on the worst case: computed once.
        self.generation_bound = self.meter.step_bound(True, self.worst, None,
                                                      self.reward_bound)
        self.ledger = Ledger()
        self.counters = {"updates": 0, "rollouts": 0, "prompts_seen": 0}
        self.metrics: list[dict] = []
        self.rungs_done: list[float] = []
        self.finished = False
        self.trainer = None
        self.logger = None

    # ------------------------------------------------------------------ bounds
    def first_step_bound(self) -> int:
        return self.generation_bound

    def next_step_bound(self, step: int) -> int:
        if step % self.job.alloc.num_iterations == 0:  # the next step generates
            return self.generation_bound
        return self.meter.step_bound(False, self.worst, self.trainer.race_last_shapes,
                                     self.reward_bound)

    # ------------------------------------------------------------------ per step
    def end_of_step(self, step: int, model) -> None:
        t = self.trainer.race_step
        shapes = t["shapes"]
        generation_step = shapes is not None
        batch = shapes if generation_step else self.trainer.race_last_shapes
        learning = self.meter.learning(batch, generation_step)
        learn_s = max(0.0, t.get("step_s", 0.0) - t["rollout_s"] - t["reward_s"])
        if generation_step:
            rollout = self.meter.rollout(shapes)
            reward = self.reward.consume()
            self.ledger.add(step, "rollout", rollout.model, rollout.executed, rollout.tokens,
                            round(t["rollout_s"], 6))
            self.ledger.add(step, "reward", reward.model, reward.executed, reward.tokens,
                            round(t["reward_s"], 6))
            self.counters["rollouts"] += shapes.rows
            self.counters["prompts_seen"] += shapes.rows // self.job.alloc.num_generations
        self.ledger.add(step, "learning", learning.model, learning.executed, learning.tokens,
                        round(learn_s, 6))
        self.counters["updates"] += 1
        self.trainer.race_step = {"rollout_s": 0.0, "reward_s": 0.0, "shapes": None}

        total = self.ledger.model_total
        if total > self.job.budget:  # the bound makes this impossible; guard the invariant
            raise RuntimeError(f"step {step} took the run past its budget ({total} > "
                               f"{self.job.budget}); the step bound is wrong")
        bound = self.next_step_bound(step)
        for budget in self.job.rungs:
            if budget not in self.rungs_done and total + bound > budget:
                self.snapshot(budget, model, step)
        if len(self.rungs_done) == len(self.job.rungs):
            self.finished = True
            self.ledger.save(self.run_dir / "ledger.json")

    def snapshot(self, budget: float, model, step: int) -> None:
        """Write the rung folder atomically: adapter, ledger summary, DONE marker."""
        final = rung_dir(self.run_dir, budget)
        tmp = Path(tempfile.mkdtemp(dir=self.run_dir, prefix=f".{final.name}."))
        model.save_pretrained(tmp, safe_serialization=True)
        summary = ledger_summary(self.ledger, budget, dict(self.counters, step=step))
        write_text_atomic(tmp / "ledger.json", json.dumps(summary, indent=1, sort_keys=True))
        (tmp / DONE).write_text("")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.rungs_done.append(budget)

    # ------------------------------------------------------------------ metrics
    def log_metrics(self, step: int, logs: dict) -> None:
        if step == 0 or "train_runtime" in logs or (self.metrics and
                                                     self.metrics[-1]["step"] >= step):
            return
        totals = self.ledger.totals()
        total = self.ledger.model_total
        row = {"step": step}
        for phase in BUDGET_PHASES:
            row[f"flops_{phase}"] = totals[phase]["model_flops"]
            row[f"exec_flops_{phase}"] = totals[phase]["executed_flops"]
        row["flops_total"] = total
        row["exec_flops_total"] = self.ledger.executed_total
        row["p_learning"] = totals["learning"]["model_flops"] / total if total else 0.0
        row.update({k: v for k, v in self.counters.items()})
        for key, name in (("reward", "reward_mean"), ("reward_std", "reward_std"),
                          ("kl", "kl"), ("completions/mean_length", "completion_length"),
                          ("loss", "loss"), ("entropy", "entropy")):
            if key in logs:
                row[name] = float(logs[key])
        self.metrics.append(row)
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        if self.logger is not None:
            self.logger.log_step(step, {k: v for k, v in row.items() if k != "step"})

    # ------------------------------------------------------------------ resume
    def save_state(self, ckpt: Path, step: int) -> None:
        if self.logger is not None:
            self.logger.flush()  # MLflow holds every step up to this checkpoint
        state = {"step": step, "ledger": self.ledger.to_dict(),
                 "counters": self.counters, "rungs_done": self.rungs_done,
                 "metrics": self.metrics}
        write_text_atomic(ckpt / "race_state.json", json.dumps(state))
        # The run-level ledger follows the checkpoints, not every step: rewriting the whole
        # ledger per step is O(steps) each and showed in the step time (bench/overhead.py).
        # metrics.jsonl (appended per step) and MLflow carry the per-step cumulative FLOPs.
        self.ledger.save(self.run_dir / "ledger.json", durable=False)

    def restore(self, ckpt: Path) -> None:
        state = json.loads((ckpt / "race_state.json").read_text())
        self.ledger = Ledger.from_json(json.dumps(state["ledger"]))
        self.counters = state["counters"]
        self.rungs_done = state["rungs_done"]
        self.metrics = state["metrics"]
        # Steps after the checkpoint are replayed: drop what the killed run wrote for them.
        write_text_atomic(self.run_dir / "metrics.jsonl",
                      "".join(json.dumps(m, sort_keys=True) + "\n" for m in self.metrics))
        self.ledger.save(self.run_dir / "ledger.json")


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = [p for p in (run_dir / "checkpoints").glob("checkpoint-*")
             if (p / "race_state.json").exists() and (p / "trainer_state.json").exists()]
    return max(ckpts, key=lambda p: int(p.name.split("-")[1]), default=None)


# --------------------------------------------------------------------------- entry point


def _dataset(path: str, tokenizer):
    from datasets import Dataset

    from race.data.task import load_jsonl

    records = load_jsonl(path)
    max_prompt = max(len(tokenizer(r.prompt, add_special_tokens=False)["input_ids"])
                     for r in records)
    return Dataset.from_dict({"prompt": [r.prompt for r in records],
                              "answer": [r.answer for r in records]}), max_prompt


def run_training(job: TrainJob) -> dict:
    """Train until the budget; returns the summary of the largest rung. Idempotent."""
    import torch
    from peft import LoraConfig

    from race.data.tokenizer import load_tokenizer
    from race.feedback.rewards import build_reward
    from race.policy.ladder import load_policy

    run_dir = Path(job.run_dir)
    if (run_dir / DONE).exists() and all(rung_complete(run_dir, b) for b in job.rungs):
        return json.loads((rung_dir(run_dir, job.budget) / "ledger.json").read_text())
    if (run_dir / DONE).exists():
        # A rung's output was deleted after the run finished: retrain from scratch (the run
        # is deterministic, so the other rungs are rewritten identically).
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        (run_dir / DONE).unlink()
    run_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(job.seed)
    tokenizer = load_tokenizer(job.base)
    dataset, max_prompt = _dataset(job.train_data, tokenizer)
    policy = load_policy(job.base, attn_implementation=job.attn_implementation,
                         dtype=getattr(torch, job.dtype))
    arch = flops.Arch.from_config(policy.config)
    reward = build_reward(job.reward, tokenizer=tokenizer, results_dir=job.results_dir)
    run = MeteredRun(job, arch, reward, max_prompt)

    first = run.first_step_bound()
    if first > job.rungs[0]:
        raise BudgetError(
            f"budget rung {format_budget(job.rungs[0])} FLOPs is smaller than one training "
            f"step of this cell (up to {first:.3e} model FLOPs with {job.alloc.rows} "
            f"completions of up to {job.alloc.max_completion_length} tokens): raise the rung "
            f"or shrink the allocation")

    resume = latest_checkpoint(run_dir)
    if resume is not None:
        run.restore(resume)
        lost = [b for b in run.rungs_done if not rung_complete(run_dir, b)]
        if lost or any(b not in job.rungs for b in run.rungs_done):
            # A rung snapshot taken before this checkpoint is gone (or the rungs changed):
            # only a fresh run can rewrite it. Deterministic, so every rung comes out the same.
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            run = MeteredRun(job, arch, reward, max_prompt)
            resume = None
    if resume is None and (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()  # a run killed before its first checkpoint

    if len(run.rungs_done) == len(job.rungs):  # killed after its last snapshot
        return _finish(run, job, run_dir)
    if job.mlflow is not None and getattr(job.mlflow, "enabled", False):
        from race.tracking.mlflow_runs import RunLogger

        run.logger = RunLogger(job.mlflow, run_dir, job.run_key or str(run_dir), job.study,
                               job.params(), tags=job.tags)

    # max_steps only sizes the data loader: the budget callback stops the run.
    max_steps = int(job.budget // max(1, run.meter.learning(
        BatchShapes.worst_case(job.alloc.rows, 1, 1), False).model)) + 1
    lora = LoraConfig(r=job.alloc.lora_rank,
                      lora_alpha=job.alloc.alpha,
                      target_modules=list(job.alloc.lora_targets), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")
    trainer_cls = metered_trainer_class()
    trainer = trainer_cls(model=policy, reward_funcs=[reward], args=grpo_config(job, max_steps),
                          train_dataset=dataset, processing_class=tokenizer, peft_config=lora,
                          callbacks=[budget_callback_class()(run)])
    trainer._init_meter_state()
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # per-step dicts on stdout: metrics.jsonl has them
    run.trainer = trainer
    status = "FAILED"
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        if not run.finished:
            raise RuntimeError("training stopped before the budget was reached "
                               f"(steps {len(run.ledger.steps)}, max_steps {max_steps})")
        status = "FINISHED"
    finally:
        if run.logger is not None:
            run.logger.finish(status)
    return _finish(run, job, run_dir)


def _finish(run: MeteredRun, job: TrainJob, run_dir: Path) -> dict:
    summary = ledger_summary(run.ledger, job.budget, dict(run.counters))
    summary.pop("rows")
    write_text_atomic(run_dir / "train.json", json.dumps(summary, indent=1, sort_keys=True))
    (run_dir / DONE).write_text("")
    return summary
