"""``race models``: the policy ladder as a table (name, shape, parameter counts)."""

from __future__ import annotations

from race.data.tokenizer import VOCAB_SIZE

HELP = "print the policy ladder (shapes and parameter counts)"


def add_arguments(p) -> None:
    p.add_argument("--vocab", type=int, default=VOCAB_SIZE,
                   help=f"vocabulary size (default: the character tokenizer's, {VOCAB_SIZE})")


def run(args) -> int:
    from race.policy.ladder import format_table, ladder_rows

    print(format_table(ladder_rows(args.vocab)))
    return 0
