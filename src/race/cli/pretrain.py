"""``race pretrain``: SFT a ladder size into a base policy (see race.policy.pretrain).

    race pretrain --job JSON
    race pretrain --config config.yaml --cell size~nano
"""

from __future__ import annotations

from race.cli.jobs import add_job_arguments, load_job, print_record

HELP = "SFT a ladder size into a base policy"


def add_arguments(p) -> None:
    add_job_arguments(p, "the ladder size as size~NAME (with --config)")


def run(args) -> int:
    from race.policy.pretrain import run_pretrain

    record = run_pretrain(load_job("pretrain", args))
    return print_record(record, ("size", "params", "tokens", "model_flops", "wall_s",
                                 "eval_in_accuracy"))
