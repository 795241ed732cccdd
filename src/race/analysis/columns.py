"""Columns of ``results/runs.csv`` (and ``reports/runs.csv``): one row per cell x budget rung.

This module is the contract between aggregation (which writes the table) and the reports
(which read it). FLOP columns are model FLOPs unless prefixed ``exec_`` (executed FLOPs: padding
and the attention kernel's full blocks included). All FLOPs are charged to the training budget
except ``eval_flops_<target>``, which is the evaluation ledger of that target alone.
"""

from __future__ import annotations

from race.core.specs import TARGETS
from race.flops.ledger import BUDGET_PHASES

#: Identity of a row. ``stage`` is "pilot", "validation" or "full" (the RACE protocol's grids);
#: ``cell`` is the content-derived run key ``size~S/reward~R/alloc~A/seed~N``.
ID_COLUMNS = ["study", "stage", "cell", "size", "reward", "alloc", "seed", "budget"]

#: Allocation knobs as the run used them.
KNOB_COLUMNS = [
    "num_generations",  # completions per prompt (search width)
    "prompts_per_step",
    "num_iterations",  # updates per generation batch
    "max_completion_length",
    "lora_rank",
    "learning_rate",
    "beta",
]

#: The phases charged to a budget are race.flops.ledger.BUDGET_PHASES and the evaluation
#: targets race.core.specs.TARGETS: each list is defined once, where it belongs.

#: What the run bought up to this rung.
LEDGER_COLUMNS = (
    ["steps", "updates", "rollouts", "prompts_seen"]
    + ["flops_total"] + [f"flops_{p}" for p in BUDGET_PHASES]
    + ["exec_flops_total"] + [f"exec_flops_{p}" for p in BUDGET_PHASES]
    + [f"tokens_{p}" for p in BUDGET_PHASES]
    + ["p_learning", "max_step_flops", "wall_s", "params", "non_embedding_params"]
)

#: Seconds beside FLOPs, per budget phase up to the rung: wall seconds, achieved executed
#: FLOP/s (what the kernels ran, over the phase's seconds) and utilisation (MFU: achieved over
#: ``peak_flops``, the device's peak of race.flops.peak in the run's ``perf.json``; empty for
#: a run without one). On CPU the seconds are CPU seconds of one process at its thread count.
PERF_COLUMNS = (
    [f"seconds_{p}" for p in BUDGET_PHASES]
    + [f"exec_flops_per_s_{p}" for p in BUDGET_PHASES]
    + [f"mfu_{p}" for p in BUDGET_PHASES]
    + ["device", "peak_flops"]
)

#: The columns that differ between two runs of the same study: wall-clock measurements (and a
#: peak measured on the machine). Every other column is a function of the config and seeds.
TIMING_COLUMNS = ["wall_s"] + [c for c in PERF_COLUMNS if c != "device"]

TARGET_LABELS = {
    "in_pass1": "eval-in greedy pass@1",
    "sampled_pass1": "eval-in sampled pass@1 (mean@k)",
    "ood_pass1": "eval-OOD pass@1",
    "maj_k": "maj@k",
    "prm_bon": "PRM best-of-n",
    "native_reward": "native reward",
}


def target_columns(target: str) -> list[str]:
    """Accuracy (fraction in [0, 1]), its 95% interval, sample count, and eval FLOPs."""
    return [f"acc_{target}", f"acc_{target}_lo", f"acc_{target}_hi", f"n_{target}",
            f"eval_flops_{target}"]


def all_columns(targets: list[str] | None = None) -> list[str]:
    cols = ID_COLUMNS + KNOB_COLUMNS + LEDGER_COLUMNS + PERF_COLUMNS
    for t in targets or TARGETS:
        cols += target_columns(t)
    return cols
