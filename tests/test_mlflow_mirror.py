"""``race mlflow-log``: one MLflow run per cell, nothing logged twice, live runs completed."""

import json
from pathlib import Path

import pytest
import yaml

from race.study import cells as C
from race.study import config as S
from race.study import specs
from race.study.cells import format_budget
from race.tracking.mirror import mirror_study

ROOT = Path(__file__).resolve().parents[1]


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
    return S.load_config(str(path))


def write_finished_run(config, cell, steps=3):
    """A run folder as training and evaluation leave it: metrics, rung evals, DONE."""
    run = C.run_dir(config, cell)
    run.mkdir(parents=True)
    rows = [{"step": s, "flops_total": 100 * s, "reward_mean": 0.1 * s} for s in
            range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for i, budget in enumerate(C.cell_rungs(config, cell), start=1):
        rung = run / f"budget~{format_budget(budget)}"
        rung.mkdir()
        payload = {"rung": {"step": i}, "adapter": str(rung),
                   "targets": {"in_pass1": {"acc": 0.25 * i, "lo": 0.1, "hi": 0.5}}}
        (rung / "eval.json").write_text(json.dumps(payload))
    (run / "DONE").write_text("")
    return run


def history(config, run_dir, key):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config["mlflow"]["tracking_uri"])
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mirror_logs_each_run_once_and_a_rerun_logs_nothing(config):
    cell = C.grid_cells(config)[0]
    run = write_finished_run(config, cell)
    first = mirror_study(config, [])
    assert first["runs"][cell.key]["steps_logged"] == 3
    assert first["runs"][cell.key]["eval_values_logged"] == 3 * len(config["budgets"])
    assert history(config, run, "flops_total") == [(1, 100), (2, 200), (3, 300)]
    assert history(config, run, "eval/in_pass1") == [(1, 0.25), (2, 0.5)]

    again = mirror_study(config, [])
    assert again["runs"][cell.key] == dict(first["runs"][cell.key], steps_logged=0,
                                           eval_values_logged=0)
    assert again["study_run_id"] == first["study_run_id"]
    assert history(config, run, "eval/in_pass1") == [(1, 0.25), (2, 0.5)]


def test_mirror_completes_a_live_run_without_duplicates(config):
    from race.tracking.mlflow_runs import RunLogger

    cell = C.grid_cells(config)[0]
    run = write_finished_run(config, cell)
    live = RunLogger(specs.mlflow_spec(config), run, cell.key, config["study"], params={})
    live.log_step(1, {"flops_total": 100, "reward_mean": 0.1})  # the job logged step 1 live
    live.finish()
    summary = mirror_study(config, [])
    assert summary["runs"][cell.key]["run_id"] == live.run_id  # the same run, continued
    assert summary["runs"][cell.key]["steps_logged"] == 2
    assert history(config, run, "flops_total") == [(1, 100), (2, 200), (3, 300)]


def test_mirror_names_a_missing_evaluation(config):
    cell = C.grid_cells(config)[0]
    run = write_finished_run(config, cell)
    missing = next(run.glob("budget~*")) / "eval.json"
    missing.unlink()
    with pytest.raises(FileNotFoundError, match="missing evaluation"):
        mirror_study(config, [])
