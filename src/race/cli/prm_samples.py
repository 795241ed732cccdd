"""``race prm-samples``: draw the base policies' samples that every PRM of the study learns
from, once (see race.feedback.prm_sampling). Prints one JSON line (prompts, completions,
model FLOPs, wall s).

    race prm-samples --job JSON
    race prm-samples --config config.yaml
"""

from __future__ import annotations

from race.cli.jobs import add_job_arguments, load_job, print_record

HELP = "sample the base policies once for the PRMs' step labels"


def add_arguments(p) -> None:
    add_job_arguments(p, "none: the samples are the study's")


def run(args) -> int:
    from race.feedback.prm_training import run_prm_samples

    record = run_prm_samples(load_job("prm-samples", args))
    return print_record(record, ("prompts", "completions", "model_flops", "wall_s"))
