"""The ``race`` command line: one module per verb, one table.

:data:`COMMANDS` maps each verb to the module that implements it and says whether the verb runs
torch; the entry point (:func:`main`) reads it, and nothing else lists the verbs. A verb module
parses arguments only and calls its stage:

    HELP                      one line for ``race --help``
    add_arguments(parser)     its flags
    run(args) -> int          the exit status

Model verbs (pretrain, prm-samples, prm, train, evaluate) take a typed job: ``--job JSON``
from the workflow, or ``--config FILE --cell KEY`` from a human, built by the same function
(:mod:`race.core.jobs`, built by :mod:`race.study.builders`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
from typing import NamedTuple


class Command(NamedTuple):
    module: str  # the verb's CLI module
    torch: bool  # the verb runs torch (else its ~2.5 s import is skipped)


COMMANDS: dict[str, Command] = {
    "models": Command("race.cli.models", True),
    "flops": Command("race.cli.flops", False),
    "plan": Command("race.cli.plan", False),
    "check-config": Command("race.cli.check_config", False),
    "data": Command("race.cli.data", False),
    "tokenizer": Command("race.cli.tokenizer", True),
    "stand-ins": Command("race.cli.stand_ins", True),
    "pretrain": Command("race.cli.pretrain", True),
    "prm-samples": Command("race.cli.prm_samples", True),
    "prm": Command("race.cli.prm", True),
    "train": Command("race.cli.train", True),
    "evaluate": Command("race.cli.evaluate", True),
    "aggregate": Command("race.cli.aggregate", False),
    "select": Command("race.cli.select", False),
    "report": Command("race.cli.report", False),
    "mlflow-init": Command("race.cli.mlflow_init", False),
    "mlflow-log": Command("race.cli.mlflow_log", False),
    "mlflow-ui": Command("race.cli.mlflow_ui", False),
}


def invocation(conda: bool, checkout: str) -> str:
    """The shell words a Snakemake job runs this CLI with.

    By default the scheduler's own interpreter (the project's venv, by absolute path: works
    without activating it, and on a cluster wherever the venv is on the shared filesystem).
    Under ``--sdm conda`` (``conda``) the job's own ``python``, in the envs/race.yaml
    environment, which holds the pinned stack but not this package: a conda env file cannot
    install a local path that Snakemake would find again, so it is imported from the
    ``checkout``'s ``src/``. The rules reach it through a ``race`` shell function in every
    job's shell prefix (workflow/rules/common.smk), not as a param, so which path or alias
    names the interpreter reruns no job.
    """
    if conda:
        return f"PYTHONPATH={shlex.quote(os.path.join(checkout, 'src'))} python -m race.cli"
    return f"{shlex.quote(sys.executable)} -m race.cli"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or of ``only`` (then only its module is imported)."""
    parser = argparse.ArgumentParser(prog="race", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb, command in COMMANDS.items():
        if only is not None and verb != only:
            continue
        module = importlib.import_module(command.module)
        doc = module.__doc__ or module.HELP
        p = sub.add_parser(verb, help=module.HELP, description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = argv[0] if argv and argv[0] in COMMANDS else None
    if verb is None or COMMANDS[verb].torch:
        import torch

        # One thread per process unless a job says otherwise: on 2 cores the default made
        # steps 5-30x slower (docs/design.md). Model verbs then apply their job's threads.
        torch.set_num_threads(1)
    args = build_parser(verb).parse_args(argv)
    from race.core.errors import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # a bad config, cell or job: the message names the key
        print(f"race {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an input file given on the command line that is not there
        if exc.filename is None:
            raise
        print(f"race {args.command}: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 2

