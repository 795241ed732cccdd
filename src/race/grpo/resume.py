"""What a rerun of a metered run reuses, and the proof that it is this job's.

* Checkpoints (:func:`latest_checkpoint`): the latest complete one (TRL's trainer state and
  RACE's state both readable) whose fingerprint is this job's. A damaged or foreign checkpoint
  is skipped, not repaired.
* A finished run (:func:`reuse_finished`): its ``train.json``, run ledger, every rung's
  adapter and a ``metrics.jsonl`` with one row per step. The rung summaries Snakemake deleted
  before a rerun are rebuilt from the ledger (:func:`rebuild_rungs`), not retrained. Anything
  missing or damaged sends the run back to its checkpoint (which rewrites ``metrics.jsonl``)
  or to a fresh start.
* The fingerprint (:func:`job_fingerprint`): a digest of the job's trajectory-defining fields,
  the stamps of its local inputs and the references of its hub inputs (revision asked for,
  commit it resolved to: :func:`job_references`), carried by checkpoints and ``train.json``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from race.core.atomic import write_text_atomic
from race.core.cells import DONE, rung_dir
from race.core.jobs import RUN_OPTIONS, TrainJob, to_json
from race.core.outputs import METRICS, CorruptOutputError, metrics_problem, read_output
from race.core.references import hub_references
from race.flops.ledger import BUDGET_PHASES, Ledger
from race.flops.meter import FLOPS_CONVENTION

ADAPTER_FILE = "adapter_model.safetensors"
#: A rung's copy of its own summary, with the job's fingerprint (:func:`kept_rung_summaries`):
#: not a declared output, so it outlives Snakemake's deletion of the rung's ``ledger.json``.
RUNG_STATE = "rung_state.json"
#: TrainJob fields that do not change the trajectory: its run options (where it logs live, how
#: often it checkpoints), where it is written and how it is named; the rungs only decide where
#: to snapshot, and a change of rungs is handled apart; the device only where it computes, the
#: micro-batch only how the learning step's rows are cut and the rollout engine only how its
#: completions are generated: a run resumed with another of these goes on, its numbers
#: differing by rounding)
NOT_TRAJECTORY = (*RUN_OPTIONS["train"], "run_dir", "results_dir", "run_key", "study", "tags",
                  "rungs", "device", "micro_batch_rows", "rollout_engine")
#: Keys of the job's reward entry that do not change the trajectory either: where its feedback
#: model computes and how many completions one scoring forward takes (rounding at most).
REWARD_NOT_TRAJECTORY = ("device", "batch_size")


def rung_complete(run_dir: str | Path, budget: float) -> bool:
    """A rung snapshot is complete when its ledger and DONE marker are both there (Snakemake
    deletes a rerun job's declared outputs, the ledgers, before running it)."""
    folder = rung_dir(run_dir, budget)
    return (folder / DONE).exists() and (folder / "ledger.json").exists()


def discard_partial_snapshots(run_dir: str | Path) -> list[Path]:
    """Delete the rung snapshots a killed job left half-written: a snapshot is filled in a
    hidden ``.budget~B.*`` folder of the run and renamed into place only when complete
    (:meth:`race.grpo.run.MeteredRun.snapshot`), so such a folder at the start of a job is
    never one to reuse. Returns what was deleted."""
    stale = sorted(p for p in Path(run_dir).glob(".budget~*") if p.is_dir())
    for folder in stale:
        shutil.rmtree(folder)
    return stale


def _stamps(path: Path) -> list:
    """(name, size, mtime_ns) of a file, or of a model folder's config and weights (not of
    everything in it: the base policy's folder also receives its evaluation)."""
    if path.is_file():
        st = path.stat()
        return [[str(path), st.st_size, st.st_mtime_ns]]
    if path.is_dir():
        model = [path / "config.json", *sorted(path.glob("*.safetensors"))]
        return [s for p in model if p.is_file() for s in _stamps(p)]
    return []


def job_references(job: TrainJob) -> dict[str, dict]:
    """The hub-id inputs of the job (base policy, its reward's PRM or ORM), each with the
    revision it asks for and the commit that resolves to in the local hub cache
    (:func:`race.core.references.hub_references`): what ``train.json`` records under
    ``references``."""
    return hub_references([job.base, job.reward.model], job.revisions)


def job_fingerprint(job: TrainJob) -> str:
    """A digest of what decides the run's trajectory and its ledger: the job's fields (less
    :data:`NOT_TRAJECTORY`), the stamps of its local inputs (base policy, training data, the
    trained PRM of its reward), the references of its hub inputs (:func:`job_references`:
    a new commit of a hub model is another run) and the meter's :data:`FLOPS_CONVENTION`.
    Reused state must carry the same digest. A job with no hub input hashes what it did
    before references existed, byte for byte (its JSON has no empty ``revisions`` either)."""
    fields = {k: v for k, v in json.loads(to_json(job)).items() if k not in NOT_TRAJECTORY}
    fields.pop("revisions", None)  # in the references, with what they resolved to
    fields["reward"] = {k: v for k, v in fields["reward"].items()
                        if k not in REWARD_NOT_TRAJECTORY}
    inputs = [Path(job.base), Path(job.train_data)]
    prm = job.reward.model
    if prm is not None:
        ladder = Path(job.results_dir) / "prm" / f"size~{prm}"
        inputs.append(ladder if ladder.is_dir() else Path(str(prm)))
    stamps = [s for p in inputs for s in _stamps(p)]
    body = {"job": fields, "inputs": stamps, "flops": FLOPS_CONVENTION}
    references = job_references(job)
    if references:
        body["references"] = references
    payload = json.dumps(body, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def ledger_summary(ledger: Ledger, budget: float, counters: dict) -> dict:
    """The ``ledger.json`` of a rung: totals, per-phase split, learning share, what was bought."""
    totals = ledger.totals()
    total = ledger.model_total
    step_totals: dict[int, int] = {}
    for row in ledger.rows:
        if row.phase in BUDGET_PHASES:
            step_totals[row.step] = step_totals.get(row.step, 0) + row.model_flops
    return {
        "budget": budget,
        "steps": len(ledger.steps),
        "model_flops": total,
        "executed_flops": ledger.executed_total,
        "phases": {p: totals[p] for p in BUDGET_PHASES},
        "max_step_model_flops": max(step_totals.values(), default=0),
        "p_learning": totals["learning"]["model_flops"] / total if total else 0.0,
        **counters,
        "rows": ledger.to_dict()["rows"],
    }


def summary_json(summary: dict) -> str:
    """A rung's ``ledger.json`` text from its summary (:func:`ledger_summary`)."""
    return json.dumps(summary, indent=1, sort_keys=True)


def rung_summary_json(ledger: Ledger, budget: float, counters: dict) -> str:
    """A rung's ``ledger.json`` text: the summary of the ledger's prefix at the rung's step
    (``counters["step"]``), with the counters at that step."""
    return summary_json(ledger_summary(ledger.prefix(counters["step"]), budget, counters))


def kept_rung_summaries(run_dir: str | Path, fingerprint: str) -> dict[float, dict]:
    """The summaries this job's earlier processes wrote for its rungs (each rung's
    :data:`RUNG_STATE`), by budget; damaged, foreign or missing ones are left out. Read when a
    run starts, before a fresh start deletes the rung folders."""
    kept = {}
    for path in Path(run_dir).glob(f"budget~*/{RUNG_STATE}"):
        try:
            state = read_output(path)
        except (OSError, CorruptOutputError):
            continue
        summary = state.get("summary")
        if state.get("fingerprint") == fingerprint and isinstance(summary, dict):
            kept[summary.get("budget")] = summary
    return kept


def _without_wall(summary: dict) -> dict:
    """A rung summary less its wall seconds, the only numbers a replayed step changes."""
    return {**summary,
            "phases": {p: {k: v for k, v in t.items() if k != "wall_s"}
                       for p, t in summary["phases"].items()},
            "rows": [{k: v for k, v in r.items() if k != "wall_s"} for r in summary["rows"]]}


def same_but_wall(kept: dict, summary: dict) -> bool:
    """Whether a kept rung summary is ``summary`` replayed: equal but for wall seconds (a
    damaged one is not)."""
    try:
        return _without_wall(kept) == _without_wall(summary)
    except (KeyError, TypeError, AttributeError):
        return False


def rebuild_rungs(run_dir: Path, ledger: Ledger, rung_counters: dict[float, dict]) -> list[float]:
    """Rewrite the summary (``ledger.json``, ``DONE``) of every snapshotted rung that lost it
    but kept its adapter, identical to the one it replaces; returns the rungs rebuilt."""
    rebuilt = []
    for budget, counters in rung_counters.items():
        folder = rung_dir(run_dir, budget)
        if rung_complete(run_dir, budget) or not (folder / ADAPTER_FILE).exists():
            continue
        write_text_atomic(folder / "ledger.json", rung_summary_json(ledger, budget, counters))
        (folder / DONE).write_text("")
        rebuilt.append(budget)
    return rebuilt


def reuse_finished(job: TrainJob, run_dir: Path) -> dict | None:
    """The summary of this job's finished run, with every rung summary that was deleted
    rebuilt from the run's ledger; None when there is no such run to reuse (not finished,
    another job's, damaged -- its metrics.jsonl included --, or a rung's adapter is gone)."""
    try:
        summary = read_output(run_dir / "train.json")
        ledger = Ledger.load(run_dir / "ledger.json")
    except (OSError, ValueError, KeyError):
        return None
    state = summary.pop("state", None)
    if (state is None or state["fingerprint"] != job_fingerprint(job)
            or sorted(state["rungs_done"]) != sorted(job.rungs)):
        return None
    counters = {b: c for b, c in state["rung_counters"]}
    if any(not (rung_dir(run_dir, b) / ADAPTER_FILE).exists() for b in job.rungs):
        return None
    if metrics_problem(run_dir / METRICS, ledger.steps) is not None:
        # What the MLflow mirror reads, one row per step: a damaged or cut file is rewritten
        # by resuming from the checkpoint (MeteredRun.restore) and replaying the steps after.
        return None
    rebuild_rungs(run_dir, ledger, counters)
    (run_dir / DONE).write_text("")
    return summary


def state_of(ckpt: Path) -> dict | None:
    """A checkpoint's RACE state, or None when it is incomplete or damaged."""
    if not (ckpt / "trainer_state.json").exists():
        return None
    try:
        read_output(ckpt / "trainer_state.json")
        return read_output(ckpt / "race_state.json")
    except (OSError, CorruptOutputError):
        return None


def latest_checkpoint(run_dir: Path, fingerprint: str) -> Path | None:
    """The latest complete, readable checkpoint of this job (its fingerprint)."""
    ckpts = sorted((run_dir / "checkpoints").glob("checkpoint-*"),
                   key=lambda p: int(p.name.split("-")[1]), reverse=True)
    for ckpt in ckpts:
        state = state_of(ckpt)
        if state is not None and state.get("fingerprint") == fingerprint:
            return ckpt
    return None


def drop_older_checkpoints(keep: Path) -> list[Path]:
    """Delete the checkpoints older than ``keep``, a checkpoint now complete (RACE's state
    written); returns those deleted.

    This replaces TRL's ``save_total_limit`` rotation, which deletes the older checkpoints
    before the ``on_save`` callback writes ``race_state.json`` into the new one: a kill between
    the two left no complete checkpoint, and the rerun trained from step 1. Here the older
    one goes only once the newer one can be resumed from."""
    step = int(keep.name.split("-")[1])
    older = [c for c in keep.parent.glob("checkpoint-*") if int(c.name.split("-")[1]) < step]
    for ckpt in older:
        shutil.rmtree(ckpt, ignore_errors=True)  # a kill midway: skipped as damaged on resume
    return older
