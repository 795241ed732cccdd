"""bench/performance/gpu_check.py, the one script a GPU session runs: without a GPU it says so
and measures nothing; with --cpu every code path runs at a tiny scale (one race train step
counted against the ledger, policy device and dtype inside race train, FLOP fidelity, race train
vs TRL, rollout caches). The scripts that pack its wheels and run it on a bare GPU machine are
checked for syntax only (packing needs a registry, running needs a GPU)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from race.core.engines import DEFAULT_ENGINE
from race.study.hours import read_rates

PERFORMANCE = Path(__file__).resolve().parents[1] / "bench" / "performance"
SCRIPT = PERFORMANCE / "gpu_check.py"


def _run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_reports_no_gpu_and_measures_nothing():
    out = _run()
    assert out.startswith("no GPU: torch sees no CUDA device")
    assert "measured / analytic" not in out


def test_cpu_mode_runs_every_part(tmp_path):
    out = _run("--cpu", "--steps", "4", "--rounds", "1", "--rates", str(tmp_path / "rates.json"))
    assert "FAILED" not in out
    assert re.search(r"^stack: transformers \S+, trl \S+, peft \S+", out, re.M)
    # One race train step counted: a padded batch, the ledger against FlopCounterMode per phase
    # (exact on the CPU), seconds and MFU per phase, memory.
    assert "race train, one step counted (4 prompts x 4 completions = 16 rows" in out
    assert re.search(r"step 1 batch: prompts \d+\.\.\d+ tokens .*padding: prompts yes, "
                     r"completions yes", out)
    counted = re.findall(r"^ +(rollout|learning|reward|total) +ledger (\S+) +counted (\S+) +"
                         r"ledger / counter (\S+)$", out, re.M)
    assert [c[0] for c in counted] == ["rollout", "learning", "reward", "total"]
    for _, ledger, counter, ratio in counted:
        assert float(ledger) > 0 and float(counter) > 0
        assert float(ratio) == 1.0
    for step in (1, 2):
        assert re.search(rf"step {step}\b.*: seconds rollout [\d.]+ s, learning [\d.]+ s, "
                         r"reward [\d.]+ s; MFU rollout \S+, learning \S+, reward \S+", out)
    assert "peak memory: not measured on CPU" in out
    assert re.search(r"memory estimate(: not available| \(race\.study\.memory)", out)
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
    for part in ("counted step", "placements", "FLOP fidelity", "race train vs TRL", "rollout",
                 "rates file"):
        assert re.search(rf"\[{part}: \d+ s\]", out)
    # the rates it measured, for race check-config --rates
    rates = read_rates(tmp_path / "rates.json")
    assert rates["device"].startswith("cpu") and "gpu_check.py" in rates["measured"]
    assert set(rates["phases"]) == {"rollout", "learning", "reward", "eval"}
    assert list(rates["phases"]["rollout"]) == [DEFAULT_ENGINE]


@pytest.mark.parametrize("script", ["pack_wheels.sh", "run_gpu_check.sh"])
def test_gpu_machine_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(PERFORMANCE / script)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
