"""Peak-memory estimates (race.study.memory) in race plan and race check-config: a job that
does not fit the stated GPU is refused before anything runs; micro-batching shrinks it. The
estimate against a measurement is tests/test_rehearsal.py's (the rehearsal's models)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from race.core.errors import ConfigError
from race.study.config import load_study
from race.study.memory import GIB, study_memory

ROOT = Path(__file__).resolve().parents[1]


def qwen_config(tmp_path: Path, **overrides) -> Path:
    config = yaml.safe_load((ROOT / "configs" / "qwen2.5.yaml").read_text())
    for dotted, value in overrides.items():
        *parents, key = dotted.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[key] = value
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_job_that_does_not_fit_the_gpu_is_refused_naming_it_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"gpu_memory_gb: job train size~Qwen--Qwen2\.5-"
                                          r".* GiB stated: lower training\.micro_batch_rows"):
        load_study(qwen_config(tmp_path, gpu_memory_gb=24, **{"training.micro_batch_rows": 128}))
    study = load_study(qwen_config(tmp_path, gpu_memory_gb=80))  # micro-batches of 16 fit
    assert max(e.total for e in study_memory(study).values()) < 80 * GIB


def test_micro_batches_and_checkpointing_shrink_the_learning_peak(tmp_path):
    def learning(**overrides) -> int:
        study = load_study(qwen_config(tmp_path, **overrides))
        return sum(study_memory(study)["train size~Qwen--Qwen2.5-7B/reward~rule/alloc~base/"
                                        "seed~0"].phases["learning"].values())

    whole = learning(**{"training.micro_batch_rows": None})
    assert learning(**{"training.micro_batch_rows": 16}) < whole / 4
    assert learning(**{"training.micro_batch_rows": None,
                       "training.gradient_checkpointing": False}) > 3 * whole


def test_the_feedback_model_is_counted_once_per_job(tmp_path):
    """The evaluation job loads the Math PRM once for prm_bon and native_reward
    (race.evaluation.feedback_models): its weights are counted once."""
    study = load_study(qwen_config(tmp_path))
    estimates = study_memory(study)
    ev = estimates["evaluate size~Qwen/Qwen2.5-0.5B"]
    train = estimates["train size~Qwen--Qwen2.5-0.5B/reward~math-prm/alloc~base/seed~0"]
    assert ev.resident["feedback_weights"] == train.resident["feedback_weights"]
    assert 13 * GIB < ev.resident["feedback_weights"] < 14 * GIB  # 7.07e9 bf16 parameters


def race(*args) -> str:
    proc = subprocess.run([sys.executable, "-m", "race.cli", *args], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_one_gpu_config_fits_a_gpu_day_at_its_stated_rate():
    out = race("check-config", "configs/qwen2.5-1gpu.yaml", "--flops-per-second", "5.1e12")
    # the training (the budget); the evaluation jobs are priced on their own line
    training = float(re.search(r"^  training <= .* = ([0-9.e+]+) h", out, re.M).group(1))
    assert training <= 24
    assert re.search(r"^  evaluation <=  evaluation [0-9.e+]+ = [0-9.e+]+ h", out, re.M)
    assert "peak memory per job" in out and "gpu_memory_gb 80" in out


def test_race_plan_prints_the_jobs_memory():
    out = race("plan", "--config", "configs/qwen2.5.yaml", "--size", "Qwen/Qwen2.5-7B",
               "--alloc", "base", "--reward", "math-prm")
    assert re.search(r"train job +\d+(\.\d+)? GiB \(policy_weights", out)
    assert re.search(r"evaluate job +\d+(\.\d+)? GiB", out)
