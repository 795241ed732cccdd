"""``race tokenizer``: build and save the character-level tokenizer."""

from __future__ import annotations

HELP = "build and save the character-level tokenizer"


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="output directory, e.g. results/tokenizer")


def run(args) -> int:
    from race.data.tokenizer import load_tokenizer, save_tokenizer

    out = save_tokenizer(args.out)
    print(f"saved a {len(load_tokenizer(out))}-token character tokenizer to {out}")
    return 0
