"""``race prm``: train one process reward model of the PRM ladder (see race.prm)."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("prm", help="train a PRM on step labels over base-policy samples")
    p.add_argument("--size", required=True, help="PRM ladder size (nano, micro, mini)")
    p.add_argument("--policies", required=True, help="comma-separated base policy directories")
    p.add_argument("--data", required=True, help="directory with train.jsonl")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--config", help="study config (file or the workflow's JSON); uses prm:")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from race.prm import PRMSpec, train_prm

    spec = PRMSpec()
    if args.config:
        from race.study import load_config

        spec = PRMSpec.from_config(load_config(args.config).get("prm", {}))
    record = train_prm(args.size, args.policies.split(","), args.data, args.out, spec)
    print(json.dumps({k: record[k] for k in ("size", "step_auc", "step_accuracy", "wall_s")}))
    return 0
