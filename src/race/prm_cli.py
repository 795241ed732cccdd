"""``race prm``: train one PRM of the feedback ladder on step labels (:func:`race.prm.train_prm`).

    race prm --size micro --policies results/base/size~nano,results/base/size~micro \\
             --data results/data --out results/prm/size~micro [--config config.yaml]

The config's ``prm:`` section (minus ``sizes``) sets :class:`race.prm.PRMSpec`; without
``--config`` the spec's defaults apply. Prints one JSON line (size, AUC, accuracy, wall s).
"""

from __future__ import annotations

import json
from pathlib import Path


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
    """The ``prm:`` section of a config: through ``race.study.load_config`` (validated) when
    that module is importable, else plain ``json.loads`` / ``yaml.safe_load``."""
    if not source:
        return {}
    try:
        from race.study import load_config
    except ImportError:
        load_config = None
    if load_config is not None:
        config = load_config(source)
    elif str(source).lstrip().startswith("{"):
        config = json.loads(source)
    else:
        import yaml

        config = yaml.safe_load(Path(source).read_text()) or {}
    return config.get("prm") or {}


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
