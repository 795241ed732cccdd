"""``race prm``: train one PRM of the feedback ladder on step labels (see
race.feedback.prm_training). Prints one JSON line (size, AUC, accuracy, wall s).

    race prm --job JSON
    race prm --config config.yaml --cell size~micro
"""

from __future__ import annotations

from race.cli.jobs import add_job_arguments, load_job, print_record

HELP = "train a PRM on step labels over base-policy samples"


def add_arguments(p) -> None:
    add_job_arguments(p, "the PRM ladder size as size~NAME (with --config)")


def run(args) -> int:
    from race.feedback.prm_training import run_prm

    record = run_prm(load_job("prm", args))
    return print_record(record, ("size", "auc", "accuracy", "steps", "model_flops", "wall_s"))
