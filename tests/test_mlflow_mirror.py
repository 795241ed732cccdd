"""``race mlflow-log``: one MLflow run per cell, nothing logged twice, live runs completed."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from faults import METRICS_CUTS

from race.core.cells import format_budget
from race.core.cpu_kernels import cpu_vendor
from race.study import config as S
from race.tracking.mirror import mirror_study

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0  # the training clock of the synthetic runs (epoch seconds)
STUDY_POINTS = 2  # the study run's summary without reports: study/cells, study/model_flops


@pytest.fixture()
def config(tmp_path):
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    raw["results_dir"] = str(tmp_path / "results")
    raw["sizes"], raw["allocations"] = ["nano"], {"base": raw["allocations"]["base"]}
    raw["rewards"] = {"rule": {"type": "rule"}}
    raw["race"]["baseline"] = "base"
    raw["mlflow"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    raw["mlflow"]["artifact_root"] = str(tmp_path / "artifacts")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return S.load_study(str(path))


def write_finished_run(config, cell, steps=3):
    """A run folder as training and evaluation leave it: metrics, rung evals, DONE."""
    run = config.run_dir(cell)
    run.mkdir(parents=True)
    rows = [{"step": s, "flops_total": 100 * s, "reward_mean": 0.1 * s, "time": T0 + s}
            for s in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for i, budget in enumerate(config.cell_rungs(cell), start=1):
        rung = run / f"budget~{format_budget(budget)}"
        rung.mkdir()
        payload = {"rung": {"step": i, "budget": budget, "train_model_flops": 100 * i},
                   "adapter": str(rung),
                   "targets": {"in_pass1": {"acc": 0.25 * i, "lo": 0.1, "hi": 0.5, "n": 400,
                                            "interval": "wilson"}}}
        (rung / "eval.json").write_text(json.dumps(payload))
        (rung / "ledger.json").write_text(json.dumps({"step": i, "model_flops": 100 * i}))
    (run / "train.json").write_text(json.dumps({"model_flops": 100 * steps, "steps": steps}))
    (run / "DONE").write_text("")
    return run


def history(config, run_dir, key):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config.mlflow.tracking_uri)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mirror_logs_each_run_once_and_a_rerun_logs_nothing(config):
    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell)
    first = mirror_study(config, [])
    assert first["runs"][cell.key]["steps_logged"] == 3
    # one point per rung: eval/in_pass1 (its interval is in a table artifact, not a metric)
    assert first["runs"][cell.key]["eval_values_logged"] == len(config.budgets)
    assert history(config, run, "flops/total") == [(1, 100), (2, 200), (3, 300)]
    evals = [(i, 0.25 * i) for i in range(1, len(config.budgets) + 1)]
    assert history(config, run, "eval/in_pass1") == evals

    again = mirror_study(config, [])
    assert again["runs"][cell.key] == dict(first["runs"][cell.key], steps_logged=0,
                                           eval_values_logged=0)
    assert again["study_run_id"] == first["study_run_id"]
    assert history(config, run, "eval/in_pass1") == evals


def test_mirror_completes_a_live_run_without_duplicates(config):
    from race.tracking.mlflow_runs import RunLogger

    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell)
    live = RunLogger(config.mlflow, run, cell.key, config.name, params={})
    live.log_step(1, {"flops_total": 100, "reward_mean": 0.1})  # the job logged step 1 live
    live.finish()
    summary = mirror_study(config, [])
    assert summary["runs"][cell.key]["run_id"] == live.run_id  # the same run, continued
    assert summary["runs"][cell.key]["steps_logged"] == 2
    assert history(config, run, "flops/total") == [(1, 100), (2, 200), (3, 300)]


def test_mirror_names_a_missing_evaluation(config):
    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell)
    missing = next(run.glob("budget~*")) / "eval.json"
    missing.unlink()
    with pytest.raises(FileNotFoundError, match="missing evaluation"):
        mirror_study(config, [])


@pytest.mark.parametrize("keep, reason", METRICS_CUTS.values(), ids=METRICS_CUTS)
def test_mirror_refuses_a_cut_metrics_file(config, keep, reason):
    """Mirrored as it is, a file cut at a line boundary would leave MLflow without its last
    steps, silently: the mirror checks it against train.json's step count and names it, before
    it opens the store."""
    from race.core.outputs import CorruptOutputError
    from race.tracking.mirror import mirror_run

    cell = config.grid_cells()[0]
    metrics = write_finished_run(config, cell) / "metrics.jsonl"
    metrics.write_text(keep(metrics.read_text()))
    with pytest.raises(CorruptOutputError, match=f"^{re.escape(f'{metrics}: {reason}')}.* "
                                                 r"rerun the workflow "
                                                 r"\(it sets the file aside as metrics.jsonl"
                                                 r".corrupt and the train job rebuilds it"):
        mirror_run(config, cell, config.mlflow)
    assert not Path(config.mlflow.tracking_uri.removeprefix("sqlite:///")).exists()


def points(config) -> list[tuple]:
    """Every (run, key, step) point of the active runs, with repeats."""
    import sqlite3

    db = sqlite3.connect(config.mlflow.tracking_uri.removeprefix("sqlite:///"))
    return db.execute("select m.run_uuid, m.key, m.step from metrics m join runs r on "
                      "r.run_uuid = m.run_uuid where r.lifecycle_stage = 'active'").fetchall()


def active_runs(config, cell) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config.mlflow.tracking_uri)
    exp = client.get_experiment_by_name(config.name)
    return client.search_runs([exp.experiment_id], f"tags.run_key = '{cell.key}'")


def test_a_crash_between_two_batches_loses_nothing_and_doubles_nothing(config, monkeypatch):
    from mlflow.tracking import MlflowClient

    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell, steps=700)  # 1,400 step points + evaluations
    real, calls = MlflowClient.log_batch, []

    def dies_after_one_chunk(self, run_id, metrics=(), **kw):
        if metrics:
            calls.append(len(metrics))
            if len(calls) >= 2:  # dead from the second chunk on (cleanup cannot log either)
                raise KeyboardInterrupt("killed between two log_batch chunks")
        return real(self, run_id, metrics=metrics, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", dies_after_one_chunk)
    with pytest.raises(KeyboardInterrupt):
        mirror_study(config, [])
    assert calls[0] == 1000 and len(points(config)) == 1000
    monkeypatch.setattr(MlflowClient, "log_batch", real)
    again = mirror_study(config, [])["runs"][cell.key]
    got = points(config)
    assert len(got) == len(set(got)) == 2 * 700 + len(config.budgets) + STUDY_POINTS
    assert again["steps_logged"] > 0
    assert history(config, run, "train/reward_mean")[-1] == (700, pytest.approx(70.0))


def start_mirror(config, tmp_path, out: str) -> subprocess.Popen:
    """``race mlflow-log`` in a process of its own (a fresh MLflow client and DB engine)."""
    path = tmp_path / "resolved.json"
    path.write_text(json.dumps(dict(config.config)))
    return subprocess.Popen([sys.executable, "-m", "race.cli", "mlflow-log", "--config",
                             str(path), "--out", str(tmp_path / out)])


def mirror_in_new_process(config, tmp_path) -> dict:
    assert start_mirror(config, tmp_path, "logged.json").wait(timeout=300) == 0
    return json.loads((tmp_path / "logged.json").read_text())


def test_two_mirrors_at_once_log_one_run_and_each_point_once(config, tmp_path):
    cells = config.grid_cells()
    for cell in cells:
        write_finished_run(config, cell, steps=200)
    procs = [start_mirror(config, tmp_path, f"logged{i}.json") for i in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    got = points(config)
    assert len(got) == len(set(got)) == len(cells) * (2 * 200 + len(config.budgets)) + (
        STUDY_POINTS)
    assert all(len(active_runs(config, c)) == 1 for c in cells)


def test_a_deleted_tracking_db_is_rebuilt_from_the_run_folders(config, tmp_path):
    from pathlib import Path as P

    from race.tracking.mirror import forget_lost_store

    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell)
    first = mirror_study(config, [])["runs"][cell.key]
    logged = config.results / "mlflow" / "logged.json"
    logged.parent.mkdir(parents=True, exist_ok=True)
    logged.write_text("{}")
    assert forget_lost_store(config) == [] and logged.exists()  # the store is there
    P(config.mlflow.tracking_uri.removeprefix("sqlite:///")).unlink()
    assert "left in place" in forget_lost_store(config, dry_run=True)[0] and logged.exists()
    assert "rebuilds it" in forget_lost_store(config)[0] and not logged.exists()
    again = mirror_in_new_process(config, tmp_path)["runs"][cell.key]  # stale id: no error
    assert again["run_id"] != first["run_id"]
    assert (run / "mlflow_run_id").read_text().strip() == again["run_id"]
    assert (again["steps_logged"], again["eval_values_logged"]) == (
        first["steps_logged"], first["eval_values_logged"])
    # (read with sqlite3: this process's MLflow client still holds the deleted file open)
    assert sorted((s, k) for r, k, s in points(config) if k == "flops/total") == [
        (1, "flops/total"), (2, "flops/total"), (3, "flops/total")]


def test_a_changed_evaluation_replaces_the_run(config):
    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell)
    first = mirror_study(config, [])["runs"][cell.key]
    rung = run / f"budget~{format_budget(config.budgets[0])}"
    payload = json.loads((rung / "eval.json").read_text())
    payload["targets"]["in_pass1"]["acc"] = 0.9  # re-evaluated after a config change
    (rung / "eval.json").write_text(json.dumps(payload))
    again = mirror_study(config, [])["runs"][cell.key]
    assert again["run_id"] != first["run_id"] and len(active_runs(config, cell)) == 1
    assert history(config, run, "eval/in_pass1")[:2] == [(1, 0.9), (2, 0.5)]
    assert history(config, run, "flops/total") == [(1, 100), (2, 200), (3, 300)]
    got = points(config)
    assert len(got) == len(set(got))


def test_the_runs_view_a_researcher_opens(config, tmp_path, monkeypatch):
    """Read back through the client: cell runs nested under the finished study run, the
    params a researcher filters on, grouped metric names at the training clock, the runs'
    real start and end, rung files and reports as artifacts."""
    from mlflow.tracking import MlflowClient

    from race.flops.analytic import resolve_arch
    from race.policy.ladder import ladder_config

    cell = config.grid_cells()[0]
    write_finished_run(config, cell)
    base = config.base_dir(cell.size)
    ladder_config("nano", 64).save_pretrained(base)
    reports = tmp_path / "reports"
    (reports / "figures").mkdir(parents=True)
    (reports / "report.md").write_text("# report\n")
    (reports / "regime.csv").write_text("size,budget,decided\nnano,4e9,True\nnano,8e9,False\n")
    (reports / "figures" / "frontier.png").write_bytes(b"png")
    summary = mirror_study(config, [], reports)

    client = MlflowClient(tracking_uri=config.mlflow.tracking_uri)
    exp = client.get_experiment_by_name(config.name)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the runs view
    # its description says how to plot against compute and where the intervals are
    assert "`flops/total`" in exp.tags["mlflow.note.content"]
    assert "eval_intervals.json" in exp.tags["mlflow.note.content"]
    study = client.get_run(summary["study_run_id"])
    assert study.info.status == "FINISHED"
    assert study.data.metrics["study/cells"] == 1 and study.data.metrics["study/model_flops"] == 300
    assert study.data.metrics["study/decided_cells"] == 1
    assert study.data.tags["git_commit"] and study.data.tags["version.torch"]
    assert study.data.tags["cpu_kernels.MKL_CBWR"] == os.environ.get("MKL_CBWR", "unset")
    assert study.data.tags["cpu_kernels.vendor"] == cpu_vendor()
    files = {a.path for a in client.list_artifacts(study.info.run_id)}
    assert {"config.json", "reports"} <= files
    assert {a.path for a in client.list_artifacts(study.info.run_id, "reports/figures")} == {
        "reports/figures/frontier.png"}

    cell_run = client.get_run(summary["runs"][cell.key]["run_id"])
    assert cell_run.data.tags["mlflow.parentRunId"] == study.info.run_id
    # a name the runs table shows whole; the cell's key stays the run_key tag
    assert (cell_run.info.run_name, cell_run.data.tags["run_key"]) == ("nano rule base s0",
                                                                       cell.key)
    params = cell_run.data.params
    arch = resolve_arch(base)
    assert (params["size"], params["reward"], params["alloc"]) == (cell.size, cell.reward,
                                                                   cell.alloc)
    assert params["policy_params"] == str(arch.params())
    assert params["alloc.lora_alpha"] == "8"  # rank 4, alpha unset: the effective 2 x rank
    assert params["task.n_train"] == str(config.task.n_train)
    assert "eval.sampled_k" in params and "pretrain.token_budget" in params
    points = client.get_metric_history(cell_run.info.run_id, "flops/total")
    assert [(m.step, m.timestamp) for m in points] == [(s, int((T0 + s) * 1000))
                                                       for s in (1, 2, 3)]
    assert "train/reward_mean" in cell_run.data.metrics
    # one chart per evaluation target; its interval is a row of the run's table artifact
    assert sorted(k for k in cell_run.data.metrics if k.startswith("eval/")) == ["eval/in_pass1"]
    # (load_table searches the runs through MLflow's default store, whatever the client's)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", config.mlflow.tracking_uri)
    table = client.load_table(exp.experiment_id, "eval_intervals.json",
                              run_ids=[cell_run.info.run_id])
    assert table.values.tolist() == [
        [budget, 100 * i, i, "in_pass1", 0.25 * i, 0.1, 0.5, 400, "wilson"]
        for i, budget in enumerate(config.budgets, start=1)]
    assert (cell_run.info.start_time, cell_run.info.end_time) == (int((T0 + 1) * 1000),
                                                                  int((T0 + 3) * 1000))
    rung = f"budget~{format_budget(config.budgets[0])}"
    assert {a.path for a in client.list_artifacts(cell_run.info.run_id, rung)} == {
        f"{rung}/eval.json", f"{rung}/ledger.json"}


def test_two_studies_sharing_a_db_and_experiment_keep_their_own_runs(config, tmp_path):
    raw = copy.deepcopy(dict(config.config))
    raw["mlflow"]["experiment"] = config.name
    config = S.typed_study(raw)
    # a copy of the config: another study, the same experiment
    other = S.typed_study({**raw, "study": "another-study",
                           "results_dir": str(tmp_path / "other")})
    cell = config.grid_cells()[0]
    for study in (config, other):
        write_finished_run(study, cell)
    first = mirror_study(config, [])["runs"][cell.key]["run_id"]
    second = mirror_study(other, [])["runs"][cell.key]["run_id"]
    assert mirror_study(config, [])["runs"][cell.key]["run_id"] == first != second
    assert {r.info.run_id for r in active_runs(config, cell)} == {first, second}


def test_two_loggers_replacing_one_run_leave_one_active_run(config):
    from race.tracking.mlflow_runs import RunLogger

    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell)
    mirror_study(config, [])
    rows = [{**json.loads(line), "reward_mean": 0.7}  # retrained: other values
            for line in (run / "metrics.jsonl").read_text().splitlines()]
    loggers = [RunLogger(config.mlflow, run, cell.key, config.name, {})
               for _ in range(2)]
    for logger in loggers:  # two mirrors at once, or a live job and a mirror
        for row in rows:
            logger.log_row(row)
    assert loggers[0].flush()["changed"]
    replaced = loggers[0].replace_run()
    # The second follows the replacement instead of finding the old run changed (and
    # replacing it a second time, which left two active runs).
    assert not loggers[1].flush()["changed"] and loggers[1].run_id == replaced
    assert [r.info.run_id for r in active_runs(config, cell)] == [replaced]


def test_a_changed_param_replaces_the_run(config):
    cell = config.grid_cells()[0]
    write_finished_run(config, cell)
    first = mirror_study(config, [])["runs"][cell.key]["run_id"]
    # a rung added on top: the run resumes, params change
    extended = S.typed_study({**config.config,
                              "budgets": [*config.budgets, 2 * config.budgets[-1]]})
    shutil.rmtree(config.run_dir(cell))
    write_finished_run(extended, cell)
    again = mirror_study(extended, [])["runs"][cell.key]["run_id"]
    assert again != first and [r.info.run_id for r in active_runs(config, cell)] == [again]
    from mlflow.tracking import MlflowClient

    params = MlflowClient(config.mlflow.tracking_uri).get_run(again).data.params
    assert params["rungs"] == str(list(extended.budgets))


def test_a_failed_live_job_leaves_only_its_checkpointed_points(config, tmp_path):
    from race.tracking.mlflow_runs import RunLogger

    spec = config.mlflow

    def row(step, seconds):
        return {"step": step, "flops_total": 100 * step, "rollout_s": seconds, "time": T0 + step}

    logger = RunLogger(spec, tmp_path / "run", "key", config.name, {})
    for step in (1, 2):
        logger.log_row(row(step, 1.0))
    logger.flush()  # the checkpoint at step 2
    for step in (3, 4):  # then an exception: resuming replays steps 3 and 4
        logger.log_row(row(step, 1.0))
    logger.finish("FAILED", flush=False)
    resumed = RunLogger(spec, tmp_path / "run", "key", config.name, {})
    for step in (3, 4):
        resumed.log_row(row(step, 1.7))
    assert not resumed.flush()["changed"]
    from mlflow.tracking import MlflowClient

    got = MlflowClient(config.mlflow.tracking_uri).get_metric_history(resumed.run_id,
                                                                            "perf/rollout_s")
    assert sorted((m.step, m.value) for m in got) == [(1, 1.0), (2, 1.0), (3, 1.7), (4, 1.7)]


def test_an_experiment_in_mlflows_trash_is_named(config):
    from mlflow.tracking import MlflowClient

    write_finished_run(config, config.grid_cells()[0])
    mirror_study(config, [])
    client = MlflowClient(config.mlflow.tracking_uri)
    client.delete_experiment(client.get_experiment_by_name(config.name).experiment_id)
    with pytest.raises(ValueError, match=f"mlflow.experiment '{config.name}' .* trash"):
        mirror_study(config, [])


# --------------------------------------------------------------------------- what the UI shows


@pytest.mark.parametrize("key, name", [
    ("size~mini/reward~rule/alloc~g8/seed~0", "mini rule g8 s0"),
    ("size~Qwen--Qwen2.5-0.5B/reward~rule+prm/alloc~search/seed~1",
     "Qwen2.5-0.5B rule+prm search s1"),  # a hub id by its name after the org
    ("size~results-rehearsal--hub--Qwen2.5-tiny/reward~rule/alloc~base/seed~0",
     "Qwen2.5-tiny rule base s0"),  # a local path by its last folder
    ("size~nano/reward~rule", "size~nano/reward~rule"),  # not a cell key: itself
    ("key", "key"),
])
def test_run_names_are_short(key, name):
    from race.tracking.mlflow_runs import run_name

    assert run_name(key) == name


def test_run_names_are_distinct_across_grid_and_validation_runs():
    from race.tracking.mlflow_runs import run_name

    study = S.load_study(str(ROOT / "configs" / "smoke.yaml"))
    selected = [{"size": c.size, "reward": c.reward, "alloc": c.alloc}
                for c in study.grid_cells()]  # every config validated: the most runs
    cells = study.grid_cells() + study.validation_cells(selected)
    assert len(study.validation_cells(selected)) > 0
    names = [run_name(c.key) for c in cells]
    assert len(set(names)) == len(cells)
    assert all(len(run_name(c.key)) < len(c.key) / 1.5 for c in cells)


def test_a_run_an_older_version_mirrored_is_renamed_and_loses_its_interval_metrics(
        config, monkeypatch):
    """Runs named by their key and holding ``eval/<target>_lo`` / ``_hi`` (before
    MIRROR_FORMAT 2): the next mirror renames the run and re-creates it from the files."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from race.tracking import mirror

    cell = config.grid_cells()[0]
    run = write_finished_run(config, cell)
    monkeypatch.setattr(mirror, "MIRROR_FORMAT", "race-mlflow/1")
    old = mirror_study(config, [])["runs"][cell.key]["run_id"]
    client = MlflowClient(tracking_uri=config.mlflow.tracking_uri)
    client.update_run(old, name=cell.key)
    client.log_batch(old, metrics=[Metric("eval/in_pass1_lo", 0.1, 0, 1)])
    monkeypatch.undo()

    new = mirror_study(config, [])["runs"][cell.key]["run_id"]
    assert new != old and [r.info.run_id for r in active_runs(config, cell)] == [new]
    held = client.get_run(new)
    assert held.info.run_name == "nano rule base s0"
    assert "eval/in_pass1_lo" not in held.data.metrics
    assert history(config, run, "eval/in_pass1") == [
        (i, 0.25 * i) for i in range(1, len(config.budgets) + 1)]
    got = points(config)
    assert len(got) == len(set(got))
    # renamed even where nothing else changed (the mirror skips an unchanged run)
    client.update_run(new, name=cell.key)
    assert mirror_study(config, [])["runs"][cell.key]["steps_logged"] == 0
    assert client.get_run(new).info.run_name == "nano rule base s0"


def test_make_ui_prints_the_runs_table_url(config, capsys):
    from mlflow.tracking import MlflowClient

    from race.cli import main

    write_finished_run(config, config.grid_cells()[0])
    mirror_study(config, [])
    path = Path(config.results) / "study.json"
    path.write_text(json.dumps(dict(config.config)))
    assert main(["mlflow-ui", "--config", str(path), "--print-url", "--port", "5077"]) == 0
    experiment = MlflowClient(config.mlflow.tracking_uri).get_experiment_by_name(config.name)
    # the model-training view's runs table, sorted by name (so listed flat, not folded under
    # the study's run)
    assert capsys.readouterr().out.strip() == (
        f"http://127.0.0.1:5077/#/experiments/{experiment.experiment_id}/runs"
        "?workflowType=machine_learning&orderByKey=tags.%60mlflow.runName%60&orderByAsc=true")


def test_the_ui_url_before_any_run_creates_no_store(config):
    from race.tracking import ui

    db = Path(config.mlflow.tracking_uri.removeprefix("sqlite:///"))
    assert ui.experiment_id(config.mlflow) is None and not db.exists()
    assert ui.runs_table_url(ui.ui_base(config.mlflow), None) == (
        "http://127.0.0.1:5000/#/experiments")


def test_the_ui_server_is_loopback_with_one_worker(config):
    """The flags are the pinned MLflow's own: its CLI parses them (without starting)."""
    import click
    from mlflow.cli import cli

    from race.tracking import ui

    argv, env = ui.ui_command(config.mlflow, 5077)
    assert argv[1:4] == ["-m", "mlflow", "ui"]
    flags = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert flags["--host"] == "127.0.0.1" and flags["--workers"] == "1"
    assert flags["--backend-store-uri"] == config.mlflow.tracking_uri
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    ctx = cli.get_command(click.Context(cli), "ui").make_context("ui", argv[4:])
    assert (ctx.params["host"], ctx.params["workers"], ctx.params["port"]) == (
        "127.0.0.1", "1", 5077)


def test_the_tracking_db_follows_the_umask(config, umask_002):
    """A store a group shares: the sqlite file MLflow creates (0644 whatever the umask) comes
    out 0664 under umask 002, as the weights do."""
    from race.tracking.mlflow_runs import ensure_experiment

    ensure_experiment(config.mlflow)
    db = Path(config.mlflow.tracking_uri.removeprefix("sqlite:///"))
    assert db.stat().st_mode & 0o777 == 0o664
