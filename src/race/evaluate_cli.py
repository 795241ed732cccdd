"""``race evaluate``: every evaluation target of one policy snapshot (see race.evaluate).

    race evaluate --policy BASE_DIR [--adapter RUNG_DIR] --data results/data
                  --out RUNG_DIR/eval.json [--config CONFIG] [--reward-json '{"type": "rule"}']
                  [--prm SPEC] [--mlflow-run-dir RUN_DIR] [--train-temperature T]
                  [--results-dir DIR]

``--config`` is a study config file or the inline JSON slice a workflow rule passes; only its
``eval:``, ``mlflow:``, ``study`` and ``results_dir`` keys are read.
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="evaluate a base policy or a budget-rung snapshot",
                       description=__doc__.splitlines()[0])
    p.add_argument("--policy", required=True, help="base policy directory (or hub id)")
    p.add_argument("--adapter", help="budget-rung folder with the LoRA adapter and ledger.json")
    p.add_argument("--data", required=True, help="folder with eval_in.jsonl and eval_ood.jsonl")
    p.add_argument("--out", required=True, help="eval.json to write (atomically)")
    p.add_argument("--config", help="study config: a YAML file or inline JSON (uses eval:, "
                                     "mlflow:, study, results_dir)")
    p.add_argument("--reward-json", help="the training reward for native_reward: a rewards: "
                                          "entry as JSON, e.g. '{\"type\": \"rule\"}'")
    p.add_argument("--prm", help="PRM for prm_bon: a PRM ladder name (results/prm/size~NAME), "
                                  "a path or a hub id (default: eval.prm)")
    p.add_argument("--mlflow-run-dir", help="run folder whose MLflow run (mlflow_run_id) gets "
                                             "eval/<target> at the rung's training step")
    p.add_argument("--train-temperature", type=float,
                   help="the cell's training temperature for native_reward "
                        "(default: eval.native_temperature)")
    p.add_argument("--results-dir", help="where PRM ladder names resolve (default: the "
                                          "config's results_dir, else results)")
    p.set_defaults(func=main)


def read_config(source: str | None) -> dict:
    """The study config (a YAML file, validated, or the workflow's inline JSON slice)."""
    from race.study import load_config

    return load_config(source) if source else {}


def main(args) -> int:
    from race.evaluate import EvalSpec, evaluate, with_overrides

    config = read_config(args.config)
    spec = with_overrides(EvalSpec.from_config(config.get("eval")),
                          native_temperature=args.train_temperature)
    reward = json.loads(args.reward_json) if args.reward_json else None
    if reward is not None and not isinstance(reward, dict):
        raise SystemExit("--reward-json: expected a JSON object such as '{\"type\": \"rule\"}'")
    results_dir = args.results_dir or config.get("results_dir") or "results"
    payload = evaluate(args.policy, args.data, args.out, spec, adapter=args.adapter,
                       reward=reward, prm=args.prm, results_dir=results_dir)
    for target, r in payload["targets"].items():
        line = (f"{target}: skipped ({r['skipped']})" if r["skipped"] else
                f"{target}: {r['acc']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}] n={r['n']} "
                f"eval FLOPs {r['flops']['model']:.3g}")
        print(line)
    print(f"wrote {args.out} ({payload['wall_s']:.1f} s)")
    if args.mlflow_run_dir:
        _mlflow(payload, args.mlflow_run_dir, config)
    return 0


def _mlflow(payload: dict, run_dir: str, config: dict) -> None:
    from race.evaluate import log_to_mlflow, mlflow_spec_from_config

    spec = mlflow_spec_from_config(config)
    if not spec.enabled:
        print("mlflow: disabled in the config; not logged", file=sys.stderr)
        return
    if not log_to_mlflow(payload, run_dir, spec, study=config.get("study") or "race"):
        print(f"mlflow: {run_dir} holds no mlflow_run_id; not logged", file=sys.stderr)
