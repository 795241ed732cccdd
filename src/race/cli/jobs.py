"""The arguments every model verb shares: the job as JSON, or a config file and a cell key."""

from __future__ import annotations

import argparse
import json
import os


def add_job_arguments(parser: argparse.ArgumentParser, cell_help: str,
                      budget: bool = False, run_options: bool = False) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--job", help="the job as JSON (what the workflow passes)")
    src.add_argument("--config", help="study config file (with --cell)")
    parser.add_argument("--cell", help=cell_help)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (the workflow passes the job's threads)")
    if budget:
        parser.add_argument("--budget", type=float,
                            help="only this budget rung (FLOPs, e.g. 2e10; default: every "
                                 "evaluated rung of the cell)")
    if run_options:
        parser.add_argument("--run-options",
                            help="the job's run options as JSON, over --job's or the config's "
                                 "(race.core.jobs.RUN_OPTIONS; the workflow passes them "
                                 "apart from --job)")


def load_job(verb: str, args: argparse.Namespace):
    """The typed job of ``race <verb>``: from ``--job``, or built from ``--config --cell``
    by the workflow's own builder, printed as one JSON line (the job log's first line). Sets
    torch's threads to ``--threads``."""
    from race.core import jobs
    from race.core.errors import ConfigError
    from race.study import builders

    if args.job:
        try:
            job = jobs.from_json(jobs.JOBS[verb], args.job)
        except (ValueError, TypeError) as exc:  # malformed JSON or a field of the wrong type
            raise ConfigError(f"--job: {exc}") from None
    else:
        if (verb in jobs.CELL_FREE) != (args.cell is None):  # before any study is read
            raise ConfigError(f"--cell: race {verb} takes " + (
                "none (the job is the study's)" if verb in jobs.CELL_FREE
                else "one (required with --config)"))
        from race.study.config import load_study

        # A ConfigError here names the bad key; race.cli.main prints it and exits 2.
        study = load_study(args.config)
        job = builders.job_for_cell(verb, study, args.cell, getattr(args, "budget", None))
    if getattr(args, "run_options", None):
        try:
            job = jobs.with_run_options(verb, job, args.run_options)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"--run-options: {exc}") from None
    # The whole job at the top of the job's log (the workflow sends stdout there): the console
    # shows the rule and the cell, not this JSON (profiles/default prints no shell commands).
    print(f"race {verb}: job {jobs.to_json(job)}", flush=True)
    # A job of a local workflow whose GPU jobs share the GPUs: its own device, claimed before
    # torch starts CUDA (race.policy.gpus); nothing for any other job.
    from race.policy.gpus import claim_devices

    if (devices := claim_devices(verb)) is not None:
        print(f"race {verb}: holds GPU {','.join(devices)} (CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')})", flush=True)
    import torch

    torch.set_num_threads(max(1, args.threads))
    return job


def print_record(record: dict, keys: tuple[str, ...]) -> int:
    """Print the named fields of a job's record as one JSON line (what the job log ends with)."""
    print(json.dumps({k: record[k] for k in keys}))
    return 0
