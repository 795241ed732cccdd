"""The ``race`` command line: one subcommand per workflow stage.

Each subcommand lives in its own module, which exposes ``register(subparsers)``; this file only
wires them together, importing each module lazily so that ``race flops`` does not pay for TRL.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> module that implements it (each module has ``register`` and sets ``func``).
SUBCOMMANDS: dict[str, str] = {
    "models": "race.cli_models",
    "flops": "race.flops_cli",
    "data": "race.cli_data",
    "tokenizer": "race.cli_data",
    "pretrain": "race.pretrain",
    "prm": "race.prm_cli",
    "train": "race.train_cli",
    "evaluate": "race.evaluate_cli",
    "aggregate": "race.aggregate",
    "check-config": "race.study_cli",
    "mlflow-init": "race.study_cli",
    "mlflow-log": "race.mlflow_mirror",
    "select": "race.report_cli",
    "report": "race.report_cli",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="race", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    registered: set[str] = set()
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        if module_name in registered:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # stage not built yet
        module.register(sub)
        registered.add(module_name)
    return parser


#: Subcommands that never run torch: they skip its ~2.5 s import (they are short jobs).
NO_TORCH: frozenset[str] = frozenset({"flops", "data", "aggregate", "check-config",
                                      "mlflow-init", "mlflow-log", "select", "report"})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    if only not in NO_TORCH:
        import torch

        # One thread per process: on 2 cores the default made steps 5-30x slower (DESIGN.md).
        torch.set_num_threads(1)
    parser = build_parser(only)
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
