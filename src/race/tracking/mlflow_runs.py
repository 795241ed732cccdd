"""MLflow as the window onto a run folder (the files under results/ are the source of truth).

One MLflow run per training cell, tagged ``run_key`` (the full cell key) and ``study``, and
named short enough to read in the runs table (:func:`run_name`: ``mini rule g8 s0``). Its id
is stored in the run folder (``mlflow_run_id``) so a resumed run continues the same MLflow run;
a run trained afresh into the folder replaces it (:meth:`RunLogger.replace_run`: the old points
belong to another trajectory). An id that the tracking store does not hold (the DB was deleted
or replaced) or holds as deleted is stale: the run is then found again by its ``run_key`` tag,
or created, never duplicated.

Exactly once per (run, key, step). Points are queued per key and sent by :meth:`RunLogger.flush`,
which, holding the run folder's lock (``.mlflow.lock``, an advisory ``flock``), sends only the
points whose (key, step) the store does not hold yet. So a process killed between two
``log_batch`` chunks leaves points missing, never doubled, and the next flush of any process
sends the rest; two processes logging the same run (a mirror started by hand during the
workflow's own mirror, a live run and the mirror) never send the same point twice. What the
store holds is asked once per key and run and cached; the lock file counts the flushes, so a
logger whose cache another process has made stale knows it and asks again.

A point already held with a *different* value is not sent: :meth:`RunLogger.flush` returns it
as changed, and the mirror then re-creates the run from the files (race.tracking.mirror).

A run is logged either live, by its training job, or after the fact by ``race mlflow-log``
(:mod:`race.tracking.mirror`), which mirrors the run folder; both go through :class:`RunLogger`.
Metrics go through ``log_batch`` (~10x faster than one call per point, docs/design.md), queued
and sent once per checkpoint, so logging stays off the training step's critical path.
"""

from __future__ import annotations

import fcntl
import json
import math
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from race.core.atomic import current_umask, write_json_atomic, write_text_atomic
from race.core.cells import parse_key
from race.core.specs import MlflowSpec

RUN_ID_FILE = "mlflow_run_id"
LOCK_FILE = ".mlflow.lock"
DB_LOCK_FILE = ".mlflow-db.lock"  # another file than LOCK_FILE: callers may hold that one
BATCH = 1000  # the most metrics one log_batch call takes
#: the tag that makes MLflow's UI open an experiment in its runs (model training) view; the UI
#: reads it only while its GenAI / model-training toggle is off (race.tracking.ui's URL picks
#: the view whatever the toggle says)
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
#: the experiment's description (MLflow's ``mlflow.note.content`` tag, shown above its runs)
NOTE_TAG = "mlflow.note.content"
EXPERIMENT_NOTE = """\
One run per training cell, nested under the study's run (`study:<study>`). A run is named
`<size> <reward> <alloc> s<seed>` (a hub model by its name after the org); its `run_key` tag holds
the full cell key, `size~S/reward~R/alloc~A/seed~N`.

**Model FLOPs as the x-axis.** `flops/total`, the training model FLOPs spent so far (rollout +
learning + reward), is logged at every step: in the Chart view, *Configure charts* (gear) >
*X-axis* > `flops/total` plots every metric against compute.

**Evaluations.** `eval/<target>` is logged at the training step of each evaluated rung; its 95%
interval is in the run's table artifact `eval_intervals.json` (a row per rung and target;
MLflow's `load_table` reads every run's at once).
"""
#: metrics.jsonl fields that are not metrics: the step is MLflow's step, the time its timestamp
ROW_KEYS = ("step", "time")
_GROUPS = {"flops_": "flops/", "exec_flops_": "exec_flops/"}
_TRAIN = ("reward_mean", "reward_std", "kl", "loss", "entropy", "completion_length")
_PROGRESS = ("updates", "rollouts", "prompts_seen")
_PERF = ("rollout_s", "learning_s", "reward_s")


def mlflow_key(name: str) -> str:
    """The MLflow metric name of a metrics.jsonl field, grouped by prefix so that MLflow's UI
    groups its charts: ``flops/<phase>`` (model FLOPs, cumulative), ``exec_flops/<phase>``,
    ``flops/p_learning``, ``train/<metric>``, ``progress/<counter>``, ``perf/<phase>_s`` (wall
    seconds of the step), ``perf/mfu/<phase>`` (the step's executed FLOP/s over the device's
    peak); evaluation keys (``eval/...``) are already grouped."""
    if name == "p_learning":
        return "flops/p_learning"
    if name.startswith("mfu_"):
        return "perf/mfu/" + name.removeprefix("mfu_")
    for prefix, group in _GROUPS.items():
        if name.startswith(prefix):
            return group + name.removeprefix(prefix)
    for names, group in ((_TRAIN, "train/"), (_PROGRESS, "progress/"), (_PERF, "perf/")):
        if name in names:
            return group + name
    return name


def run_name(run_key: str) -> str:
    """The display name of a cell's run: ``<size> <reward> <alloc> s<seed>``, e.g.
    ``mini rule g8 s0``; a hub size by its name after the org (``Qwen2.5-0.5B``), a local path
    by its last folder. Deterministic, from the key alone, so a live job, the mirror and an
    evaluation job name a run alike. The fields never hold a space (race.core.cells
    WILDCARDS), so the name is unambiguous for every study whose sizes differ in their last
    component; the ``run_key`` tag is the unique id. A key that is not a full cell key (a
    test's partial key) is its own name."""
    try:
        fields = parse_key(run_key)
    except ValueError:  # ConfigError: not key~value parts
        return run_key
    if set(fields) != {"size", "reward", "alloc", "seed"}:
        return run_key
    size = fields["size"].rsplit("--", 1)[-1]  # the slug of org/name or a path: its last part
    return f"{size} {fields['reward']} {fields['alloc']} s{fields['seed']}"


def _experiment_tags(exp) -> dict[str, str]:
    """The tags RACE sets on its experiment that ``exp`` (None: a new one) lacks: the runs view
    (always) and the description (only where none is set: a researcher's own is kept)."""
    held = exp.tags if exp is not None else {}
    out = {}
    if held.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
        out[EXPERIMENT_KIND[0]] = EXPERIMENT_KIND[1]
    if not held.get(NOTE_TAG):
        out[NOTE_TAG] = EXPERIMENT_NOTE
    return out


def ensure_experiment(spec: MlflowSpec) -> str:
    """Create (once) the tracking DB and the experiment; returns the experiment id. A sqlite
    DB is created under a lock in its folder: two processes creating one at once (live
    training jobs after the DB was lost) break its schema migration, for good."""
    db = spec.sqlite_db
    if db is None:
        return _ensure_experiment(spec)
    with locked(db.parent, DB_LOCK_FILE):
        created = not db.exists()
        experiment_id = _ensure_experiment(spec)
        if created:  # sqlite creates it 0644 whatever the umask; a group shares the store
            db.chmod(0o666 & ~current_umask())
        return experiment_id


def _ensure_experiment(spec: MlflowSpec) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.experiment)
    if exp is not None and exp.lifecycle_stage != "active":
        raise ValueError(f"mlflow.experiment {spec.experiment!r} (id {exp.experiment_id}) is in "
                         f"MLflow's trash at {spec.tracking_uri}: restore it (mlflow "
                         "experiments restore) or purge it (mlflow gc), or name another")
    if exp is not None:
        for key, value in _experiment_tags(exp).items():
            client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    artifact = spec.artifact_root
    if "://" not in artifact:
        artifact = Path(artifact).resolve().as_uri()
    return client.create_experiment(spec.experiment, artifact_location=artifact,
                                    tags=_experiment_tags(None))


def find_study_run(client, experiment_id: str, study: str) -> str | None:
    found = client.search_runs([experiment_id], f"tags.race_role = 'study' and "
                               f"tags.study = '{study}'", max_results=1)
    return found[0].info.run_id if found else None


def ensure_study_run(spec: MlflowSpec, study: str, lock_dir: str | Path) -> tuple[str, str]:
    """The experiment and the study's parent run (tagged ``race_role=study``), created once
    (under ``lock_dir``'s lock, so two processes never create two); returns
    ``(experiment_id, run_id)``."""
    from mlflow.tracking import MlflowClient

    with locked(lock_dir):
        experiment_id = ensure_experiment(spec)
        client = MlflowClient(tracking_uri=spec.tracking_uri)
        found = find_study_run(client, experiment_id, study)
        if found:
            return experiment_id, found
        run = client.create_run(experiment_id, run_name=f"study:{study}",
                                tags={"race_role": "study", "study": study})
        return experiment_id, run.info.run_id


def init_store(spec: MlflowSpec, study: str, out: str | Path) -> dict:
    """``race mlflow-init``: the DB, the experiment and the study run, once, and a marker file
    ``out`` with their ids (what live training jobs wait for)."""
    experiment_id, run_id = ensure_study_run(spec, study, Path(out).parent)
    ids = {"experiment_id": experiment_id, "study_run_id": run_id}
    write_json_atomic(out, ids, indent=None)
    return ids


def _param_text(value) -> str:
    """A param's value as the run holds it: its text, cut to MLflow's 6000-character limit."""
    return str(value)[:6000]


@contextmanager
def locked(folder: str | Path, name: str = LOCK_FILE) -> Iterator:
    """Hold ``folder/name`` (default ``.mlflow.lock``) exclusively (released by the OS if the
    process dies); yields the open lock file, whose text is the folder's flush count."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / name, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _flush_count(lock) -> int:
    lock.seek(0)
    text = lock.read().strip()
    return int(text) if text.isdigit() else 0


def _set_flush_count(lock, count: int) -> None:
    lock.seek(0)
    lock.truncate()
    lock.write(str(count))
    lock.flush()


def same_value(a: float, b: float) -> bool:
    """Equal as MLflow stores them: NaN is NaN, and infinities come back as +/- max float."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return math.copysign(1, a) == math.copysign(1, b) and abs(a) > 1e308 and abs(b) > 1e308
    return a == b


class RunLogger:
    """Logs one cell's params and metrics; exactly once per (key, step) across processes,
    reruns and resumes."""

    def __init__(self, spec: MlflowSpec, run_dir: str | Path, run_key: str, study: str,
                 params: dict, tags: dict | None = None, start_time: int | None = None):
        """``start_time``: when a run created now started (ms; default now): the mirror
        passes the training's first step time."""
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=spec.tracking_uri)
        self.run_dir = Path(run_dir)
        self.run_key, self.study = run_key, study
        self.params, self.tags = params, dict(tags or {})
        self.experiment_id = ensure_experiment(spec)
        self.parent_run_id = find_study_run(self.client, self.experiment_id, study)
        self._pending: dict[str, dict[int, tuple[float, int | None]]] = {}
        self.start_time = start_time
        self.params_changed: list[str] = []  # params the run holds with another value
        with locked(self.run_dir) as lock:
            self.run_id, self.created = self._resolve_run()
            self._start_cache(self.created, _flush_count(lock))

    # ------------------------------------------------------------------ which run
    def _active(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException:  # not in this store: the DB was deleted or replaced
            return False
        return (run.info.lifecycle_stage == "active"
                and run.info.experiment_id == self.experiment_id)

    def _find(self) -> str | None:
        runs = self.client.search_runs([self.experiment_id],
                                       f"tags.run_key = '{self.run_key}' and "
                                       f"tags.study = '{self.study}'", max_results=1)
        return runs[0].info.run_id if runs else None

    def _resolve_run(self) -> tuple[str, bool]:
        """The run's id (its id file's when the store still holds it, else found by its
        ``run_key`` tag, else a new run) and whether it was created now."""
        from mlflow.entities import RunTag

        id_file = self.run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else None
        if run_id is None or not self._active(run_id):
            run_id = self._find()
        created = run_id is None
        if created:
            run_id = self._create(self.start_time)
        else:
            self.client.set_terminated(run_id, status="RUNNING")
            run = self.client.get_run(run_id)
            tags = dict(self.tags)
            if self.parent_run_id is not None:
                tags["mlflow.parentRunId"] = self.parent_run_id
            if run.info.run_name != run_name(self.run_key):  # a run named by an older version
                tags["mlflow.runName"] = run_name(self.run_key)  # MLflow renames the run
            if tags:
                self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
            held = run.data.params
            self.params_changed = sorted(k for k, v in self.params.items()
                                         if k in held and held[k] != _param_text(v))
            self._log_params(run_id, held)
        if not id_file.exists() or id_file.read_text().strip() != run_id:
            write_text_atomic(id_file, run_id + "\n")  # parallel readers: atomic
        return run_id, created

    def _create(self, start_time: int | None = None) -> str:
        """A new run, nested under the study's run when there is one (``mlflow.parentRunId``,
        what MLflow's UI nests by), started at ``start_time`` (ms) when known."""

        tags = {"run_key": self.run_key, "study": self.study, **self.tags}
        if self.parent_run_id is not None:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run_id = self.client.create_run(self.experiment_id, run_name=run_name(self.run_key),
                                        start_time=start_time, tags=tags).info.run_id
        self._log_params(run_id, {})
        return run_id

    def _log_params(self, run_id: str, held: dict) -> None:
        """Log the params the run does not hold yet (MLflow never changes a logged param;
        ``log_batch`` takes at most 100 per call)."""
        from mlflow.entities import Param

        new = [Param(k, _param_text(v)) for k, v in sorted(self.params.items()) if k not in held]
        for i in range(0, len(new), 100):
            self.client.log_batch(run_id, params=new[i:i + 100])

    def replace_run(self) -> str:
        """Delete the run (MLflow keeps it in its trash) and start a fresh one with the same
        key, params and tags (queue its points again): how a changed value replaces the old
        one."""
        with locked(self.run_dir) as lock:
            if self._follow_id_file(lock):  # another process replaced it already
                return self.run_id
            start = self.client.get_run(self.run_id).info.start_time
            self.client.delete_run(self.run_id)
            self.run_id = self._create(start)
            write_text_atomic(self.run_dir / RUN_ID_FILE, self.run_id + "\n")
            count = _flush_count(lock) + 1
            _set_flush_count(lock, count)
            self._start_cache(True, count)
        return self.run_id

    def _follow_id_file(self, lock) -> bool:
        """Under the lock: adopt the run another process replaced this one with (its id is
        in the id file); returns whether it did."""
        id_file = self.run_dir / RUN_ID_FILE
        current = id_file.read_text().strip() if id_file.exists() else self.run_id
        if current == self.run_id:
            return False
        self.run_id = current
        self._start_cache(False, _flush_count(lock))
        return True

    # ------------------------------------------------------------------ what the store holds
    def _start_cache(self, empty: bool, flush_count: int) -> None:
        self._held: dict[str, dict[int, float]] = {}
        self._store_empty = empty  # a run created here holds nothing until something flushes
        self._seen_flushes = flush_count

    def _held_points(self, key: str) -> dict[int, float]:
        if key not in self._held:
            self._held[key] = {} if self._store_empty else {
                m.step: m.value for m in self.client.get_metric_history(self.run_id, key)}
        return self._held[key]

    # ------------------------------------------------------------------ logging
    def log_step(self, step: int, metrics: dict[str, float],
                 timestamp_ms: int | None = None) -> None:
        """Queue ``metrics`` (named as in the files; :func:`mlflow_key` groups them) at
        ``step``, stamped ``timestamp_ms`` (default: when sent). Nothing is sent before
        :meth:`flush` (training flushes at every checkpoint and at the end, so the tracking
        store stays off the training loop). Steps queued after the last checkpoint of a
        killed run are lost with it and queued again when the resumed run replays them."""
        for key, value in metrics.items():
            if value is not None:
                self._pending.setdefault(mlflow_key(key), {})[int(step)] = (float(value),
                                                                            timestamp_ms)

    def log_row(self, row: dict) -> None:
        """Queue a ``metrics.jsonl`` row at its step, stamped with its training-time clock."""
        stamp = int(row["time"] * 1000) if row.get("time") is not None else None
        self.log_step(row["step"], {k: v for k, v in row.items() if k not in ROW_KEYS}, stamp)

    def flush(self) -> dict:
        """Send the queued points the store does not hold; returns ``{"sent": points sent,
        "steps": {key: steps sent}, "changed": {key: steps held with another value}}``."""
        from mlflow.entities import Metric

        sent: dict[str, list[int]] = {}
        changed: dict[str, list[int]] = {}
        with locked(self.run_dir) as lock:
            count = _flush_count(lock)
            if count != self._seen_flushes:  # another process logged: ask the store again
                # ... and maybe replaced the run (following it starts the cache afresh)
                if not self._follow_id_file(lock):
                    self._start_cache(False, count)
            now = int(time.time() * 1000)
            batch = []
            for key, points in sorted(self._pending.items()):
                held = self._held_points(key)
                for step, (value, stamp) in sorted(points.items()):
                    if step not in held:
                        batch.append(Metric(key, value, stamp or now, step))
                        sent.setdefault(key, []).append(step)
                    elif not same_value(held[step], value):
                        changed.setdefault(key, []).append(step)
            if batch:
                # Counted before sending: if this process dies between two chunks, every other
                # logger's cache is stale and it asks the store again.
                self._seen_flushes = count + 1
                _set_flush_count(lock, self._seen_flushes)
            for i in range(0, len(batch), BATCH):
                self.client.log_batch(self.run_id, metrics=batch[i:i + BATCH])
                for m in batch[i:i + BATCH]:
                    self._held[m.key][m.step] = m.value
        self._pending = {}
        return {"sent": len(batch), "steps": sent, "changed": changed}

    def stale_keys(self) -> set[str]:
        """The metric keys the run holds that nothing queued now has: points of a name the
        files no longer produce (an older version's ``eval/<target>_lo``), which only a
        re-created run drops (MLflow deletes no metric)."""
        return set(self.client.get_run(self.run_id).data.metrics) - set(self._pending)

    def log_table(self, artifact_file: str, columns: list[str], rows: list[list]) -> None:
        """Attach a table as MLflow's own table artifact (``MlflowClient.log_table``'s JSON,
        pandas' ``split`` layout, listed in the ``mlflow.loggedArtifacts`` tag, so
        ``mlflow.load_table`` and the UI read it), replacing the previous one: ``log_table``
        itself appends to an existing file, which would repeat every row on each mirror."""
        from mlflow.entities import RunTag

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            path.write_text(json.dumps({"columns": columns, "data": rows}))
            folder = str(Path(artifact_file).parent)
            self.client.log_artifact(self.run_id, str(path),
                                     artifact_path=None if folder == "." else folder)
        tag = "mlflow.loggedArtifacts"
        held = json.loads(self.client.get_run(self.run_id).data.tags.get(tag, "[]"))
        entry = {"path": artifact_file, "type": "table"}
        if entry not in held:
            self.client.log_batch(self.run_id, tags=[RunTag(tag, json.dumps([*held, entry]))])

    def log_artifacts(self, files: dict[str, list[Path]]) -> None:
        """Attach ``files`` under each artifact folder name (a rung's ledger and evaluation:
        ``budget~B/``); logging the same file again replaces it."""
        for folder, paths in files.items():
            for path in paths:
                self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def finish(self, status: str = "FINISHED", end_time: int | None = None,
               flush: bool = True) -> dict:
        """Flush (unless ``flush`` is false: the queued points are dropped), then mark the run
        ``status``, ended at ``end_time`` (ms; default now)."""
        if not flush:
            self._pending = {}
        result = self.flush()
        self.client.set_terminated(self.run_id, status=status, end_time=end_time)
        return result
