"""GPU jobs on the local executor (race.policy.gpus): the workflow caps how many run at once,
each claims its own device, and jobs that ask for no GPU are left as they were."""

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_workflow import SMOKE_RESULTS, snakemake, workdir

from race.core.errors import ConfigError
from race.policy import gpus as G

ASKING = {"train": {"gpu": 1}, "evaluate": {"gpu": 1}, "jobs_per_gpu": 1}
GROUPS = ("base", "prm", "train", "evaluate")


def resources(**over) -> dict:
    """A resources section with the schema's defaults filled (gpu 0 in every group)."""
    out = {g: {"gpu": 0} for g in GROUPS} | {"jobs_per_gpu": 1}
    return out | over


def test_cuda_visible_devices_is_read_as_cuda_reads_it():
    assert G.parse_visible("0,1") == ["0", "1"]
    assert G.parse_visible(" 2, 3") == ["2", "3"]
    assert G.parse_visible("1,-1,2") == ["1"]  # an invalid entry ends the list
    assert G.parse_visible("") == [] and G.parse_visible("0,0") == []
    assert G.parse_visible("GPU-a1,GPU-b2") == ["GPU-a1", "GPU-b2"]
    assert G.visible_devices({"CUDA_VISIBLE_DEVICES": "3,5"}) == ["3", "5"]


def test_the_cap_is_the_gpus_times_jobs_per_gpu_and_the_command_line_wins():
    assert G.local_slots(resources(), "locks", visible=["0"]) is None  # nothing asks for one
    asking = resources(**ASKING)
    slots = G.local_slots(asking, "locks", visible=["0", "1"])
    assert slots.devices == ("0", "1") and slots.cap == 2
    assert slots.verbs == {"train": 1, "evaluate": 1}
    assert G.local_slots(asking | {"gpus": 1}, "locks", visible=["4", "6"]).devices == ("4",)
    assert G.local_slots(asking | {"jobs_per_gpu": 3}, "locks", visible=["0"]).cap == 3
    # No GPU seen: one (or resources.gpus) counted GPU, so GPU jobs still take turns.
    counted = G.local_slots(asking, "locks", visible=[])
    assert counted.devices == ("0",) and counted.cap == 1 and not counted.visible
    assert G.local_slots(asking | {"gpus": 2}, "locks", visible=[]).devices == ("0", "1")
    assert G.GpuSlots.from_env(counted.to_env()) == counted
    with pytest.raises(ConfigError, match=r"resources.gpus: 3, but 2 GPU\(s\) are visible"):
        G.local_slots(asking | {"gpus": 3}, "locks", visible=["0", "1"])
    # --resources gpu=N: its total, spread over the devices; gpu=0: no limit, no claims.
    given = G.local_slots(asking, "locks", given=3, visible=["0", "1"])
    assert given.per_device == 2 and given.cap >= 3
    assert G.local_slots(asking, "locks", given=0, visible=["0"]) is None


def test_each_job_claims_its_own_device_until_the_slots_run_out(tmp_path):
    slots = G.GpuSlots(("3", "5"), 1, str(tmp_path / "locks"), {"train": 1})
    first, second = G.try_claim(slots, 1), G.try_claim(slots, 1)
    assert [d for d, _ in first] == ["3"] and [d for d, _ in second] == ["5"]
    assert G.try_claim(slots, 1) is None  # both held: a third job waits
    first[0][1].close()  # its process ended
    again = G.try_claim(slots, 1)
    assert [d for d, _ in again] == ["3"]
    for _, handle in second + again:
        handle.close()
    # Two jobs per GPU: they spread over the GPUs before a GPU takes a second one.
    shared = G.GpuSlots(("0", "1"), 2, str(tmp_path / "shared"), {"train": 1})
    held = [G.try_claim(shared, 1) for _ in range(4)]
    assert [h[0][0] for h in held] == ["0", "1", "0", "1"] and G.try_claim(shared, 1) is None
    for handle in itertools.chain.from_iterable(held):
        handle[1].close()


def test_a_killed_job_leaves_no_stale_claim(tmp_path):
    """The claim is the kernel's flock: SIGKILL releases it with the process."""
    slots = G.GpuSlots(("0",), 1, str(tmp_path / "locks"), {"evaluate": 1})
    env = {**os.environ, G.ENV: slots.to_env()}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    code = ("import os, time; from race.policy.gpus import claim_devices; "
            "print(claim_devices('evaluate'), os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().split() == ["['0']", "0"]
        assert G.try_claim(slots, 1) is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert [d for d, _ in G.try_claim(slots, 1)] == ["0"]


def test_a_job_without_a_gpu_or_a_sharing_workflow_changes_nothing(tmp_path):
    environ = {"CUDA_VISIBLE_DEVICES": "7"}
    assert G.claim_devices("train", environ) is None  # started by hand, or on SLURM
    slots = G.GpuSlots(("0",), 1, str(tmp_path / "locks"), {"train": 1})
    environ[G.ENV] = slots.to_env()
    assert G.claim_devices("pretrain", environ) is None  # its group asks for no GPU
    assert environ["CUDA_VISIBLE_DEVICES"] == "7" and not (tmp_path / "locks").exists()


def test_a_counted_gpu_leaves_cuda_visible_devices_alone(tmp_path, monkeypatch):
    """Where the workflow saw no GPU (CUDA_VISIBLE_DEVICES= hides them all, say), its jobs take
    turns on the counted GPU but see what they were started with."""
    monkeypatch.setattr(G, "_HELD", held := [])
    counted = G.GpuSlots(("0",), 1, str(tmp_path / "locks"), {"train": 1}, visible=False)
    environ = {G.ENV: counted.to_env(), "CUDA_VISIBLE_DEVICES": ""}
    assert G.claim_devices("train", environ) == ["0"]
    assert environ["CUDA_VISIBLE_DEVICES"] == ""
    assert G.try_claim(counted, 1) is None  # held by this "job" until its process ends
    for handle in held:
        handle.close()


# --------------------------------------------------------------------------- the workflow

#: The benchmark records (benchmarks/, relative) of the jobs that ask for a GPU in the study
#: below: training, the cell's evaluation and the base policy's evaluation.
CELL = "runs/size~nano/reward~rule/alloc~base/seed~0"
GPU_JOBS = (f"{CELL}.tsv", f"{CELL}.eval.tsv", "base/size~nano.eval.tsv")
#: Benchmark times come from a file's mtime, which the kernel stamps from a coarse clock (a
#: few ms behind): two jobs one after the other may seem to touch by that much.
CLOCK_SLACK_S = 0.05


def job_times(wd: Path) -> dict[str, tuple[float, float]]:
    """Each job's (start, end), from its Snakemake benchmark record: written as the job ends
    (its mtime), it holds the job's wall seconds (column s)."""
    out = {}
    for path in (wd / "benchmarks").rglob("*.tsv"):
        seconds = float(path.read_text().splitlines()[1].split("\t")[0])
        end = path.stat().st_mtime
        out[str(path.relative_to(wd / "benchmarks"))] = (end - seconds, end)
    return out


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


@pytest.mark.slow
def test_gpu_jobs_run_one_at_a_time_on_a_one_gpu_workstation(tmp_path):
    """A smoke-sized study (one size, one reward, one allocation, one rung) whose training and
    evaluation jobs ask for a GPU, on a pretend single GPU (resources.gpus: 1; they compute
    on the CPU): the three GPU jobs never overlap though two are ready at once, the data and
    tokenizer jobs (no GPU) still run side by side under --cores 2, and each GPU job runs on
    its claimed device. Then --resources gpu=2 on the command line lets two share it."""
    wd = workdir(tmp_path)
    config = yaml.safe_load((wd / "configs" / "smoke.yaml").read_text())
    config.update(sizes=["nano"], prm={"sizes": []}, rewards={"rule": {"type": "rule"}},
                  allocations={"base": config["allocations"]["base"]}, budgets=[4.0e9],
                  race={"enabled": False}, mlflow={"enabled": False}, device="cpu",
                  resources={"gpus": 1, "train": {"gpu": 1}, "evaluate": {"gpu": 1}})
    config["eval"] |= {"targets": ["in_pass1", "sampled_pass1"], "prm": None}
    config["pretrain"]["token_budget"] = 8000
    (wd / "study.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    run = snakemake(wd, "--cores", "2", "--configfile", "study.yaml", timeout=900)
    assert "RACE: jobs that ask for a GPU run 1 at a time" in run.stdout + run.stderr
    times = job_times(wd)
    assert set(GPU_JOBS) <= set(times), sorted(times)
    for a, b in itertools.combinations(GPU_JOBS, 2):
        assert overlap(times[a], times[b]) < CLOCK_SLACK_S, (a, b, times[a], times[b])
    assert overlap(times["data.tsv"], times["tokenizer.tsv"]) > CLOCK_SLACK_S, times
    logs = wd / "logs"
    for log in (f"{CELL}.log", f"{CELL}.eval.log", "base/size~nano.eval.log"):
        assert "holds GPU " in (logs / log).read_text(), log
    assert "holds GPU" not in (logs / "base" / "size~nano.log").read_text()
    assert (wd / SMOKE_RESULTS / ".gpus").is_dir()

    # The user's own total wins: the two evaluations, run again, share the one device.
    evals = [f"{SMOKE_RESULTS}/{CELL}/budget~4e9/eval.json",
             f"{SMOKE_RESULTS}/base/size~nano/eval.json"]
    rerun = snakemake(wd, *evals, "--cores", "2", "--configfile", "study.yaml",
                      "--resources", "gpu=2", "--forcerun", "evaluate", "evaluate_base",
                      timeout=600)
    assert "run 2 at a time, 2 per GPU" in rerun.stdout + rerun.stderr
    times = job_times(wd)
    assert overlap(times[GPU_JOBS[1]], times[GPU_JOBS[2]]) > CLOCK_SLACK_S, times
