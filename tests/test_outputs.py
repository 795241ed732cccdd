"""Output files: atomic writes with the user's umask, validated reads that name the file and
the job that writes it, damaged outputs set aside so that their job reruns, and weights saved
with the umask and an error that names a full disk."""

import errno
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from faults import METRICS_CUTS

from race.core import atomic
from race.core.atomic import NoSpaceError, make_temp_dir, saving_weights, write_json_atomic
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


def finished_run(root: Path, steps: int = 3) -> Path:
    """A finished run folder as far as its metrics go: train.json's step count, DONE, and a
    metrics.jsonl of one row per step."""
    run = root / "runs" / "size~nano" / "reward~rule" / "alloc~g8" / "seed~0"
    write_json_atomic(run / "train.json", {"steps": steps, "model_flops": 100 * steps})
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "flops_total": 100 * s})
                                               + "\n" for s in range(1, steps + 1)))
    (run / "DONE").write_text("")
    return run


@pytest.mark.parametrize("cut, reason", METRICS_CUTS.values(), ids=METRICS_CUTS)
def test_a_cut_metrics_file_of_a_finished_run_is_set_aside(tmp_path, cut, reason):
    """Checked against the run's own step count (train.json): a file cut at a line boundary
    parses but is short. Set aside with the run's DONE, so that the training job reruns and
    rewrites it from its checkpoint; a run still training is not judged."""
    run = finished_run(tmp_path)
    assert set_aside_corrupt(tmp_path) == []  # intact
    metrics = run / "metrics.jsonl"
    metrics.write_text(cut(metrics.read_text()))
    (run / "DONE").unlink()
    assert set_aside_corrupt(tmp_path) == []  # still training: appended to as it goes
    (run / "DONE").write_text("")
    assert reason in set_aside_corrupt(tmp_path, dry_run=True)[0] and metrics.exists()
    [line] = set_aside_corrupt(tmp_path)
    assert f"{metrics}: {reason}; set aside as metrics.jsonl.corrupt, the train (race " \
           "train) job reruns" == line.removeprefix("race: ")
    assert not metrics.exists() and not (run / "DONE").exists()


def test_saved_weights_follow_the_umask(tmp_path, umask_002):
    """safetensors writes its files 0600 whatever the umask; saving_weights gives them the
    mode of any other output."""
    import torch
    from safetensors.torch import save_file

    with saving_weights(tmp_path / "model", "a model") as folder:
        folder.mkdir()
        save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text("{}")
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((tmp_path / "model" / name).stat().st_mode) == 0o664


def write_then_fail(folder: Path, error: Exception):
    folder.mkdir(exist_ok=True)
    (folder / "optimizer.pt").write_bytes(b"partial")
    raise error


def test_a_full_disk_while_saving_weights_says_so(tmp_path, monkeypatch):
    """ENOSPC, or torch's short-write error on a full filesystem, becomes an error naming the
    folder; the partial folder is removed when asked; any other error passes unchanged."""
    ckpt = tmp_path / "checkpoint-8"
    with pytest.raises(NoSpaceError, match=f"^no space left on device while saving checkpoint "
                                           f"{ckpt}; its partial folder was removed"):
        with saving_weights(ckpt, f"checkpoint {ckpt}", discard_partial=True):
            write_then_fail(ckpt, OSError(errno.ENOSPC, "No space left on device"))
    assert not ckpt.exists()
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                               "134720 vs 134608")
    with pytest.raises(RuntimeError, match="unexpected pos") as plenty:  # space left: not full
        with saving_weights(ckpt, f"checkpoint {ckpt}", discard_partial=True):
            write_then_fail(ckpt, torch_error)
    assert not isinstance(plenty.value, NoSpaceError) and ckpt.exists()
    monkeypatch.setattr(atomic, "LOW_SPACE_BYTES", 1 << 62)  # the filesystem is full
    with pytest.raises(NoSpaceError, match=r"checkpoint-8; .*\(RuntimeError: .*unexpected pos"):
        with saving_weights(ckpt, f"checkpoint {ckpt}", discard_partial=True):
            write_then_fail(ckpt, torch_error)
    assert not ckpt.exists()


@pytest.fixture()
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mount -t tmpfs is not permitted here (a container without CAP_SYS_ADMIN)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_really_full_disk_is_named(small_tmpfs):
    """On a real full filesystem: torch's zip writer ("unexpected pos") and safetensors both
    end in the error naming the folder; the partial folder goes, the previous one stays."""
    import torch
    from safetensors.torch import save_file

    previous = small_tmpfs / "checkpoint-4"
    with saving_weights(previous, f"checkpoint {previous}", discard_partial=True):
        previous.mkdir()
        torch.save({"w": torch.zeros(8)}, previous / "optimizer.pt")
    big = {"w": torch.zeros(100_000)}  # 400 kB
    for save in (lambda f: torch.save(big, f / "optimizer.pt"),
                 lambda f: save_file(big, str(f / "adapter_model.safetensors"))):
        ckpt = small_tmpfs / "checkpoint-8"
        with pytest.raises(NoSpaceError, match=f"while saving checkpoint {ckpt}; its partial"):
            with saving_weights(ckpt, f"checkpoint {ckpt}", discard_partial=True):
                ckpt.mkdir()
                save(ckpt)
        assert not ckpt.exists()
    assert torch.load(previous / "optimizer.pt")["w"].shape == (8,)
