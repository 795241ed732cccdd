"""RACE: where should a fixed RL post-training FLOP budget go? (see docs/design.md)."""
