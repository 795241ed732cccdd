"""The memory estimate (race.study.memory) against the tensor memory measured, on the
rehearsal's models and data (tests/test_rehearsal.py runs the rehearsal study itself). Apart
from it, so that it runs on another worker while the study does."""

from pathlib import Path

import pytest
from test_rehearsal import REHEARSAL
from test_workflow import snakemake, workdir


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory, install_stand_ins) -> Path:
    """A scratch copy of the workflow holding the rehearsal's stand-in models and its data
    (the data rule of configs/rehearsal.yaml), and nothing trained."""
    wd = workdir(tmp_path_factory.mktemp("rehearsal-memory"))
    install_stand_ins(wd / REHEARSAL / "hub")
    snakemake(wd, f"{REHEARSAL}/data/train.jsonl", "--cores", "1", "--configfile",
              "configs/rehearsal.yaml")
    return wd


@pytest.mark.slow
def test_the_memory_estimate_matches_the_measurement(stand_ins, monkeypatch):
    """race.study.memory's peak for a training job (one step; whole step and micro-batches)
    and an evaluation job of the rehearsal, within 25% of the tensor memory measured
    (race.study.memory_probe; bench/calibration/memory_estimate.py prints the table)."""
    import shutil
    from dataclasses import replace

    from race.evaluation.eval_job import run_evaluation
    from race.grpo.run import run_training
    from race.study.builders import eval_job, train_job
    from race.study.config import load_study
    from race.study.memory import eval_job_memory, train_job_memory
    from race.study.memory_probe import LiveTensorBytes

    rehearsal = stand_ins
    monkeypatch.chdir(rehearsal)
    study = load_study("configs/rehearsal.yaml")
    prompt = study.source.max_prompt_tokens
    cell = next(c for c in study.grid_cells() if c.reward == "math-prm" and c.alloc == "base")
    for micro in (None, 16):
        job = replace(train_job(study, cell), run_dir=str(rehearsal / "memory-run"),
                      rungs=[study.budgets[0]], micro_batch_rows=micro)
        shutil.rmtree(job.run_dir, ignore_errors=True)
        with LiveTensorBytes() as probe:
            run_training(job)
        assert train_job_memory(job, prompt).total == pytest.approx(probe.peak, rel=0.25)
    # The evaluation job of a math-prm cell (trained first, as the rehearsal trains it): its
    # two rungs, best-of-n and the native reward all read the one Math PRM, loaded once.
    run_training(train_job(study, cell))
    import race.feedback.loading as loading

    # The probe follows what operators return: weights a loader leaves memory-mapped (the
    # PRM's, read on the CPU) are resident all job but invisible to it, so they are added.
    probe, loads, unseen = LiveTensorBytes(), [], []
    real_load = loading.load_feedback_model

    def load(*args, **kwargs):
        model = real_load(*args, **kwargs)
        tensors = [*model.model.parameters(), *model.model.buffers()]  # no operator runs
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in tensors}
        loads.append(args[0])
        unseen.append(sum(n for key, n in storages.items() if key not in probe._alive))
        return model

    monkeypatch.setattr(loading, "load_feedback_model", load)
    job = eval_job(study, cell)
    job = replace(job, snapshots=[replace(s, out=str(rehearsal / f"m{i}.json"))
                                  for i, s in enumerate(job.snapshots)])
    assert len(job.snapshots) == 2 and {"prm_bon", "native_reward"} <= set(job.spec.targets)
    with probe:
        list(run_evaluation(job))
    assert len(loads) == 1
    measured = probe.peak + sum(unseen)
    assert eval_job_memory(job, prompt).total == pytest.approx(measured, rel=0.25)
