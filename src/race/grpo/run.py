"""One metered GRPO + LoRA run: every FLOP charged to a phase, an exact budget stop, nested
budget rungs, resume after a kill, and MLflow as a mirror of the run folder.

Run folder (``results/runs/<cell>/``)::

    budget~<B>/          one per rung: adapter (safetensors), ledger.json, rung_state.json
                         (its copy, with the job's fingerprint), DONE
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
and metrics truncated to that step; the replayed steps are recomputed from the same RNG state
and data order, so nothing is lost or counted twice. On the CPU they are bit-identical; on a
GPU, whose attention backward and matmul reductions are not deterministic, they agree to
rounding (and a run resumed on another device draws a new sampling stream: a CPU checkpoint
holds no CUDA generator state). A damaged checkpoint is skipped
(an earlier one is taken, or the run starts fresh); an older checkpoint is deleted only once
the newer one is complete (race.grpo.resume.drop_older_checkpoints), so a kill while saving
never leaves none.

Snakemake deletes a rerun job's declared outputs (every rung's ``ledger.json`` and ``DONE``)
before running it. Those summaries are rebuilt, not retrained: the checkpoint state (and, for
a finished run, ``train.json`` and the run's ``ledger.json``) records at which step and with
which counters each rung was snapshotted, and a rung's summary is the ledger's prefix at that
step. A rung is retrained only when its adapter is gone. A rung that a resumed (or, with no
checkpoint before it, a fresh) run passes again gets back the summary it had, wall seconds
included, when the replay charged the same FLOPs (its ``rung_state.json``), so that its
``ledger.json`` is rebuilt byte for byte and the run's ledger takes back those rows.

Whatever is reused must come from the same job: checkpoints and ``train.json`` carry a
fingerprint of the job's trajectory-defining fields and of its inputs (the base policy's files,
the training data, a trained PRM; for a hub id, the revision asked for and the commit it
resolved to, recorded under ``references`` in ``train.json``), so a rerun after a config or
input change starts fresh instead of resuming a different run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from race.core.atomic import make_temp_dir, saving_weights, write_json_atomic, write_text_atomic
from race.core.cells import DONE, PERF, format_budget, rung_dir
from race.core.jobs import TrainJob
from race.core.outputs import read_output
from race.core.references import pinned, require_folder_or_hub_id
from race.flops import analytic as flops
from race.flops.ledger import BUDGET_PHASES, Ledger, LedgerRow
from race.flops.meter import BatchShapes, StepMeter, generation_step_bound
from race.flops.peak import device_peak, utilisation
from race.grpo.adapter_card import finish_adapter
from race.grpo.resume import (
    RUNG_STATE,
    discard_partial_snapshots,
    job_fingerprint,
    job_references,
    kept_rung_summaries,
    latest_checkpoint,
    ledger_summary,
    rebuild_rungs,
    reuse_finished,
    rung_complete,
    same_but_wall,
    summary_json,
)
from race.grpo.trainer import (
    PhaseRecorder,
    budget_callback_class,
    fused_head_is_compact,
    grpo_config,
    metered_trainer_class,
)
from race.policy.device import kernel_path


class BudgetError(ValueError):
    """A budget (or rung) is smaller than one training step."""


def progress_line(row: dict, budget: float) -> str:
    """One line per training step: FLOPs used of the budget, reward, wall seconds per phase."""
    reward = row.get("reward_mean")
    return (f"race train: step {row['step']} | {row['flops_total']:.3e} / {budget:.3e} model "
            f"FLOPs ({100 * row['flops_total'] / budget:.1f}%) | reward "
            f"{'-' if reward is None else f'{reward:.3f}'} | s rollout {row['rollout_s']:.2f} "
            f"learning {row['learning_s']:.2f} reward {row['reward_s']:.2f}")


# --------------------------------------------------------------------------- the trainer


class MeteredRun:
    """The bookkeeping of one run; the TRL trainer drives it through ``BudgetCallback``."""

    def __init__(self, job: TrainJob, arch: flops.Arch, reward, max_prompt_len: int,
                 device: str = "cpu", peak_flops: float | None = None):
        self.job = job
        self.peak_flops = peak_flops  # the device's (race.flops.peak): per-step utilisation
        self.run_dir = Path(job.run_dir)
        self.reward = reward
        self.meter = StepMeter(arch, job.alloc.lora, beta=job.alloc.beta,
                               num_iterations=job.alloc.num_iterations,
                               grad_ckpt=job.gradient_checkpointing,
                               attn_implementation=job.attn_implementation,
                               head_all_positions=not fused_head_is_compact(device),
                               rollout_engine=job.rollout_engine)
        # The bound of a generation step depends only on the worst case: computed once.
        self.generation_bound = generation_step_bound(
            self.meter, job.alloc.rows, max_prompt_len, job.alloc.max_completion_length,
            reward.reads)
        self.ledger = Ledger()
        self.counters = {"updates": 0, "rollouts": 0, "prompts_seen": 0}
        self.metrics: list[dict] = []
        self.rungs_done: list[float] = []
        self.rung_counters: dict[float, dict] = {}  # rung -> counters (and step) at its snapshot
        self.next_bound: int | None = None  # the bound the last step's rung check used
        self.fingerprint = job_fingerprint(job)
        # The rung summaries an earlier process of this job wrote: read now, before a fresh
        # start deletes the rung folders (see rung_summary).
        self.kept_rungs = kept_rung_summaries(self.run_dir, self.fingerprint)
        self.references = job_references(job)  # hub inputs: revision and commit (train.json)
        self.finished = False
        self.recorder = PhaseRecorder()  # the trainer's seams write into it
        self.logger = None

    # ------------------------------------------------------------------ bounds
    def first_step_bound(self) -> int:
        return self.generation_bound

    def next_step_bound(self, step: int) -> int:
        if step % self.job.alloc.num_iterations == 0:  # the next step generates
            return self.generation_bound
        # A reuse step trains on the last generated batch again: its cost is known exactly.
        return self.meter.learning(self.recorder.last_shapes, generation_step=False).model

    # ------------------------------------------------------------------ per step
    def end_of_step(self, step: int, model) -> None:
        t = self.recorder.take()
        shapes = t.shapes
        generation_step = shapes is not None
        batch = shapes if generation_step else self.recorder.last_shapes
        learning = self.meter.learning(batch, generation_step)
        learn_s = max(0.0, t.step_s - t.rollout_s - t.reward_s)
        if generation_step:
            rollout = self.meter.rollout(shapes)
            reward = self.reward.consume()
            self.ledger.add(step, "rollout", rollout.model, rollout.executed, rollout.tokens,
                            round(t.rollout_s, 6))
            self.ledger.add(step, "reward", reward.model, reward.executed, reward.tokens,
                            round(t.reward_s, 6))
            self.counters["rollouts"] += shapes.rows
            self.counters["prompts_seen"] += shapes.rows // self.job.alloc.num_generations
        self.ledger.add(step, "learning", learning.model, learning.executed, learning.tokens,
                        round(learn_s, 6))
        self.counters["updates"] += 1
        self.step_seconds = {"rollout_s": t.rollout_s if generation_step else 0.0,
                             "reward_s": t.reward_s if generation_step else 0.0,
                             "learning_s": learn_s}
        executed = {"learning": learning.executed}
        if generation_step:
            executed.update(rollout=rollout.executed, reward=reward.executed)
        self.step_mfu = {f"mfu_{p}": utilisation(executed.get(p, 0),
                                                 self.step_seconds[f"{p}_s"], self.peak_flops)
                         for p in BUDGET_PHASES}

        total = self.ledger.model_total
        if total > self.job.budget:  # the bound makes this impossible; guard the invariant
            raise RuntimeError(f"step {step} took the run past its budget ({total} > "
                               f"{self.job.budget}); the step bound is wrong")
        self.next_bound = self.next_step_bound(step)
        for budget in self.due_rungs(total):
            self.snapshot(budget, model, step)
        if len(self.rungs_done) == len(self.job.rungs):
            self.finished = True  # _finish writes the run's ledger

    def snapshot(self, budget: float, model, step: int) -> None:
        """Write the rung folder atomically: adapter (with a resolvable base and its card,
        race.grpo.adapter_card), ledger summary and its copy (``rung_state.json``), DONE."""
        if self.ledger.model_total > budget:  # a rung this run passed (see due_rungs)
            raise RuntimeError(f"rung {format_budget(budget)}: the run is already at "
                               f"{self.ledger.model_total} model FLOPs")
        final = rung_dir(self.run_dir, budget)
        self.rung_counters[budget] = dict(self.counters, step=step)
        summary = self.rung_summary(budget, step)
        tmp = make_temp_dir(self.run_dir, prefix=f".{final.name}.")
        with saving_weights(tmp, f"rung snapshot {final}", discard_partial=True):
            model.save_pretrained(tmp, safe_serialization=True)
            write_text_atomic(tmp / "ledger.json", summary_json(summary))
            write_json_atomic(tmp / RUNG_STATE, {"fingerprint": self.fingerprint,
                                                 "summary": summary}, indent=None)
            finish_adapter(tmp, self.job, budget, summary)
            (tmp / DONE).write_text("")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.rungs_done.append(budget)

    def rung_summary(self, budget: float, step: int) -> dict:
        """The rung's ledger summary at ``step``. A rung passed again after a kill (the steps
        since the last checkpoint, or since the start, replayed) keeps the summary its first
        process wrote when only wall seconds differ, and the run's ledger takes back that
        process's rows: the rung's ``ledger.json`` comes out byte for byte as first written."""
        summary = ledger_summary(self.ledger.prefix(step), budget, self.rung_counters[budget])
        kept = self.kept_rungs.pop(budget, None)
        if kept is None or not same_but_wall(kept, summary):
            return summary
        later = [r for r in self.ledger.rows if r.step > step]
        self.ledger = Ledger([LedgerRow(**row) for row in kept["rows"]] + later)
        return kept

    def due_rungs(self, total: int) -> list[float]:
        """The stop rule: rungs not yet snapshotted that the next step could pass (total + the
        next step's bound > rung). Checked after every step, so after a restore a due rung is
        one the run passed without a snapshot -- a rung added to the config below where the
        checkpoint stands -- and only a fresh run can write it. A checkpoint without the bound
        it checked with is judged by the largest one, that of a generation step. ``total``:
        the run's model FLOPs so far (the ledger's sum, which the caller has at hand)."""
        bound = self.generation_bound if self.next_bound is None else self.next_bound
        return [b for b in self.job.rungs if b not in self.rungs_done and total + bound > b]

    def rebuild_rungs(self) -> list[float]:
        return rebuild_rungs(self.run_dir, self.ledger, self.rung_counters)

    def state(self) -> dict:
        """What a checkpoint (and a finished run's ``train.json``) keeps of this run."""
        return {"fingerprint": self.fingerprint, "counters": self.counters,
                "rungs_done": self.rungs_done, "next_bound": self.next_bound,
                "rung_counters": [[b, c] for b, c in self.rung_counters.items()]}

    def load_state(self, state: dict, ledger: Ledger) -> None:
        self.ledger = ledger
        self.counters = state["counters"]
        self.rungs_done = state["rungs_done"]
        self.next_bound = state.get("next_bound")
        self.rung_counters = {b: c for b, c in state["rung_counters"]}

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
        # Wall seconds of this step per phase, their utilisation of the device's peak and the
        # wall-clock time (epoch seconds) at its end: for progress and MLflow timestamps; the
        # only fields that differ between reruns.
        row.update({k: round(v, 6) for k, v in self.step_seconds.items()})
        row.update({k: None if v is None else round(v, 6) for k, v in self.step_mfu.items()})
        row["time"] = round(time.time(), 3)
        self.metrics.append(row)
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        print(progress_line(row, self.job.budget), file=sys.stderr, flush=True)
        if self.logger is not None:
            self.logger.log_row(row)

    # ------------------------------------------------------------------ resume
    def save_state(self, ckpt: Path, step: int) -> None:
        if self.logger is not None:
            self.logger.flush()  # MLflow holds every step up to this checkpoint
        state = {"step": step, "ledger": self.ledger.to_dict(), "metrics": self.metrics,
                 **self.state()}
        write_text_atomic(ckpt / "race_state.json", json.dumps(state))
        # The run-level ledger follows the checkpoints, not every step: rewriting the whole
        # ledger per step is O(steps) each and showed in the step time
        # (bench/performance/overhead.py).
        # metrics.jsonl (appended per step) and MLflow carry the per-step cumulative FLOPs.
        self.ledger.save(self.run_dir / "ledger.json", durable=False)

    def restore(self, ckpt: Path) -> None:
        state = read_output(ckpt / "race_state.json")
        self.load_state(state, Ledger.from_json(json.dumps(state["ledger"])))
        self.metrics = state["metrics"]
        # Steps after the checkpoint are replayed: drop what the killed run wrote for them.
        write_text_atomic(self.run_dir / "metrics.jsonl",
                      "".join(json.dumps(m, sort_keys=True) + "\n" for m in self.metrics))
        self.ledger.save(self.run_dir / "ledger.json")


# --------------------------------------------------------------------------- entry point


def _dataset(path: str, tokenizer):
    from datasets import Dataset

    from race.data.task import load_jsonl

    records = load_jsonl(path)
    prompts = [r.prompt for r in records]
    max_prompt = max(map(len, tokenizer(prompts, add_special_tokens=False)["input_ids"]))
    return Dataset.from_dict({"prompt": prompts,
                              "answer": [r.answer for r in records]}), max_prompt


#: The lock file of a run folder (:func:`run_lock`).
LOCK = ".lock"


class RunLockedError(RuntimeError):
    """Another process holds the run folder: it is training the same cell."""


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold the run folder for the whole job: two processes training one cell (a second
    scheduler started with --nolock, the job rerun by hand beside the workflow) would interleave
    their checkpoints, ledger and metrics. The lock is the kernel's (``flock`` on
    ``run_dir/.lock``), released when the process ends, killed or not: it never goes stale."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(f"{run_dir}: another process is training this cell (it holds "
                                 f"{run_dir / LOCK}); nothing was written") from None
        yield


def run_training(job: TrainJob) -> dict:
    """Train until the budget; returns the summary of the largest rung. Idempotent. The run
    folder is held by this process for the whole job (:func:`run_lock`)."""
    from race.policy.device import prepare_device
    from race.policy.ladder import POLICY_FOLDER

    # A GPU asked for and absent, several visible, or one without bfloat16: an error naming
    # the key, nothing written.
    device = prepare_device(job.device, job.dtype, one_gpu=True)
    # A base policy folder not written yet: named, before the run folder is touched.
    require_folder_or_hub_id(job.base, POLICY_FOLDER)
    run_dir = Path(job.run_dir)
    # The job's hub revisions pin every load, the reward's feedback model's included.
    with run_lock(run_dir), pinned(job.revisions):
        return _train(job, run_dir, device)


@dataclass
class Prepared:
    """What a training job loads before its first step."""

    tokenizer: Any
    dataset: Any
    max_prompt: int  # the longest training prompt, in policy tokens
    policy: Any
    reward: Any  # a rule or feedback-model reward (race.feedback.rewards)
    peak: Any  # the device's peak FLOP/s (race.flops.peak)

    def new_run(self, job: TrainJob, device: str) -> MeteredRun:
        arch = flops.Arch.from_config(self.policy.config)
        return MeteredRun(job, arch, self.reward, self.max_prompt, device, self.peak.flops_per_s)


def _train(job: TrainJob, run_dir: Path, device: str) -> dict:
    """Reuse a finished run, or prepare, resume (or start fresh), build the trainer, train
    to the budget and finish."""
    finished = reuse_finished(job, run_dir)
    if finished is not None:
        return finished
    ready = _prepare(job, run_dir, device)
    run = ready.new_run(job, device)
    first = run.first_step_bound()
    if first > job.rungs[0]:
        raise BudgetError(
            f"budget rung {format_budget(job.rungs[0])} FLOPs is smaller than one training "
            f"step of this cell (up to {first:.3e} model FLOPs with {job.alloc.rows} "
            f"completions of up to {job.alloc.max_completion_length} tokens): raise the rung "
            f"or shrink the allocation")
    run, resume = _resume_or_fresh(run, ready, job, run_dir, device)
    if len(run.rungs_done) == len(job.rungs):  # killed after its last snapshot
        return _finish(run, job, run_dir)
    _attach_logger(run, job, run_dir, fresh=resume is None)
    trainer, max_steps = _build_trainer(run, ready, job, device)
    status = "FAILED"
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        if not run.finished:
            raise RuntimeError("training stopped before the budget was reached "
                               f"(steps {len(run.ledger.steps)}, max_steps {max_steps})")
        status = "FINISHED"
    finally:
        if run.logger is not None:
            # A failed job's points after its last checkpoint are replayed on resume, maybe
            # with other values: only the checkpointed ones (already flushed) stay.
            run.logger.finish(status, flush=status == "FINISHED")
    return _finish(run, job, run_dir)


def _prepare(job: TrainJob, run_dir: Path, device: str) -> Prepared:
    """Clear what a finished or killed earlier run left that this one rewrites, record where
    it computes, and load the tokenizer, data, policy and reward."""
    import torch

    from race.data.tokenizer import load_tokenizer
    from race.feedback.rewards import build_reward
    from race.policy.ladder import load_policy

    peak = device_peak(device, job.dtype)
    (run_dir / DONE).unlink(missing_ok=True)
    (run_dir / "train.json").unlink(missing_ok=True)
    discard_partial_snapshots(run_dir)
    # Where this process computes, its peak and CPU kernel path (the latest process's, after a
    # resume): runs on different kernel paths are not expected to agree bit for bit.
    write_json_atomic(run_dir / PERF, {"device": device, "threads": torch.get_num_threads(),
                                       **kernel_path(), **asdict(peak)}, indent=1)
    torch.manual_seed(job.seed)
    tokenizer = load_tokenizer(job.base)  # at the job's pin (run_training's pinned)
    dataset, max_prompt = _dataset(job.train_data, tokenizer)
    policy = load_policy(job.base, attn_implementation=job.attn_implementation,
                         dtype=getattr(torch, job.dtype))
    # The feedback model computes beside the policy unless its rewards: entry names a device.
    reward = build_reward({"device": device, **job.reward.to_dict()}, tokenizer=tokenizer,
                          results_dir=job.results_dir)
    return Prepared(tokenizer, dataset, max_prompt, policy, reward, peak)


def _resume_or_fresh(run: MeteredRun, ready: Prepared, job: TrainJob, run_dir: Path,
                     device: str) -> tuple[MeteredRun, Path | None]:
    """The run restored from this job's latest checkpoint, or a fresh one (and no
    checkpoint) when there is none or it cannot write every rung again."""
    resume = latest_checkpoint(run_dir, run.fingerprint)
    if resume is not None:
        run.restore(resume)
        rebuilt = run.rebuild_rungs()  # the summaries Snakemake deleted before this rerun
        lost = [b for b in run.rungs_done if not rung_complete(run_dir, b)]
        passed = run.due_rungs(run.ledger.model_total)
        if lost or passed or any(b not in job.rungs for b in run.rungs_done):
            # A rung snapshot taken before this checkpoint lost its adapter, or the rungs
            # changed (one removed, or one added below the checkpoint): only a fresh run can
            # write them. Deterministic: every rung comes out the same.
            run, resume = ready.new_run(job, device), None
        else:
            kept = len(run.ledger.steps)
            print(f"race train: resuming from {resume.name} ({kept} steps kept; rung "
                  f"summaries rebuilt: {[format_budget(b) for b in rebuilt]})", file=sys.stderr)
    if resume is None:
        # Fresh: nothing of an earlier or different run may leak in (TRL would rotate its
        # checkpoints in with the new ones; metrics.jsonl is appended to; an old rung's
        # adapter must not pass for this job's).
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        for old_rung in run_dir.glob("budget~*"):
            shutil.rmtree(old_rung)
    return run, resume


def _attach_logger(run: MeteredRun, job: TrainJob, run_dir: Path, fresh: bool) -> None:
    """Live MLflow logging, when the job asks for it."""
    if job.mlflow is None or not getattr(job.mlflow, "enabled", False):
        return
    from race.tracking.mlflow_runs import RunLogger

    run.logger = RunLogger(job.mlflow, run_dir, job.run_key or str(run_dir), job.study,
                           job.params(), tags=job.tags)
    if fresh and not run.logger.created:
        # A fresh trajectory: the points the cell's MLflow run holds are another run's
        # (an earlier config, or steps a kill cut off); the old run goes to the trash.
        run.logger.replace_run()


def _build_trainer(run: MeteredRun, ready: Prepared, job: TrainJob, device: str):
    """The metered TRL trainer of this run, its seams writing into ``run.recorder``; and
    the ``max_steps`` it was given."""
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback

    # max_steps only sizes the data loader: the budget callback stops the run.
    max_steps = int(job.budget // max(1, run.meter.learning(
        BatchShapes.worst_case(job.alloc.rows, 1, 1), False).model)) + 1
    lora = LoraConfig(r=job.alloc.lora_rank,
                      lora_alpha=job.alloc.alpha,
                      target_modules=list(job.alloc.lora_targets), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")
    trainer = metered_trainer_class()(
        model=ready.policy, reward_funcs=[ready.reward],
        args=grpo_config(job, max_steps, device, ready.max_prompt),
        train_dataset=ready.dataset, processing_class=ready.tokenizer, peft_config=lora,
        callbacks=[budget_callback_class()(run)], recorder=run.recorder,
        rollout_engine=job.rollout_engine)
    trainer.remove_callback(PrinterCallback)  # per-step dicts on stdout: metrics.jsonl has them
    return trainer, max_steps


def _finish(run: MeteredRun, job: TrainJob, run_dir: Path) -> dict:
    """Write the run's ledger, ``train.json`` (the top rung's totals, the ``references`` of
    its hub inputs when it has any -- the one record of the commits a run used -- and the
    state that rebuilds every rung's summary) and ``DONE``; returns the summary."""
    run.ledger.save(run_dir / "ledger.json")
    summary = ledger_summary(run.ledger, job.budget, dict(run.counters))
    summary.pop("rows")
    if run.references:
        summary["references"] = run.references
    write_json_atomic(run_dir / "train.json", {**summary, "state": run.state()})
    (run_dir / DONE).write_text("")
    return summary
