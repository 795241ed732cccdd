"""Metered GRPO training: budget stop, nested rungs, resume after SIGKILL, determinism, MLflow,
and the online meter against FlopCounterMode."""

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from faults import checkpoint, kill_switch, steps_done

from race.core.atomic import current_umask
from race.core.cells import PERF, rung_dir
from race.core.cpu_kernels import cpu_vendor
from race.core.jobs import TrainJob, to_json
from race.core.outputs import set_aside_corrupt
from race.core.specs import Allocation, RewardSpec, TaskSpec
from race.data.task import write_splits
from race.flops.ledger import Ledger
from race.flops.meter import StepMeter, generation_step_bound
from race.grpo.resume import job_fingerprint, latest_checkpoint, reuse_finished, rung_complete
from race.grpo.run import BudgetError, RunLockedError, run_lock, run_training

ALLOC = Allocation(num_generations=4, prompts_per_step=2, max_completion_length=12,
                   num_iterations=2, lora_rank=4)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A random-init nano policy with the char tokenizer and a small train split."""
    from race.data.tokenizer import load_tokenizer, save_tokenizer
    from race.policy.ladder import build_ladder_model

    root = tmp_path_factory.mktemp("train")
    write_splits(TaskSpec(n_train=200, n_eval_in=10, n_eval_ood=10), root / "data")
    tok = load_tokenizer(save_tokenizer(root / "tok"))
    model = build_ladder_model("nano", tok, seed=0)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return root


def make_job(root: Path, run_dir: Path, rungs, **kw) -> TrainJob:
    return TrainJob(base=str(root / "base"), train_data=str(root / "data" / "train.jsonl"),
                    run_dir=str(run_dir), rungs=list(rungs), alloc=kw.pop("alloc", ALLOC),
                    save_every=kw.pop("save_every", 4), **kw)


def step_bound(root: Path, alloc: Allocation) -> int:
    from race.data.task import load_jsonl
    from race.data.tokenizer import load_tokenizer
    from race.flops import analytic as flops

    tok = load_tokenizer(root / "base")
    arch = flops.resolve_arch(str(root / "base"))
    max_prompt = max(len(tok(r.prompt, add_special_tokens=False)["input_ids"])
                     for r in load_jsonl(root / "data" / "train.jsonl"))
    meter = StepMeter(arch, alloc.lora, beta=alloc.beta, num_iterations=alloc.num_iterations)
    return generation_step_bound(meter, alloc.rows, max_prompt, alloc.max_completion_length,
                                 None)


def flops_rows(ledger: dict) -> list[tuple]:
    """Ledger rows without wall seconds (the only field that differs between runs)."""
    return [(r["step"], r["phase"], r["model_flops"], r["executed_flops"], r["tokens"])
            for r in ledger["rows"]]


def without_timing(row: dict) -> dict:
    """A metrics.jsonl row without its wall-clock fields (time, seconds and utilisation per
    phase)."""
    return {k: v for k, v in row.items()
            if k != "time" and not k.endswith("_s") and not k.startswith("mfu_")}


def metrics_rows(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl rows without their wall-clock fields."""
    return [without_timing(json.loads(line))
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read_rung(run_dir: Path, budget: float) -> dict:
    return json.loads((rung_dir(run_dir, budget) / "ledger.json").read_text())


def rung_bytes(run_dir: Path) -> dict:
    """Every rung's ledger.json, as bytes."""
    return {p.parent.name: p.read_bytes() for p in sorted(run_dir.glob("budget~*/ledger.json"))}


def adapter_tensors(run_dir: Path, budget: float) -> dict:
    from safetensors.torch import load_file

    return load_file(rung_dir(run_dir, budget) / "adapter_model.safetensors")


B1, B2 = 1.2e9, 2.4e9


@pytest.fixture(scope="module")
def reference_run(tiny_base, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref") / "cell"
    summary = run_training(make_job(tiny_base, run_dir, [B1, B2]))
    return run_dir, summary


def test_budget_semantics_and_nested_rungs(tiny_base, reference_run):
    run_dir, summary = reference_run
    bound = step_bound(tiny_base, ALLOC)
    for budget in (B1, B2):
        rung = read_rung(run_dir, budget)
        assert (rung_dir(run_dir, budget) / "DONE").exists()
        assert rung["model_flops"] <= budget
        assert budget - rung["model_flops"] < bound  # stopped within one step's worst case
        total = sum(rung["phases"][p]["model_flops"] for p in ("rollout", "learning", "reward"))
        assert total == rung["model_flops"]
        assert rung["p_learning"] == pytest.approx(
            rung["phases"]["learning"]["model_flops"] / rung["model_flops"])
        assert rung["updates"] == rung["steps"]
        # num_iterations = 2: every other step generates; each generates rows completions
        assert rung["rollouts"] == ALLOC.rows * ((rung["steps"] + 1) // 2)
    small, large = read_rung(run_dir, B1), read_rung(run_dir, B2)
    assert large["steps"] > small["steps"]
    assert flops_rows(large)[:len(small["rows"])] == flops_rows(small)  # a prefix
    # reuse steps generate nothing but still train: learning rows on every step
    ledger = Ledger.load(run_dir / "ledger.json")
    phases = {(r.step, r.phase) for r in ledger.rows}
    assert all((s, "learning") in phases for s in ledger.steps)
    assert not any((s, "rollout") in phases for s in ledger.steps if s % 2 == 0)
    assert summary["model_flops"] == large["model_flops"]


def test_a_rung_is_the_run_launched_with_that_budget(tiny_base, reference_run, tmp_path):
    """The nested-rung claim itself: the smaller rung of a run (batch reuse included) has the
    ledger and the adapter of a run launched with that rung as its only budget."""
    run_dir, _ = reference_run
    alone = tmp_path / "alone"
    run_training(make_job(tiny_base, alone, [B1]))
    assert flops_rows(read_rung(alone, B1)) == flops_rows(read_rung(run_dir, B1))
    nested, single = adapter_tensors(run_dir, B1), adapter_tensors(alone, B1)
    assert nested.keys() == single.keys()
    assert all(torch.equal(nested[k], single[k]) for k in nested)


def test_micro_batches_keep_the_ledger_and_the_adapters(tiny_base, reference_run, tmp_path):
    """training.micro_batch_rows cuts each step's 8 rows into micro-batches whose gradients
    accumulate into the same optimizer step: the ledger's FLOPs are identical row for row,
    the metrics equal up to rounding, and the adapters equal to rounding; batch reuse
    (num_iterations 2) included. 3 rows at most: two micro-batches of 4 would be too many,
    so the 8 rows go as 4 of 2."""
    from race.grpo.trainer import grpo_config, micro_batches

    assert [micro_batches(8, m) for m in (None, 8, 16, 4, 3, 1)] == [1, 1, 1, 2, 4, 8]
    assert micro_batches(12, 5) == 3 and micro_batches(7, 3) == 7
    run_dir, _ = reference_run
    micro = tmp_path / "micro"
    args = grpo_config(make_job(tiny_base, micro, [B1, B2], micro_batch_rows=3), 10)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps,
            args.generation_batch_size) == (2, 4, ALLOC.rows)
    run_training(make_job(tiny_base, micro, [B1, B2], micro_batch_rows=3))
    for budget in (B1, B2):
        assert flops_rows(read_rung(micro, budget)) == flops_rows(read_rung(run_dir, budget))
        a, b = adapter_tensors(micro, budget), adapter_tensors(run_dir, budget)
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    assert job_fingerprint(make_job(tiny_base, micro, [B1, B2], micro_batch_rows=3)) == \
        job_fingerprint(make_job(tiny_base, micro, [B1, B2]))


def test_budget_below_one_step_is_rejected_before_training(tiny_base, tmp_path):
    run_dir = tmp_path / "cell"
    with pytest.raises(BudgetError, match=r"budget rung 1e6 FLOPs is smaller than one"):
        run_training(make_job(tiny_base, run_dir, [1e6, 1e9]))
    assert not list(run_dir.glob("budget~*")) and not (run_dir / "checkpoints").exists()


def test_rerun_of_finished_run_is_a_no_op(tiny_base, reference_run):
    run_dir, summary = reference_run
    before = (run_dir / "ledger.json").stat().st_mtime_ns
    again = run_training(make_job(tiny_base, run_dir, [B1, B2]))
    assert again["model_flops"] == summary["model_flops"]
    assert (run_dir / "ledger.json").stat().st_mtime_ns == before


def test_a_cell_is_not_trained_by_two_processes_at_once(tiny_base, reference_run):
    """While one process holds a run folder, a second job of the same cell stops with an
    error naming it and writes nothing; the lock goes with the process that held it."""
    run_dir, summary = reference_run
    job = make_job(tiny_base, run_dir, [B1, B2])
    with run_lock(run_dir):
        before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
        with pytest.raises(RunLockedError, match="another process is training this cell"):
            run_training(job)
        assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before
    assert run_training(job)["model_flops"] == summary["model_flops"]


def test_determinism(tiny_base, reference_run, tmp_path):
    run_dir, _ = reference_run
    other = tmp_path / "cell"
    run_training(make_job(tiny_base, other, [B1, B2]))
    for budget in (B1, B2):
        assert flops_rows(read_rung(other, budget)) == flops_rows(read_rung(run_dir, budget))
        a, b = adapter_tensors(other, budget), adapter_tensors(run_dir, budget)
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert metrics_rows(run_dir) == metrics_rows(other)


def test_the_run_records_its_device_peak_and_utilisation(reference_run):
    """perf.json: where the run computed, with which CPU kernels (race.core.cpu_kernels) and the
    peak its utilisation divides by; every metrics row: the utilisation of each phase the
    step ran (mu = 2: every other step generates, the others reuse its batch and run no
    rollout)."""
    run_dir, _ = reference_run
    perf = json.loads((run_dir / PERF).read_text())
    assert perf["device"] == "cpu" and perf["source"] == "measured"
    assert perf["flops_per_s"] > 0 and perf["threads"] >= 1
    assert perf["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert perf["mkl_cbwr"] == os.environ.get("MKL_CBWR", "auto")
    assert perf["cpu_vendor"] == cpu_vendor()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["mfu_learning"] > 0 for r in rows)
    assert [r["mfu_rollout"] is not None for r in rows] == [r["rollout_s"] > 0 for r in rows]
    assert any(r["mfu_rollout"] is None for r in rows) and any(r["mfu_rollout"] for r in rows)


def start_training(job: TrainJob, log: Path, env: dict | None = None) -> subprocess.Popen:
    """``race train --job`` in a process of its own, its stdout and stderr into ``log`` (as
    the workflow's train rule runs it)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "race.cli", "train", "--job", to_json(job)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)


def delete_declared_outputs(run_dir: Path, rungs) -> None:
    """What Snakemake does before rerunning a failed train job: delete its declared outputs
    (every rung's ledger.json and the run's DONE)."""
    for budget in rungs:
        (rung_dir(run_dir, budget) / "ledger.json").unlink(missing_ok=True)
    (run_dir / "DONE").unlink(missing_ok=True)


def test_resume_after_sigkill_equals_uninterrupted(tiny_base, reference_run, tmp_path, capsys):
    """Killed past a checkpoint taken after its first rung, with the rung's summary deleted
    as Snakemake deletes it: the rerun rebuilds the summary and continues from the
    checkpoint (not from step 1), ending identical to an uninterrupted run."""
    run_dir, _ = reference_run
    killed = tmp_path / "cell"
    job = make_job(tiny_base, killed, [B1, B2])
    log = tmp_path / "train.log"
    proc = start_training(job, log, kill_switch(tmp_path / "kill", killed, rungs=1, steps=2))
    assert proc.wait(timeout=240) == -signal.SIGKILL
    # The job's log opens with the job itself, and holds no third-party deprecation warning
    # (race.policy.ladder.quiet_checkpointing_renames: PEFT's and TRL's use of transformers'
    # renamed checkpointing API).
    text = log.read_text()
    assert text.startswith(f"race train: job {to_json(job)}\n"), text[:300]
    assert "FutureWarning" not in text and "DeprecationWarning" not in text, text
    step, rungs = checkpoint(killed)
    assert rungs == 1 and steps_done(killed) > step  # killed past a checkpoint after B1
    assert rung_complete(killed, B1) and not (killed / "DONE").exists()
    delete_declared_outputs(killed, [B1, B2])
    # What a kill while the second rung's snapshot was being written leaves: its hidden folder.
    half = killed / ".budget~2.4e9.x1y2"
    half.mkdir()
    (half / "adapter_config.json").write_text("{")
    run_training(job)  # resumes from the checkpoint
    assert "rung summaries rebuilt: ['1.2e9']" in capsys.readouterr().err
    assert not list(killed.glob(".budget~*"))  # the half-written snapshot is gone
    for budget in (B1, B2):
        assert flops_rows(read_rung(killed, budget)) == flops_rows(read_rung(run_dir, budget))
        a, b = adapter_tensors(killed, budget), adapter_tensors(run_dir, budget)
        assert all((a[k] == b[k]).all() for k in a)
    steps = [json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # no step logged twice


class KilledInSave(BaseException):
    """Stands for a kill while a checkpoint is being saved."""


def test_a_kill_while_a_checkpoint_is_saved_keeps_the_previous_one(
        tiny_base, reference_run, tmp_path, monkeypatch, capsys):
    """Killed after TRL wrote the second checkpoint but before RACE's state went into it: the
    first checkpoint is still there and complete (TRL's own rotation deleted it before the
    callback ran), so the rerun resumes from it instead of training from step 1."""
    from race.grpo.run import MeteredRun

    run_dir, _ = reference_run
    killed = tmp_path / "cell"
    job = make_job(tiny_base, killed, [B1, B2])
    save_state = MeteredRun.save_state
    saves = []

    def save_then_die(self, ckpt, step):
        saves.append(step)
        if len(saves) == 2:
            raise KilledInSave
        save_state(self, ckpt, step)

    monkeypatch.setattr(MeteredRun, "save_state", save_then_die)
    with pytest.raises(KilledInSave):
        run_training(job)
    monkeypatch.undo()
    assert latest_checkpoint(killed, job_fingerprint(job)).name == f"checkpoint-{saves[0]}"
    first = rung_bytes(killed)
    delete_declared_outputs(killed, [B1, B2])
    run_training(job)
    assert f"resuming from checkpoint-{saves[0]}" in capsys.readouterr().err
    # B2 was snapshotted at the killed step and passed again by the replay: its ledger is
    # restored byte for byte (wall seconds included), and the run's ledger agrees with it.
    assert rung_bytes(killed) == first
    assert Ledger.load(killed / "ledger.json").to_dict()["rows"] == read_rung(killed, B2)["rows"]
    for budget in (B1, B2):
        assert flops_rows(read_rung(killed, budget)) == flops_rows(read_rung(run_dir, budget))
        a, b = adapter_tensors(killed, budget), adapter_tensors(run_dir, budget)
        assert all((a[k] == b[k]).all() for k in a)
    assert metrics_rows(killed) == metrics_rows(run_dir)
    assert [c.name for c in (killed / "checkpoints").glob("checkpoint-*")] == [
        c.name for c in (run_dir / "checkpoints").glob("checkpoint-*")]  # one kept


def test_a_rung_passed_again_by_a_fresh_start_keeps_its_ledger_and_weights_follow_the_umask(
        tiny_base, reference_run, tmp_path, monkeypatch, umask_002):
    """Killed after the first rung's snapshot and before any checkpoint is complete: the
    rerun starts fresh and passes that rung again; its ledger.json comes back byte for byte
    (the rung's rung_state.json). Under umask 002 every weight file, rung and checkpoint, is
    0664 like the other outputs, and adapter configs list their target modules sorted."""
    from race.grpo.run import MeteredRun

    run_dir, _ = reference_run
    killed = tmp_path / "cell"
    job = make_job(tiny_base, killed, [B1, B2])

    def die(self, ckpt, step):
        raise KilledInSave

    monkeypatch.setattr(MeteredRun, "save_state", die)
    with pytest.raises(KilledInSave):
        run_training(job)
    monkeypatch.undo()
    assert latest_checkpoint(killed, job_fingerprint(job)) is None and rung_complete(killed, B1)
    first = rung_bytes(killed)
    delete_declared_outputs(killed, [B1, B2])
    run_training(job)
    assert rung_bytes(killed)[rung_dir(killed, B1).name] == first[rung_dir(killed, B1).name]
    assert flops_rows(read_rung(killed, B2)) == flops_rows(read_rung(run_dir, B2))
    weights = sorted(killed.rglob("*.safetensors"))
    assert len(weights) == 3  # two rungs and the checkpoint
    assert {stat.S_IMODE(w.stat().st_mode) for w in weights} == {0o664}
    for config in killed.rglob("adapter_config.json"):
        modules = json.loads(config.read_text())["target_modules"]
        assert modules == sorted(ALLOC.lora_targets), config


def test_a_full_disk_while_saving_a_checkpoint_says_so_and_keeps_the_previous_one(
        tiny_base, reference_run, tmp_path, monkeypatch, capsys):
    """The disk fills up while TRL saves the second checkpoint: the error says so and names
    the checkpoint, whose partial folder is removed; the first checkpoint is intact, and the
    rerun resumes from it to the same rungs."""
    from transformers import Trainer

    from race.core.atomic import NoSpaceError

    run_dir, _ = reference_run
    full = tmp_path / "cell"
    job = make_job(tiny_base, full, [B1, B2])
    save = Trainer._save_optimizer_and_scheduler

    def fill_the_disk(self, output_dir):
        if output_dir.endswith("checkpoint-8"):
            (Path(output_dir) / "optimizer.pt").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        save(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", fill_the_disk)
    ckpt = full / "checkpoints" / "checkpoint-8"
    with pytest.raises(NoSpaceError, match=f"^no space left on device while saving checkpoint "
                                           f"{ckpt}; its partial folder was removed"):
        run_training(job)
    monkeypatch.undo()
    assert not ckpt.exists()
    assert latest_checkpoint(full, job_fingerprint(job)).name == "checkpoint-4"
    run_training(job)
    assert "resuming from checkpoint-4" in capsys.readouterr().err
    for budget in (B1, B2):
        assert flops_rows(read_rung(full, budget)) == flops_rows(read_rung(run_dir, budget))


def test_deleted_rung_summaries_of_a_finished_run_are_rebuilt_not_retrained(
        tiny_base, reference_run, tmp_path):
    run_dir, summary = reference_run
    copy = tmp_path / "cell"
    shutil.copytree(run_dir, copy)
    before = {b: (rung_dir(copy, b) / "ledger.json").read_bytes() for b in (B1, B2)}
    adapter_mtime = (rung_dir(copy, B2) / "adapter_model.safetensors").stat().st_mtime_ns
    metrics = (copy / "metrics.jsonl").read_bytes()
    delete_declared_outputs(copy, [B1, B2])
    again = run_training(make_job(tiny_base, copy, [B1, B2]))
    assert again == summary
    assert {b: (rung_dir(copy, b) / "ledger.json").read_bytes() for b in (B1, B2)} == before
    assert (copy / "DONE").exists() and (copy / "metrics.jsonl").read_bytes() == metrics
    assert (rung_dir(copy, B2) / "adapter_model.safetensors").stat().st_mtime_ns == (
        adapter_mtime)  # nothing retrained


def test_a_damaged_metrics_file_of_a_finished_run_is_rewritten(tiny_base, reference_run,
                                                                 tmp_path):
    """The MLflow mirror refuses a damaged metrics.jsonl and says to delete the run's DONE
    and rerun: that rerun must repair the file (from the checkpoint, replaying the steps
    after it), not reuse the finished run as it is."""
    run_dir, summary = reference_run
    copy = tmp_path / "cell"
    shutil.copytree(run_dir, copy)
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]  # a line cut short
    (copy / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    delete_declared_outputs(copy, [B1, B2])
    again = run_training(make_job(tiny_base, copy, [B1, B2]))
    assert again == summary
    assert metrics_rows(copy) == metrics_rows(run_dir)
    for budget in (B1, B2):
        assert flops_rows(read_rung(copy, budget)) == flops_rows(read_rung(run_dir, budget))
        a, b = adapter_tensors(copy, budget), adapter_tensors(run_dir, budget)
        assert all((a[k] == b[k]).all() for k in a)
    # Cut at a line boundary the file parses: the workflow's start finds it short of the
    # steps train.json counts and sets it aside with the run's DONE, so the job reruns.
    whole = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (copy / "metrics.jsonl").write_text("".join(whole[:-3]))
    [note] = set_aside_corrupt(copy.parent)
    assert f"for the {summary['steps']} steps the run recorded" in note
    assert not (copy / "DONE").exists()
    delete_declared_outputs(copy, [B1, B2])
    assert run_training(make_job(tiny_base, copy, [B1, B2])) == summary
    assert metrics_rows(copy) == metrics_rows(run_dir)


def test_a_rung_added_below_the_checkpoint_retrains_the_run(tiny_base, reference_run,
                                                           tmp_path):
    """A rung inserted into the config below where the run's checkpoint stands cannot be
    snapshotted by resuming (the stop rule passed it): the run trains afresh, and every rung,
    the new one too, is what a run with these rungs gives."""
    run_dir, _ = reference_run
    copy = tmp_path / "cell"
    shutil.copytree(run_dir, copy)
    middle = (B1 + B2) / 2
    run_training(make_job(tiny_base, copy, [B1, middle, B2]))
    bound = step_bound(tiny_base, ALLOC)
    rung = read_rung(copy, middle)
    assert rung["model_flops"] <= middle and middle - rung["model_flops"] < bound
    for budget in (B1, B2):
        assert flops_rows(read_rung(copy, budget)) == flops_rows(read_rung(run_dir, budget))
    assert flops_rows(read_rung(copy, B2))[:len(rung["rows"])] == flops_rows(rung)


def test_state_of_another_job_or_damaged_is_not_reused(tiny_base, reference_run, tmp_path,
                                                        monkeypatch):
    run_dir, _ = reference_run
    job = make_job(tiny_base, run_dir, [B1, B2])
    other = make_job(tiny_base, run_dir, [B1, B2], alloc=replace(ALLOC, learning_rate=1e-3))
    assert job_fingerprint(other) != job_fingerprint(job)
    assert job_fingerprint(replace(job, run_key="x", tags={"a": 1})) == job_fingerprint(job)
    assert reuse_finished(other, run_dir) is None  # a config change retrains
    assert latest_checkpoint(run_dir, job_fingerprint(other)) is None
    # so does a change of what a step is charged: ledgers of two conventions never mix
    from race.grpo import resume

    current = job_fingerprint(job)
    monkeypatch.setattr(resume, "FLOPS_CONVENTION", resume.FLOPS_CONVENTION + 1)
    assert job_fingerprint(job) != current and reuse_finished(job, run_dir) is None
    monkeypatch.undo()
    ckpt = latest_checkpoint(run_dir, job_fingerprint(job))
    assert ckpt is not None
    copy = tmp_path / "cell"
    shutil.copytree(run_dir, copy)
    (copy / "checkpoints" / ckpt.name / "race_state.json").write_text('{"step": ')  # cut short
    assert latest_checkpoint(copy, job_fingerprint(job)) is None
    (copy / "train.json").write_text("{")
    assert reuse_finished(job, copy) is None


def test_outputs_follow_the_umask(reference_run):
    run_dir, _ = reference_run
    umask = current_umask()
    assert stat.S_IMODE(rung_dir(run_dir, B1).stat().st_mode) == 0o777 & ~umask
    weights = sorted(run_dir.rglob("*.safetensors"))  # the rungs' and the checkpoint's
    for path in (rung_dir(run_dir, B1) / "ledger.json", run_dir / "train.json", *weights):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_mlflow_one_run_per_cell_and_no_duplicate_steps(tiny_base, tmp_path):
    from mlflow.tracking import MlflowClient

    from race.core.specs import MlflowSpec
    from race.tracking.mlflow_runs import ROW_KEYS, mlflow_key

    spec = MlflowSpec(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                      artifact_root=str(tmp_path / "artifacts"), experiment="t")
    run_dir = tmp_path / "cell"
    job = make_job(tiny_base, run_dir, [B1], mlflow=spec, run_key="size~nano/reward~rule")
    summary = run_training(job)
    # Delete the rung and rerun: the run is retrained afresh, its MLflow run replaced.
    shutil.rmtree(rung_dir(run_dir, B1))
    run_training(job)
    client = MlflowClient(tracking_uri=spec.tracking_uri)
    exp = client.get_experiment_by_name("t")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].data.tags["run_key"] == "size~nano/reward~rule"
    history = client.get_metric_history(runs[0].info.run_id, "flops/total")
    assert sorted(m.step for m in history) == list(range(1, summary["steps"] + 1))
    assert max(m.value for m in history) == summary["model_flops"]
    for key in ("flops/rollout", "flops/learning", "flops/reward", "flops/p_learning",
                "progress/updates", "progress/rollouts", "train/reward_mean", "perf/rollout_s"):
        assert key in runs[0].data.metrics
    # Another learning rate is another trajectory, trained afresh into the same run folder:
    # the live MLflow run holds the new run's values (its wall seconds at least differ from
    # the old run's), not the old ones it had at those steps.
    changed = make_job(tiny_base, run_dir, [B1], mlflow=spec, run_key="size~nano/reward~rule",
                       alloc=replace(ALLOC, learning_rate=3e-3))
    run_training(changed)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for field in sorted(set(rows[0]) - set(ROW_KEYS)):
        held = {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id,
                                                                     mlflow_key(field))}
        assert held == {r["step"]: pytest.approx(r[field]) for r in rows
                        if r.get(field) is not None}, field


def test_mlflow_off_leaves_files_complete(reference_run):
    run_dir, _ = reference_run
    assert not (run_dir / "mlflow_run_id").exists()
    for name in ("ledger.json", "metrics.jsonl", "train.json", "DONE"):
        assert (run_dir / name).exists()


@pytest.fixture(scope="module")
def tiny_prm(tiny_base):
    """A random-init PRM of the nano shape on the policy's tokenizer: a PRM reward."""
    from race.core.specs import PRMSpec
    from race.data.tokenizer import load_tokenizer
    from race.feedback.prm_training import init_classifier

    path = tiny_base / "prm"
    tok = load_tokenizer(tiny_base / "base")
    init_classifier("nano", tok, [], PRMSpec(init="random", seed=1))[0].save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("case", [
    dict(attn_implementation="eager"),  # batch reuse (ALLOC: num_iterations 2), rule reward
    dict(attn_implementation="sdpa", beta=0.04, gradient_checkpointing=True),
    dict(attn_implementation="eager", beta=0.04, num_iterations=1),
    dict(attn_implementation="sdpa", reward="prm"),
    dict(attn_implementation="eager", reward="rule+prm", num_iterations=1),
    dict(attn_implementation="sdpa", rollout_engine="merged"),
    dict(attn_implementation="eager", rollout_engine="static", num_iterations=1),
    dict(attn_implementation="sdpa", rollout_engine="static", beta=0.04),
    dict(attn_implementation="eager", rollout_engine="fused", num_iterations=1),
], ids=["mu2-eager", "beta-ckpt-mu2-sdpa", "beta-eager", "prm-mu2-sdpa", "rule+prm-eager",
        "merged-mu2-sdpa", "static-eager", "static-beta-mu2-sdpa", "fused-eager"])
def test_meter_matches_flop_counter(tiny_base, tiny_prm, tmp_path, monkeypatch, case):
    """Every step's executed FLOPs, phase by phase, equal what torch counts around the same
    phases (race.flops.counter.count_flops: every SDPA kernel, and the in-place addmm_ of TRL's
    log-prob head backward) -- exactly, for batch reuse, a reference forward, gradient
    checkpointing, a PRM reward and each rollout engine (race.core.engines: the merge's own
    matmuls, a static cache's full-length attention). The model FLOPs of every learning row are
    the analytic count of its rows' real tokens, the head at their completion positions."""
    from race.flops import analytic as F
    from race.flops.counter import count_flops
    from race.grpo import run as train_mod

    case = dict(case)
    alloc = replace(ALLOC, beta=case.pop("beta", 0.0),
                    num_iterations=case.pop("num_iterations", ALLOC.num_iterations))
    kind = case.pop("reward", "rule")
    reward = RewardSpec(kind, prm=None if kind == "rule" else str(tiny_prm))
    measured: list[dict] = []
    shapes: list = []
    base_cls = train_mod.metered_trainer_class

    def counting_class():
        cls = base_cls()

        class Counting(cls):
            # One counter per step (nested counters double count); rollout and reward are read
            # off the running total around their seams.
            def _around(self, phase, method, *a, **k):
                before = self._count.so_far()
                out = method(*a, **k)
                self._phases[phase] += self._count.so_far() - before
                return out

            def _generate(self, *a, **k):
                return self._around("rollout", super()._generate, *a, **k)

            def _calculate_rewards(self, *a, **k):
                return self._around("reward", super()._calculate_rewards, *a, **k)

            def training_step(self, *a, **k):
                self._phases = {"rollout": 0, "reward": 0}
                with count_flops() as fc:
                    self._count = fc
                    out = super().training_step(*a, **k)
                learning = fc.total - self._phases["rollout"] - self._phases["reward"]
                measured.append({**self._phases, "learning": learning})
                shapes.append(self.recorder.last_shapes)
                return out

        return Counting

    monkeypatch.setattr(train_mod, "metered_trainer_class", counting_class)
    job = make_job(tiny_base, tmp_path / "cell", [B1], alloc=alloc, reward=reward,
                   results_dir=str(tiny_base), **case)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_training(job)
    # No deprecation warning from what TRL and PEFT call (with gradient checkpointing: TRL
    # toggles it around generation by transformers' deprecated names; see
    # race.policy.ladder.quiet_checkpointing_renames).
    assert not [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    rows = Ledger.load(tmp_path / "cell" / "ledger.json").rows
    ledger = [{r.phase: r.executed_flops for r in rows if r.step == step}
              for step in range(1, len(measured) + 1)]
    assert [{p: row.get(p, 0) for p in ("rollout", "reward", "learning")} for row in ledger] \
        == measured
    assert any(m["reward"] for m in measured) == (kind != "rule")
    arch = F.resolve_arch(str(tiny_base / "base"))
    reuse = alloc.num_iterations > 1
    learning = sorted((r for r in rows if r.phase == "learning"), key=lambda r: r.step)
    for step, (row, batch) in enumerate(zip(learning, shapes, strict=True), 1):
        generating = (step - 1) % alloc.num_iterations == 0
        pairs = list(zip(batch.prompt_lens, batch.completion_lens, strict=True))
        model = sum(F.train_flops(arch, p + g, logits=g, lora=alloc.lora,
                                  grad_ckpt=job.gradient_checkpointing) for p, g in pairs)
        no_grad = [None] * (alloc.beta > 0) + [alloc.lora] * reuse
        model += generating * sum(F.forward_flops(arch, p + g, logits=g, lora=lora)
                                  for lora in no_grad for p, g in pairs)
        assert row.model_flops == model


def test_allocation_rejects_bad_values():
    with pytest.raises(ValueError, match="num_generations"):
        Allocation(num_generations=1)
    with pytest.raises(ValueError, match="lora_alpha: 0 is less than or equal to the minimum"):
        Allocation(lora_alpha=0)  # it used to fall back to 2 x rank silently
    assert Allocation(lora_rank=4).alpha == 8 and Allocation(lora_alpha=3).alpha == 3
    with pytest.raises(ValueError, match="strictly increasing"):
        TrainJob(base="b", train_data="d", run_dir="r", rungs=[2.0, 1.0])
    assert replace(ALLOC, num_iterations=1).rows == 8


def test_bfloat16_policy_when_the_config_asks(tiny_base, tmp_path, monkeypatch):
    """training.dtype: bfloat16 reaches the job (through the workflow's builder) and the
    trainer: the policy's weights are bfloat16 at every step (PEFT keeps the adapters in
    float32), and the run stops at the same step as in float32 (the meter counts tokens)."""
    import torch
    import yaml

    from race.grpo import run as train_mod
    from race.study import builders
    from race.study.config import load_study

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml")
                            .read_text())
    config["training"]["dtype"] = "bfloat16"
    (tmp_path / "bf16.yaml").write_text(yaml.safe_dump(config))
    study = load_study(tmp_path / "bf16.yaml")
    assert builders.train_job(study, study.grid_cells()[0]).dtype == "bfloat16"
    assert builders.eval_job(study, study.grid_cells()[0]).dtype == "bfloat16"

    seen: list[set] = []
    base_cls = train_mod.metered_trainer_class

    def spying_class():
        class Spy(base_cls()):
            def training_step(self, model, *a, **k):
                seen.append({p.dtype for n, p in model.named_parameters() if "lora_" not in n})
                return super().training_step(model, *a, **k)

        return Spy

    monkeypatch.setattr(train_mod, "metered_trainer_class", spying_class)
    alloc = Allocation(num_generations=4, prompts_per_step=2, max_completion_length=12,
                       lora_rank=4)
    bound = step_bound(tiny_base, alloc)
    bf16 = run_training(make_job(tiny_base, tmp_path / "bf16", [2.5 * bound], alloc=alloc,
                                 dtype="bfloat16"))
    assert seen and all(s == {torch.bfloat16} for s in seen)
    monkeypatch.undo()
    fp32 = run_training(make_job(tiny_base, tmp_path / "fp32", [2.5 * bound], alloc=alloc))
    assert bf16["steps"] == fp32["steps"] == 2


def test_fingerprint_follows_the_weights_not_other_files(tiny_base, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(tiny_base / "base", base)
    job = replace(make_job(tiny_base, tmp_path / "cell", [B1]), base=str(base))
    before = job_fingerprint(job)
    (base / "eval.json").write_text("{}")  # the base policy's evaluation lands in its folder
    assert job_fingerprint(job) == before
    weights = base / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert job_fingerprint(job) != before  # pretrained again


def test_adapter_configs_are_the_same_bytes_whatever_the_set_order(reference_run, tmp_path):
    """PEFT writes target_modules in set order, which changes with each process's string-hash
    salt: two saves of one config, its modules in two orders as two processes may write them,
    come out as the same adapter_config.json, modules sorted -- rungs and checkpoints alike."""
    from race.grpo.adapter_card import canonical_adapter_config

    run_dir, _ = reference_run
    rung = rung_dir(run_dir, B1) / "adapter_config.json"
    [ckpt] = (run_dir / "checkpoints").glob("checkpoint-*/adapter_config.json")
    for path in (rung, ckpt):
        assert json.loads(path.read_text())["target_modules"] == sorted(ALLOC.lora_targets)
    config = json.loads(rung.read_text())
    for reverse in (False, True):
        folder = tmp_path / f"save-{reverse}"
        folder.mkdir()
        peft = dict(config, target_modules=sorted(config["target_modules"], reverse=reverse))
        (folder / "adapter_config.json").write_text(json.dumps(peft, indent=2, sort_keys=True))
        canonical_adapter_config(folder)
    assert (tmp_path / "save-False" / "adapter_config.json").read_bytes() == (
        tmp_path / "save-True" / "adapter_config.json").read_bytes() == rung.read_bytes()


def test_a_rung_adapter_names_its_base_and_how_it_was_trained(tiny_base, reference_run,
                                                              tmp_path, monkeypatch):
    run_dir, _ = reference_run
    rung = rung_dir(run_dir, B1)
    config = json.loads((rung / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tiny_base / "base").resolve())
    card = (rung / "README.md").read_text()
    ledger = read_rung(run_dir, B1)
    assert f"steps {ledger['steps']}, optimizer updates {ledger['updates']}" in card
    assert "rank 4, alpha 8" in card and "[More Information Needed]" not in card
    monkeypatch.chdir(tmp_path)  # the base resolves from anywhere
    from race.evaluation.snapshot import load_snapshot

    assert load_snapshot(config["base_model_name_or_path"], rung).adapter == str(rung)


def test_a_missing_base_policy_folder_is_named_not_taken_for_a_hub_id(tiny_base, tmp_path,
                                                                       capsys):
    """A ladder size's base policy not written yet (its base job has not run): one line naming
    the folder and what writes it, not transformers' malformed-repo-id error."""
    from race.cli import main

    missing = tmp_path / "results" / "base" / "size~nano"
    job = replace(make_job(tiny_base, tmp_path / "run", [B1]), base=str(missing))
    assert main(["train", "--job", to_json(job)]) == 2
    err = capsys.readouterr().err
    assert err == ("race train: no such folder (a policy: a ladder size's base policy is "
                   f"written by its base job, `snakemake` or `race pretrain`): {missing}\n"), err
    assert not (tmp_path / "run").exists()
