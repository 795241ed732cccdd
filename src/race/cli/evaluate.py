"""``race evaluate``: every evaluation target of every snapshot of a cell, or of a base policy
(see race.evaluation.eval_job).

    race evaluate --job JSON
    race evaluate --config config.yaml --cell size~nano/reward~rule/alloc~g8/seed~0
    race evaluate --config config.yaml --cell size~nano/reward~rule/alloc~g8/seed~0 --budget 1.6e10
    race evaluate --config config.yaml --cell size~nano          (the base policy)
"""

from __future__ import annotations

import sys

from race.cli.jobs import add_job_arguments, load_job

HELP = "evaluate a cell's budget-rung snapshots (or a base policy)"


def add_arguments(p) -> None:
    add_job_arguments(p, "run key size~S/reward~R/alloc~A/seed~N, or size~S for a base policy "
                         "(with --config)", budget=True)


def run(args) -> int:
    from race.core.references import pinned
    from race.evaluation.eval_job import run_evaluation
    from race.study.inputs import InputError

    job = load_job("evaluate", args)
    try:
        with pinned(job.revisions):  # the hub revisions of its policy, reward model and PRM
            for out, payload in run_evaluation(job):
                _print_result(out, payload)
    except InputError as exc:  # an adapter it cannot load: the message names the folder
        print(f"race evaluate: {exc}", file=sys.stderr)
        return 2
    return 0


def _print_result(out: str, payload: dict) -> None:
    for target, r in payload["targets"].items():
        print(f"{target}: skipped ({r['skipped']})" if r["skipped"] else
              f"{target}: {r['acc']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}] n={r['n']} "
              f"eval FLOPs {r['flops']['model']:.3g}")
    print(f"wrote {out} ({payload['wall_s']:.1f} s)")
