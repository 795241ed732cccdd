"""Output files: atomic writes with the user's umask, validated reads that name the file and
the job that writes it, and damaged outputs set aside so that their job reruns."""

import os
import stat

import pytest

from race.core.atomic import make_temp_dir, write_json_atomic
from race.core.outputs import CorruptOutputError, read_output, set_aside_corrupt


@pytest.fixture()
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_files_and_folders_follow_the_umask(tmp_path, umask_027):
    path = write_json_atomic(tmp_path / "a" / "eval.json", {"x": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE(make_temp_dir(tmp_path, ".rung.").stat().st_mode) == 0o750
    assert read_output(path) == {"x": 1}


def test_a_damaged_output_names_its_file_and_job(tmp_path):
    ledger = tmp_path / "budget~1e9" / "ledger.json"
    ledger.parent.mkdir()
    ledger.write_text('{"steps": 3, "model_fl')
    with pytest.raises(CorruptOutputError, match=r"ledger.json is damaged .* train \(race "
                                                 r"train\) job"):
        read_output(ledger)
    ledger.write_text("[1, 2]")
    with pytest.raises(CorruptOutputError, match="holds a JSON list"):
        read_output(ledger)
    with pytest.raises(FileNotFoundError, match=r"eval.json \(written by the evaluate"):
        read_output(tmp_path / "eval.json")


def test_damaged_outputs_are_set_aside_and_checkpoints_left_alone(tmp_path):
    run = tmp_path / "runs" / "size~nano" / "seed~0"
    good = write_json_atomic(run / "budget~1e9" / "eval.json", {"targets": {}})
    bad = run / "budget~2e9" / "eval.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"targets": {"in_pass1": ')
    state = run / "checkpoints" / "checkpoint-4" / "race_state.json"
    state.parent.mkdir(parents=True)
    state.write_text("{")  # resuming skips it (race.grpo.resume.latest_checkpoint)
    notes = "metrics.jsonl"
    (run / notes).write_text("{")  # not a JSON output of a job
    dry = set_aside_corrupt(tmp_path, dry_run=True)
    assert len(dry) == 1 and "left in place" in dry[0] and bad.exists()  # a dry run moves nothing
    lines = set_aside_corrupt(tmp_path)
    assert len(lines) == 1 and "evaluate (race evaluate) job reruns" in lines[0]
    assert not bad.exists() and bad.with_name("eval.json.corrupt").exists()
    assert good.exists() and state.exists() and (run / notes).exists()
    assert set_aside_corrupt(tmp_path) == []


def test_a_damaged_run_level_file_takes_the_runs_done_with_it(tmp_path):
    # DONE is the run's requested output: without it gone, Snakemake would rerun nothing.
    run = tmp_path / "runs" / "size~nano" / "reward~rule" / "alloc~g8" / "seed~0"
    rung = run / "budget~4e9"
    rung.mkdir(parents=True)
    for path in (run / "train.json", run / "perf.json", rung / "ledger.json"):
        path.write_text("{not json")
    (run / "DONE").write_text("")
    lines = set_aside_corrupt(tmp_path)
    assert not (run / "DONE").exists() and (run / "train.json.corrupt").exists()
    assert any("perf.json" in line and "columns stay empty" in line for line in lines)
    assert any(str(rung / "ledger.json") in line and "train (race train) job reruns" in line
               for line in lines)
