# Grid expansion, paths and the per-job builders. All logic lives in the package; this file
# only names paths for the rules and hands each model job its typed JSON (race.core.jobs,
# built by race.study.builders from the typed study).
import json
import os
import re
import sys

from race.cli import invocation
from race.core import cells as C
from race.core import jobs as J
from race.core.outputs import read_output, set_aside_corrupt
from race.policy.gpus import ENV as GPU_ENV
from race.policy.gpus import local_slots
from race.study import builders as B
from race.study import config as S
from race.study.inputs import (
    check_devices_here,
    check_rung_snapshots,
    check_stored_models,
    check_tracking_db,
)
from race.study.locks import lock_note
from race.tracking.mirror import forget_lost_store

# The config typed once (race.core.study.Study), then the cross-field checks (unknown names,
# rungs below one step, ...), before any job is scheduled.
STUDY = S.check_study(S.typed_study(config))
R = str(STUDY.results)
# Where the tables, figures and report.md go: the default study's are committed under reports/,
# so another study (the smoke study) writes its own elsewhere.
REPORTS = STUDY.reports_dir
# Checks and repairs of the results folder, once, in the scheduling process (cluster jobs
# parse this file again and leave results alone).
if workflow.is_main_process:
    DRY = workflow.output_settings.dryrun
    UNLOCKING = "--unlock" in sys.argv  # runs no job: neither the note nor a rung stops it
    # A lock a killed run left: Snakemake's LockException follows once the DAG is built, and
    # Snakemake lets a workflow add nothing to it, so the note comes first.
    NOTE = None if UNLOCKING else lock_note([R, REPORTS], ".", workflow.configfiles)
    if NOTE:
        print(NOTE, file=sys.stderr)
    # One study per results directory (race.study.cells.claim_results_dir).
    STUDY.claim_results_dir(check_only=DRY)
    # A rung whose adapter evaluation cannot load (a pickle), refused before any job is
    # scheduled: found by its cell's evaluate job, it would cost that job's good outputs.
    if not UNLOCKING:
        check_rung_snapshots(STUDY)
        # Weights a job will read and the tracking DB, damaged (a truncated copy): named
        # with their repair here, not as a job's traceback.
        check_stored_models(STUDY)
        check_tracking_db(STUDY)
    # Model jobs compute where the local executor runs them: a device this machine lacks is
    # refused before Snakemake deletes the outputs of the jobs it reruns (a dry run, of a GPU
    # study on a laptop say, only says so). A cluster's nodes are not this machine.
    if not UNLOCKING and workflow.nodes is None:
        try:
            check_devices_here(STUDY)
        except ValueError as exc:
            if not DRY:
                raise
            print(f"race: a real run here stops at the start: {exc}", file=sys.stderr)
    # A damaged output looks up to date to Snakemake: set it aside so its job reruns. A dry
    # run only says what a real run would set aside.
    for line in set_aside_corrupt(R, DRY) + forget_lost_store(STUDY, DRY):
        print(line, file=sys.stderr)
# How a job calls the package's CLI: the scheduler's interpreter, or the conda env's python
# under --sdm conda (race.cli.invocation).
RACE = invocation(
    any(method.name == "CONDA" for method in workflow.deployment_settings.deployment_method),
    workflow.basedir,
)
# How a training job runs but not what it computes (race.core.jobs.RUN_OPTIONS: live MLflow
# logging, checkpoint cadence, the step limit), the same for every cell.
TRAIN_RUN_OPTIONS = B.run_options_json("train", STUDY)
# Neither is a param: Snakemake reruns a job whose params change, and neither where the
# interpreter lives (a venv moved or rebuilt elsewhere) nor these options change a result. Every
# job's shell starts with this prefix (after Snakemake's own strict mode): the rules call the
# CLI as `race <verb>`, a shell function over RACE, and a training job reads its run options
# from $RACE_TRAIN_RUN_OPTIONS.
shell.prefix(
    "set -euo pipefail; race() {{ {RACE} \"$@\"; }}; "
    "export RACE_TRAIN_RUN_OPTIONS={TRAIN_RUN_OPTIONS:q}; "
)
# GPU jobs on the local executor (race.policy.gpus). Snakemake limits a resource only where it
# is given a total, so the workflow gives gpu one -- the GPUs it may use (resources.gpus, else
# the visible ones) times resources.jobs_per_gpu -- unless --resources gpu=N (command line or
# profile) already does, and hands each GPU job its own device through the environment the
# local jobs inherit. Not where Snakemake counts nodes (workflow.nodes: the --jobs a cluster
# executor requires; the cluster places GPUs) nor in a cluster job (not the main process).
GPU_SLOTS = None
if workflow.is_main_process and workflow.nodes is None:
    GIVEN_GPUS = workflow.global_resources.get("gpu").value  # --resources gpu=N, else None
    GPU_SLOTS = local_slots(STUDY.resources, os.path.abspath(os.path.join(R, ".gpus")),
                            GIVEN_GPUS)
    if GPU_SLOTS is not None and GIVEN_GPUS is None:
        workflow.register_resource("gpu", GPU_SLOTS.cap)
    os.environ.pop(GPU_ENV, None)
    if GPU_SLOTS is not None:
        os.environ[GPU_ENV] = GPU_SLOTS.to_env()
# The content-derived path of one cell (docs/design.md): run folder, MLflow run name, run_key.
CELL = "size~{size}/reward~{reward}/alloc~{alloc}/seed~{seed}"
GRID = STUDY.grid_cells()
BUDGETS = [C.format_budget(b) for b in STUDY.budgets]
VALIDATION_BUDGET = C.format_budget(STUDY.validation_budget())
EXTRA_SEEDS = [s for s in STUDY.race.validation_seeds if s not in STUDY.seeds]
RACE_ON = STUDY.race.enabled
MLFLOW_ON = STUDY.mlflow.enabled
LADDER = [s for s in STUDY.sizes if C.is_ladder(s)]
PRMS = [p for p in STUDY.prm_sizes if C.is_ladder(p)]


wildcard_constraints:
    **C.WILDCARDS,


def larger_first(size):
    """Scheduling priority of a ladder size's model job: the largest size starts first, so the
    longest pretraining (and PRM training) is not the last one to begin."""
    return LADDER.index(size) if size in LADDER else 0


def in_results(path):
    """``path`` (relative, may hold wildcards) under the study's results directory."""
    return os.path.join(R, path)


def in_reports(path):
    """``path`` (relative) under the study's reports directory (``reports_dir``)."""
    return os.path.join(REPORTS, path)


def in_run(path):
    """``path`` (relative, may hold wildcards) inside a cell's run folder."""
    return os.path.join(R, "runs", CELL, path)


def res(rule_group, key):
    """``resources.<rule_group>.<key>`` of the config (the schema fills the defaults)."""
    return STUDY.resources[rule_group][key]


def slurm(key):
    """``slurm.<key>`` of the config, None when unset (Snakemake then passes no such
    resource, and the cluster's default applies)."""
    return (STUDY.slurm or {}).get(key)


def cell_of(w):
    return C.Cell(STUDY.unslug(w.size), w.reward, w.alloc, int(w.seed))


def base_input(w):
    """The base policy a cell trains from: pretrained here for ladder sizes."""
    size = STUDY.unslug(w.size)
    return [in_results(f"base/size~{size}/pre.json")] if C.is_ladder(size) else []


def reward_prm(reward):
    """The PRM the reward ``reward`` needs, when it is trained here."""
    prm = STUDY.rewards[reward].prm
    return [in_results(f"prm/size~{prm}/prm.json")] if prm in PRMS else []


def reward_inputs(w):
    return reward_prm(w.reward)


# Inputs that are the same for every job are plain values, not input functions: Snakemake
# inspects and calls a function once per job, which adds up on a 40,000-job grid
# (bench/performance/dag_scale.py). So is a cell's base policy when every size is a ladder size (a
# pattern) or none is, and its reward's PRM when no reward needs one trained here.
BASE_INPUT = (
    in_results("base/size~{size}/pre.json")
    if LADDER == list(STUDY.sizes)
    else base_input if LADDER else []
)
REWARD_INPUT = reward_inputs if any(reward_prm(r) for r in STUDY.rewards) else []
EVAL_PRM = STUDY.eval_prm
EVAL_PRM_INPUT = [in_results(f"prm/size~{EVAL_PRM}/prm.json")] if EVAL_PRM in PRMS else []
# What a base policy's evaluation waits for: the PRM of the reward its native_reward uses.
BASE_REWARD_INPUT = reward_prm(STUDY.base_reward)
# What a training job waits for: the MLflow DB, when it logs live. Waits for, not depends on
# (ancient): a DB initialised again (another tracking URI, a lost DB rebuilt) retrains nothing.
MLFLOW_INPUT = (
    [ancient(in_results("mlflow/initialized.json"))] if STUDY.mlflow_live else []
)


def rung_eval(cell, budget):
    return in_results(f"runs/{cell.key}/budget~{budget}/eval.json")


def grid_evals(w=None):
    return [rung_eval(c, b) for c in GRID for b in BUDGETS]


def pilot_evals(w=None):
    """The evaluations the RACE pilot ranks: the first seed's cells at the pilot rungs."""
    rungs = [C.format_budget(b) for b in STUDY.pilot_rungs()]
    return [rung_eval(c, b) for c in GRID if c.seed == STUDY.seeds[0] for b in rungs]


def base_evals(w=None):
    return [str(STUDY.base_eval(s)) for s in STUDY.sizes]


def validation_evals(w):
    """Evaluations of the validation runs chosen by the pilot checkpoint."""
    selected = read_output(checkpoints.select.get().output.selected)["selected"]
    return [rung_eval(c, VALIDATION_BUDGET) for c in STUDY.validation_cells(selected)]


def rung_ledger(cell, budget):
    return in_results(f"runs/{cell.key}/budget~{budget}/ledger.json")


def run_done(cell):
    """A run's DONE, named as a target: deleting it (or a damaged run-level file set aside
    with it, race.outputs.set_aside) reruns the cell's training job, which resumes."""
    return in_results(f"runs/{cell.key}/DONE")


def final_targets():
    """What `snakemake` builds: the reports, the runs table, the MLflow mirror, the whole
    feedback ladder, and every base policy, rung ledger, run's DONE and evaluation by name.
    Naming them matters: Snakemake does not rebuild a deleted intermediate file whose consumers
    are up to date, so a deleted (or damaged, hence set aside) rung ledger or evaluation is
    rebuilt, with the tables and reports after it, only because it is a requested target."""
    targets = [in_reports("report.md"), in_results("runs.csv")]
    targets += [in_results("mlflow/logged.json")] if MLFLOW_ON else []
    targets += [in_results(f"prm/size~{p}/prm.json") for p in PRMS]
    targets += [in_results(f"base/size~{s}/pre.json") for s in LADDER]
    targets += [rung_ledger(c, b) for c in GRID for b in BUDGETS] + [run_done(c) for c in GRID]
    return targets + grid_evals() + base_evals()


def validation_targets(w):
    """The validation runs' ledgers and evaluations (named for the same reason)."""
    selected = read_output(checkpoints.select.get().output.selected)["selected"]
    cells = STUDY.validation_cells(selected)
    return ([rung_ledger(c, VALIDATION_BUDGET) for c in cells] + [run_done(c) for c in cells]
            + validation_evals(w))
