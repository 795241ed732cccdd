"""Dry-run wall time of the workflow on a 10,000-cell grid (target <= 20 s). Prints, never
asserts: these machines are shared and noisy.

Grid: 10 sizes x 10 rewards x 10 allocations x 10 seeds over 3 rungs, built from the default
config in a temporary copy of the workflow (sizes are hub-style ids, so no pretraining jobs).
"""

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp)
        shutil.copy(ROOT / "Snakefile", wd / "Snakefile")
        shutil.copytree(ROOT / "workflow", wd / "workflow")
        shutil.copytree(ROOT / "envs", wd / "envs")
        config = yaml.safe_load((ROOT / "config.yaml").read_text())
        config["sizes"] = [f"org/model-{i}" for i in range(10)]
        config["rewards"] = {f"r{i}": {"type": "rule"} for i in range(10)}
        config["allocations"] = {f"a{i}": {"num_generations": 2 + i} for i in range(10)}
        config["seeds"] = list(range(10))
        config["budgets"] = [1e12, 2e12, 4e12]
        config["race"].update(pilot_rungs=[1e12], validation_budget=4e12,
                              validation_seeds=[0], baseline="a0")
        config["prm"]["sizes"] = []
        config["eval"]["prm"] = None
        (wd / "config.yaml").write_text(yaml.safe_dump(config))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1",
                               ], cwd=wd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        cells = 10 ** 4
        status = "ok" if proc.returncode == 0 else f"failed: {(proc.stdout + proc.stderr)[-800:]}"
        jobs = planned_jobs(proc.stdout)
        print(f"dag_scale: {cells} cells x 3 rungs = {jobs} jobs, snakemake -n wall {wall:.1f} s "
              f"(target <= 20 s), {1e3 * wall / max(jobs, 1):.2f} ms per job [{status}]")


def planned_jobs(dry_run_stdout: str) -> int:
    """The 'total' row of a dry run's job stats (0 if absent)."""
    for line in dry_run_stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total" and parts[1].isdigit():
            return int(parts[1])
    return 0


if __name__ == "__main__":
    main()
