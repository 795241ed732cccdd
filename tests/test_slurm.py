"""The checks the workflow runs before submitting to SLURM (race.study.slurm), against
stand-in `scontrol` and `sinfo` commands. The real cluster path is tested end to end in
tests/test_workflow.py (the smoke study through profiles/slurm)."""

import pytest

from race.study import slurm
from race.study.slurm import ClusterError, check_gpu_partition, check_status_command

ACCOUNTING = {"AccountingStorageType": "accounting_storage/slurmdbd", "MinJobAge": "300 sec"}
NO_ACCOUNTING = {"AccountingStorageType": "accounting_storage/none", "MinJobAge": "300 sec"}


def test_the_config_reads_as_scontrol_prints_it():
    text = ("Configuration data as of 2026-12-07T05:37:00\n"
            "AccountingStorageType   = accounting_storage/none\nMinJobAge               = 1h\n")
    config = slurm.cluster_config(text)
    assert config["AccountingStorageType"] == "accounting_storage/none"
    assert slurm.seconds(config["MinJobAge"]) == 3600
    assert slurm.seconds("300 sec") == 300 and slurm.seconds(None) is None


def test_sacct_without_an_accounting_database_is_refused_not_left_to_hang():
    with pytest.raises(ClusterError, match="--slurm-status-command squeue"):
        check_status_command("sacct", 40, NO_ACCOUNTING)
    assert "sacct" in check_status_command("sacct", 40, ACCOUNTING)
    assert "squeue (MinJobAge 300 s)" in check_status_command("squeue", 40, NO_ACCOUNTING)


def test_squeue_that_would_fall_back_to_sacct_says_which_applies():
    # The plugin keeps squeue only while MinJobAge >= 3 x its first status wait.
    assert "from sacct" in check_status_command("squeue", 200, ACCOUNTING)
    with pytest.raises(ClusterError, match="at most 100 s"):
        check_status_command("squeue", 200, NO_ACCOUNTING)


@pytest.fixture
def sinfo(monkeypatch):
    """`sinfo --format %P|%G` as a cluster with a default CPU partition and a GPU one."""
    lines = "debug*|(null)\ngpu|gpu:2\ngpu|gpu:a100:4\n"
    monkeypatch.setattr(slurm, "_run", lambda *cmd: lines)


def test_a_gpu_job_on_a_partition_without_gpus_is_refused_before_submission(sinfo):
    resources = {"train": {"gpu": 1}, "evaluate": {"gpu": 1}, "base": {"gpu": 0}}
    with pytest.raises(ClusterError, match=r"resources.train.gpu: 1 asks for a GPU, but SLURM "
                                           r"partition 'debug' \(the cluster's default"):
        check_gpu_partition(resources, None)
    with pytest.raises(ClusterError, match=r"partition 'debug' \(slurm.partition\)"):
        check_gpu_partition(resources, "debug")
    assert check_gpu_partition(resources, "gpu") == "model jobs' GPUs from partition 'gpu'"
    with pytest.raises(ClusterError, match="no SLURM partition 'gpus' .*debug, gpu"):
        check_gpu_partition(resources, "gpus")
    # No job asks for a GPU: any partition will do, and sinfo is not asked.
    assert check_gpu_partition({"train": {"gpu": 0}}, "debug") is None


def test_slurm_commands_missing_say_where_to_run():
    with pytest.raises(ClusterError, match="not on PATH: run Snakemake on a node of the"):
        slurm._run("no-such-slurm-command-here")
