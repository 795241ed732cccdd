"""Fault injection helpers shared by the training and workflow tests: where a run stands on
disk, and a training process that SIGKILLs itself at a fixed step (:func:`kill_switch`)."""

import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
from pathlib import Path


def checkpoint(run: Path) -> tuple[int, int]:
    """(step, rungs done) of the run's latest readable checkpoint; (0, 0) before the first one."""
    states = (run / "checkpoints").glob("checkpoint-*/race_state.json")
    for state in sorted(states, key=lambda s: -int(s.parent.name.split("-")[1])):
        try:
            payload = json.loads(state.read_text())
            return payload["step"], len(payload["rungs_done"])
        except (OSError, ValueError, KeyError):
            pass
    return 0, 0


def steps_done(run: Path) -> int:
    """Steps the run has finished (metrics.jsonl is appended once per step)."""
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def _die_past_a_checkpoint(run_class, run: Path, rungs: int, steps: int) -> None:
    """Wrap ``run_class.end_of_step``: in the run folder ``run``, the end of the first step
    ``steps`` past a checkpoint holding ``rungs`` rungs SIGKILLs the process."""
    end_of_step = run_class.end_of_step

    def end_of_step_or_die(self, step, model):
        end_of_step(self, step, model)
        if self.run_dir.resolve() == run:
            saved, done = checkpoint(run)
            if done >= rungs and saved and step >= saved + steps:
                os.kill(os.getpid(), signal.SIGKILL)

    run_class.end_of_step = end_of_step_or_die


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch`` on ``race.grpo.run.MeteredRun`` as soon as the module is imported."""

    def __init__(self, patch):
        self.patch = patch

    def find_spec(self, name, path, target=None):
        if name != "race.grpo.run":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            self.patch(module.MeteredRun)

        spec.loader.exec_module = exec_then_patch
        return spec


def arm_kill_switch() -> None:
    """Called by the ``sitecustomize`` of :func:`kill_switch` at every start-up."""
    run = Path(os.environ["RACE_KILL_RUN"]).resolve()
    rungs, steps = int(os.environ["RACE_KILL_RUNGS"]), int(os.environ["RACE_KILL_STEPS"])
    sys.meta_path.insert(0, _PatchOnImport(
        lambda cls: _die_past_a_checkpoint(cls, run, rungs, steps)))


def kill_switch(folder: Path, run: Path, rungs: int, steps: int) -> dict:
    """The environment under which the process training ``run`` kills itself (SIGKILL) at
    the end of the step ``steps`` past its first checkpoint holding ``rungs`` rungs: the kill
    lands at that step whatever the machine's speed, where a poller from outside would land
    wherever it noticed. Child processes inherit it (Snakemake's jobs do): a
    ``sitecustomize`` in ``folder`` arms the switch at each Python start-up."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text("import faults\nfaults.arm_kill_switch()\n")
    path = [str(folder), str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p),
            "RACE_KILL_RUN": str(run), "RACE_KILL_RUNGS": str(rungs),
            "RACE_KILL_STEPS": str(steps)}


#: Two ways to cut a finished 3-step run's metrics.jsonl, each with what the check says of it:
#: at a line boundary (the rows parse, one is missing) and mid-line (the last row is damaged).
METRICS_CUTS = {
    "line-boundary": (lambda text: text[:text.rindex("{")],
                      "cut short or damaged: 2 rows (last step 2) for the 3 steps the run "
                      "recorded"),
    "mid-line": (lambda text: text[:-8], "line 3 is damaged (not JSON)"),
}

