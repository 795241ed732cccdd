"""Where model jobs compute: the ``device`` key from the config to every model verb, resolved in
the job's process (CUDA absent -> CPU), a GPU asked for and absent refused before any compute,
and the trainer's TRL config following the resolved device."""

from pathlib import Path

import pytest
import torch

from race.core import jobs
from race.core.specs import RewardSpec
from race.policy import device as D
from race.study import builders
from race.study.config import load_study, typed_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def gpu(monkeypatch):
    """A machine that reports a GPU; TF32 requests are recorded, not applied."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked: list[str] = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", asked.append)
    return asked


def test_auto_is_the_cpu_without_a_gpu_and_cuda_with_one(no_gpu):
    assert D.resolve_device("auto") == D.resolve_device(None) == "cpu"
    assert D.resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="device: cuda, but torch sees no CUDA device"):
        D.resolve_device("cuda")
    with pytest.raises(ValueError, match="device: expected one of auto, cpu, cuda, got 'tpu'"):
        D.resolve_device("tpu")


def test_a_visible_gpu_is_taken_with_tf32_matmuls(gpu):
    assert D.prepare_device("auto") == D.prepare_device("cuda") == "cuda"
    assert gpu == ["high", "high"]
    assert D.prepare_device("cpu") == "cpu" and len(gpu) == 2  # the CPU's precision untouched


def test_a_gpu_the_job_cannot_use_is_refused_by_key(gpu, monkeypatch):
    """Before anything is loaded, a ConfigError naming the key: bfloat16 asked for on a GPU
    that only emulates it; for a training job (one process, one GPU), several visible GPUs
    outside a launch and any distributed launch; never an evaluation, which computes on the
    first GPU."""
    from race.core.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    # torch's default counts emulation as support: a V100 answers True unless asked natively
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="training.dtype: bfloat16, but Tesla V100 has no"):
        D.prepare_device("cuda", "bfloat16")
    assert D.prepare_device("cuda", "float32") == "cuda"
    with pytest.raises(ConfigError, match="device: 2 GPUs are visible, and a training job"):
        D.prepare_device("auto", "float32", one_gpu=True)
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node 1
    assert D.prepare_device("auto", "float32", one_gpu=True) == "cuda"
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="a distributed launch of 2 processes"):
        D.prepare_device("auto", "float32", one_gpu=True)
    assert D.prepare_device("cpu", "bfloat16", one_gpu=True) == "cpu"  # the CPU has bfloat16


def test_feedback_models_resolve_the_same_way(no_gpu):
    from race.feedback.models import resolve_device

    assert resolve_device(None) == resolve_device("auto") == "cpu"
    assert resolve_device("cuda:1") == "cuda:1"  # a torch device string passes as it is


def test_every_model_job_carries_the_configs_device():
    config = load_study(ROOT / "configs" / "smoke.yaml")
    assert config.device == "auto"  # the schema's default
    config = typed_study({**config.config, "device": "cpu"})
    cell = config.grid_cells()[0]
    built = [builders.train_job(config, cell), builders.eval_job(config, cell),
             builders.base_eval_job(config, "nano"), builders.pretrain_job(config, "nano"),
             builders.prm_job(config, "nano")]
    assert [j.device for j in built] == ["cpu"] * 5
    assert all(jobs.from_json(type(j), jobs.to_json(j)).device == "cpu" for j in built)


def test_the_device_is_not_part_of_the_trajectory():
    """A run resumed on another device goes on from its checkpoint (module docstring of
    race.grpo.resume): the device changes where it computes, not what the run is."""
    from dataclasses import replace

    from race.grpo.resume import job_fingerprint

    job = jobs.TrainJob(base="no/base", train_data="no/data.jsonl", run_dir="r", rungs=[1.0])
    assert job_fingerprint(job) == job_fingerprint(replace(job, device="cuda"))
    assert job_fingerprint(job) != job_fingerprint(replace(job, dtype="bfloat16"))
    # Nor where the reward's feedback model computes, or its scoring batch; its dtype is.
    prm = replace(job, reward=RewardSpec(type="prm", prm="nano"))
    assert job_fingerprint(prm) == job_fingerprint(
        replace(prm, reward=replace(prm.reward, device="cpu", batch_size=8)))
    assert job_fingerprint(prm) != job_fingerprint(
        replace(prm, reward=replace(prm.reward, dtype="bfloat16")))


def test_trl_config_follows_the_resolved_device():
    from race.grpo.trainer import grpo_config

    job = jobs.TrainJob(base="b", train_data="d", run_dir="r", rungs=[1.0])
    assert grpo_config(job, 3, "cpu").use_cpu is True
    assert grpo_config(job, 3, "cuda").use_cpu is False  # TRL's accelerator takes the GPU


def test_a_gpu_asked_for_and_absent_fails_before_anything_is_written(no_gpu, tmp_path):
    from race.evaluation.eval_job import evaluate
    from race.grpo.run import run_training

    run_dir = tmp_path / "run"
    job = jobs.TrainJob(base=str(tmp_path / "no-base"), train_data=str(tmp_path / "none.jsonl"),
                        run_dir=str(run_dir), rungs=[1.0e9], device="cuda")
    with pytest.raises(ValueError, match="device: cuda"):
        run_training(job)
    assert not run_dir.exists()
    with pytest.raises(ValueError, match="device: cuda"):
        evaluate(tmp_path / "no-base", tmp_path, tmp_path / "eval.json", device="cuda")
    assert not (tmp_path / "eval.json").exists()
