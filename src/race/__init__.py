"""RACE: where should a fixed RL post-training FLOP budget go? (see DESIGN.md)."""
