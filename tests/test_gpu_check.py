"""bench/performance/gpu_check.py, the one script a GPU session runs: without a GPU it says so
and measures nothing; with --cpu every code path runs at a tiny scale (policy device and dtype
inside race train, FLOP fidelity, race train vs TRL, rollout caches)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "performance" / "gpu_check.py"


def _run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_reports_no_gpu_and_measures_nothing():
    out = _run()
    assert out.startswith("no GPU: torch sees no CUDA device")
    assert "measured / analytic" not in out


def test_cpu_mode_runs_every_part():
    out = _run("--cpu", "--steps", "4", "--rounds", "1")
    cpu32 = "[('cpu', 'torch.float32')]"
    assert "race train (device: cpu, training.dtype: float32, rule+prm reward" in out
    for name in ("policy", "policy LoRA", "reward model", "PRM"):
        assert f"  {name}: {cpu32}" in out
    assert re.search(r"race evaluate \(device: cpu, training.dtype: float32, [\d.]+ s\)", out)
    assert re.search(r"in_pass1 \d\.\d{3}, .*prm_bon \d\.\d{3}", out)
    ratios = [float(x) for x in re.findall(r"measured / analytic executed (\S+)", out)]
    assert len(ratios) == 16 and all(r == 1.0 for r in ratios)  # 8 phases x eager, sdpa
    assert re.search(r"race train vs TRL GRPOTrainer .* ratio \d+\.\d+", out)
    assert "same tokens: True" in out
