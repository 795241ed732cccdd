"""Seconds beside FLOPs: a device's peak (datasheet table or a measured matmul rate), per-step
utilisation in metrics.jsonl and MLflow, and the runs table's seconds, FLOP/s and MFU columns."""

import json

import pytest
import torch

from race.analysis.aggregate import perf_columns
from race.analysis.columns import PERF_COLUMNS
from race.core.cells import PERF
from race.flops import peak as P
from race.flops.peak import utilisation
from race.tracking.mlflow_runs import mlflow_key


@pytest.mark.parametrize("name, dtype, expected", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4e12),
    ("NVIDIA H100 PCIe", "bfloat16", 756.0e12),
    ("NVIDIA H100 NVL", "bfloat16", None),  # not the SXM part: measured
    ("NVIDIA H200", "float32", 494.7e12),
    ("NVIDIA A100-SXM4-80GB", "float32", 156.0e12),
    ("NVIDIA GeForce RTX 3090", "bfloat16", None),
])
def test_datasheet_peaks_by_device_name(name, dtype, expected):
    assert P.table_peak(name, dtype) == expected


def test_a_cpu_peak_is_measured_without_touching_the_global_rng():
    state = torch.get_rng_state()
    peak = P.device_peak("cpu", "float32")
    assert torch.equal(state, torch.get_rng_state())
    assert peak.source == "measured" and peak.name == "cpu" and peak.flops_per_s > 1e8


def test_utilisation_is_achieved_over_peak():
    assert utilisation(6_000, 2.0, 1_000.0) == 3.0
    assert utilisation(6_000, 0.0, 1_000.0) is None  # a phase the step did not run
    assert utilisation(6_000, 2.0, None) is None


def test_runs_table_perf_columns(tmp_path):
    phases = {"rollout": {"executed_flops": 8_000, "wall_s": 2.0},
              "learning": {"executed_flops": 3_000, "wall_s": 1.5},
              "reward": {"executed_flops": 0, "wall_s": 0.0}}
    without = perf_columns(phases, tmp_path)  # a run folder without perf.json (older runs)
    assert without["seconds_rollout"] == 2.0 and without["exec_flops_per_s_rollout"] == 4_000
    assert without["mfu_rollout"] is None and without["peak_flops"] is None
    (tmp_path / PERF).write_text(json.dumps({"flops_per_s": 10_000.0, "name": "cpu",
                                             "source": "measured", "dtype": "float32"}))
    row = perf_columns(phases, tmp_path)
    assert set(row) == set(PERF_COLUMNS)
    assert row["mfu_rollout"] == 0.4 and row["mfu_learning"] == 0.2
    assert row["exec_flops_per_s_reward"] is None and row["mfu_reward"] is None
    assert row["device"] == "cpu" and row["peak_flops"] == 10_000.0


def test_mlflow_names_utilisation_as_a_perf_metric():
    assert mlflow_key("mfu_rollout") == "perf/mfu/rollout"
    assert mlflow_key("rollout_s") == "perf/rollout_s"
