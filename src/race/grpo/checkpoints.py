"""Which checkpoint a metered run resumes from: the latest one that is complete (TRL's
trainer state and RACE's state both readable) and belongs to this job (its fingerprint,
race.grpo.run.job_fingerprint). A damaged or foreign checkpoint is skipped, not repaired."""

from __future__ import annotations

from pathlib import Path

from race.outputs import CorruptOutputError, read_output


def state_of(ckpt: Path) -> dict | None:
    """A checkpoint's RACE state, or None when it is incomplete or damaged."""
    if not (ckpt / "trainer_state.json").exists():
        return None
    try:
        read_output(ckpt / "trainer_state.json")
        return read_output(ckpt / "race_state.json")
    except (OSError, CorruptOutputError):
        return None


def latest_checkpoint(run_dir: Path, fingerprint: str) -> Path | None:
    """The latest complete, readable checkpoint of this job (its fingerprint)."""
    ckpts = sorted((run_dir / "checkpoints").glob("checkpoint-*"),
                   key=lambda p: int(p.name.split("-")[1]), reverse=True)
    for ckpt in ckpts:
        state = state_of(ckpt)
        if state is not None and state.get("fingerprint") == fingerprint:
            return ckpt
    return None
