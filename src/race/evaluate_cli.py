"""``race evaluate``: every evaluation target of one policy snapshot (see race.evaluate)."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="evaluate a base policy or a budget-rung snapshot")
    p.add_argument("--policy", required=True, help="base policy directory (or hub id)")
    p.add_argument("--adapter", help="budget-rung folder holding the LoRA adapter")
    p.add_argument("--data", required=True, help="directory with eval_in.jsonl, eval_ood.jsonl")
    p.add_argument("--out", required=True, help="eval.json to write")
    p.add_argument("--config", help="study config (file or the workflow's JSON); uses eval:")
    p.add_argument("--reward-json", help="the training reward (a rewards: entry) as JSON")
    p.add_argument("--prm", help="PRM for best-of-n: a directory or hub id")
    p.add_argument("--mlflow-run-dir", help="run folder whose MLflow run gets the metrics")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from race.evaluate import EvalSpec, evaluate_snapshot
    from race.rewards import build_reward

    config = {}
    if args.config:
        from race.study import load_config

        config = load_config(args.config)
    spec = EvalSpec.from_config(config.get("eval", {}))
    reward = build_reward(json.loads(args.reward_json)) if args.reward_json else None
    prm = None
    if args.prm and "prm_bon" in spec.targets:
        from race.prm import load_prm

        prm = load_prm(args.prm)
    payload = evaluate_snapshot(args.policy, args.adapter, args.data, args.out, spec,
                                prm=prm, reward=reward)
    if args.mlflow_run_dir and config.get("mlflow", {}).get("enabled"):
        _log_mlflow(args, config, payload)
    print(json.dumps({t: r["acc"] for t, r in payload["targets"].items()}))
    return 0


def _log_mlflow(args, config: dict, payload: dict) -> None:
    """Log eval/<target> to the cell's MLflow run, at the rung's training step."""
    from race.study import mlflow_spec
    from race.tracking import RUN_ID_FILE, RunLogger

    run_dir = Path(args.mlflow_run_dir)
    if not (run_dir / RUN_ID_FILE).exists():
        return
    step = json.loads((Path(args.adapter) / "ledger.json").read_text())["step"] if (
        args.adapter) else 0
    logger = RunLogger(mlflow_spec(config), run_dir, "", config.get("study", "race"), params={})
    metrics = {}
    for target, r in payload["targets"].items():
        if r["acc"] is not None:
            metrics[f"eval/{target}"] = r["acc"]
            metrics[f"eval/{target}_lo"] = r["lo"]
            metrics[f"eval/{target}_hi"] = r["hi"]
            metrics[f"eval/{target}_flops"] = r["flops"]["model"]
    logger.log_step(step, metrics, force=True)
    logger.finish()
