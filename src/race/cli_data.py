"""``race data`` (task splits as JSONL) and ``race tokenizer`` (the character tokenizer)."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("data", help="write the task splits (train / eval_in / eval_ood) as JSONL")
    p.add_argument("--out", required=True, help="output directory, e.g. results/data")
    p.add_argument("--config", help="study config; its task: section sets the task spec")
    p.set_defaults(func=_data)

    t = sub.add_parser("tokenizer", help="build and save the character-level tokenizer")
    t.add_argument("--out", required=True, help="output directory, e.g. results/tokenizer")
    t.set_defaults(func=_tokenizer)


def _data(args) -> int:
    from race.task import TaskSpec, write_splits

    spec = TaskSpec()
    if args.config:
        from race.study import load_config

        spec = TaskSpec(**load_config(args.config).get("task", {}))
    paths = write_splits(spec, args.out)
    print(json.dumps({k: str(v) for k, v in paths.items()}))
    return 0


def _tokenizer(args) -> int:
    from race.char_tokenizer import load_tokenizer, save_tokenizer

    out = save_tokenizer(args.out)
    print(f"saved a {len(load_tokenizer(out))}-token character tokenizer to {out}")
    return 0
