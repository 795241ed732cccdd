"""``race prm``: train one PRM of the feedback ladder on step labels (:func:`race.prm.train_prm`).

    race prm --size micro --policies results/base/size~nano,results/base/size~micro \\
             --data results/data --out results/prm/size~micro [--config config.yaml]

The config's ``prm:`` section (minus ``sizes``) sets :class:`race.prm.PRMSpec`; without
``--config`` the spec's defaults apply. Prints one JSON line (size, AUC, accuracy, wall s).
"""

from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("prm", help="train a PRM on step labels over base-policy samples")
    p.add_argument("--size", required=True, help="PRM ladder size (nano, micro, mini)")
    p.add_argument("--policies", required=True,
                   help="comma-separated base policy directories (they sample the data)")
    p.add_argument("--data", required=True, help="task data directory (train.jsonl)")
    p.add_argument("--out", required=True, help="output directory, e.g. results/prm/size~micro")
    p.add_argument("--config", help="study config (a YAML file or the workflow's inline JSON); "
                                    "its prm: section sets the training spec")
    p.set_defaults(func=main)


def read_prm_section(source: str | None) -> dict:
    """The ``prm:`` section of a config (a YAML file, validated, or the workflow's JSON)."""
    from race.study import load_config

    return (load_config(source).get("prm") or {}) if source else {}


def main(args) -> int:
    from race.ladder import LADDER_DIALS
    from race.prm import PRMSpec, train_prm

    if args.size not in LADDER_DIALS:
        raise SystemExit(f"race prm: --size must be a ladder size ({', '.join(LADDER_DIALS)}), "
                         f"got {args.size!r}")
    spec = PRMSpec.from_config(read_prm_section(args.config))
    policies = [p for p in args.policies.split(",") if p]
    record = train_prm(args.size, policies, args.data, args.out, spec)
    print(json.dumps({k: record[k] for k in ("size", "auc", "accuracy", "steps", "model_flops",
                                              "wall_s")}))
    return 0
