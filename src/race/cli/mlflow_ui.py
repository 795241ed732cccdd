"""``race mlflow-ui``: the MLflow UI over the study's tracking store, on 127.0.0.1 with one
worker, and the URL that opens it on the experiment's runs table (race.tracking.ui: MLflow 3
otherwise lands on its GenAI traces overview).

The URL goes to stdout, then ``mlflow ui`` takes this process's place (Ctrl-C stops it). A study
logged to a tracking server (an http(s) ``mlflow.tracking_uri``) is served there: the URL is
printed and nothing is started; so with ``--print-url``.
"""

from __future__ import annotations

import os
import sys

HELP = "serve the MLflow UI on 127.0.0.1; print the URL of the study's runs table"


def add_arguments(p) -> None:
    from race.tracking.ui import PORT

    p.add_argument("--config", default="config.yaml",
                   help="study config (its mlflow: section; default: the default study's)")
    p.add_argument("--port", type=int, default=PORT, help=f"local port (default {PORT})")
    p.add_argument("--print-url", action="store_true", help="print the URL only; start nothing")


def run(args) -> int:
    from race.study.config import load_study
    from race.tracking import ui

    spec = load_study(args.config).mlflow
    if not spec.enabled:
        raise SystemExit("race mlflow-ui: mlflow.enabled is false in the config")
    experiment = ui.experiment_id(spec)
    print(ui.runs_table_url(ui.ui_base(spec, args.port), experiment), flush=True)
    if experiment is None:
        print(f"race mlflow-ui: no experiment {spec.experiment!r} in {spec.tracking_uri} yet "
              "(the workflow's mlflow_log job creates it)", file=sys.stderr)
    if args.print_url or ui.is_server(spec):
        return 0
    argv, env = ui.ui_command(spec, args.port)
    os.execve(argv[0], argv, env)  # the server in this process's place: its signals, its exit
    return 0  # not reached
