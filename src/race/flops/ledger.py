"""The FLOP ledger: one row per (step, phase) of a run, model and executed FLOPs side by side.

Phases (docs/design.md): ``rollout``, ``learning`` and ``reward`` are charged to a cell's budget;
``eval`` and ``pre`` (pretraining, PRM training) are recorded but kept apart.

FLOPs are exact Python ints: a Qwen2.5-14B run passes 2**53 quickly, so they are written as
JSON integers (never floats) and read back as ints. Appending is safe on resume: replaying a
step that is already recorded with identical numbers is a no-op, a different row for the same
(step, phase) raises.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PHASES: tuple[str, ...] = ("rollout", "learning", "reward", "eval", "pre")
#: Phases a training budget is charged for.
BUDGET_PHASES: tuple[str, ...] = ("rollout", "learning", "reward")

_FORMAT = "race-ledger/1"


@dataclass(frozen=True)
class LedgerRow:
    """One phase of one step: FLOPs (int), tokens processed (int), wall seconds (float)."""

    step: int
    phase: str
    model_flops: int
    executed_flops: int
    tokens: int
    wall_s: float

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"unknown phase {self.phase!r}; known: {', '.join(PHASES)}")
        for name in ("step", "model_flops", "executed_flops", "tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                # A float FLOP count would silently lose exactness above 2**53.
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        wall = float(self.wall_s)
        if not math.isfinite(wall) or wall < 0:
            raise ValueError(f"wall_s must be a finite number >= 0, got {self.wall_s!r}")
        object.__setattr__(self, "wall_s", wall)


@dataclass(frozen=True)
class PhaseTotals:
    model_flops: int = 0
    executed_flops: int = 0
    tokens: int = 0
    wall_s: float = 0.0

    def __add__(self, row: LedgerRow | PhaseTotals) -> PhaseTotals:
        return PhaseTotals(self.model_flops + row.model_flops,
                           self.executed_flops + row.executed_flops,
                           self.tokens + row.tokens, self.wall_s + row.wall_s)


class Ledger:
    """Per-step, per-phase FLOP accounting of one run (see the module docstring)."""

    def __init__(self, rows: list[LedgerRow] | None = None) -> None:
        self._rows: dict[tuple[int, str], LedgerRow] = {}
        for row in rows or []:
            self._append(row)

    # ------------------------------------------------------------------ writing

    def add(self, step: int, phase: str, model_flops: int, executed_flops: int, tokens: int,
            wall_s: float) -> LedgerRow:
        """Record one (step, phase); idempotent for an identical replay (see :meth:`append`)."""
        return self._append(LedgerRow(step, phase, model_flops, executed_flops, tokens, wall_s))

    def append(self, row: LedgerRow) -> LedgerRow:
        """Record ``row``. Re-adding an identical row for a recorded (step, phase) -- a resumed
        run replaying its last step -- is a no-op; a different one raises ValueError."""
        return self._append(row)

    def _append(self, row: LedgerRow) -> LedgerRow:
        key = (row.step, row.phase)
        old = self._rows.get(key)
        if old is not None:
            if old != row:
                raise ValueError(
                    f"ledger already has step {row.step} phase {row.phase!r} with different "
                    f"numbers: recorded {asdict(old)}, new {asdict(row)}")
            return old
        self._rows[key] = row
        return row

    # ------------------------------------------------------------------ reading

    @property
    def rows(self) -> list[LedgerRow]:
        """All rows, ordered by step, then by the phase order of :data:`PHASES`."""
        return sorted(self._rows.values(), key=lambda r: (r.step, PHASES.index(r.phase)))

    def __len__(self) -> int:
        return len(self._rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ledger) and self._rows == other._rows

    @property
    def steps(self) -> list[int]:
        """Sorted distinct step numbers."""
        return sorted({step for step, _ in self._rows})

    def totals(self) -> dict[str, dict[str, Any]]:
        """``{phase: {model_flops, executed_flops, tokens, wall_s}}`` for every phase in
        :data:`PHASES` (zeros where absent), plus ``"budget"`` (rollout + learning + reward:
        what a cell's budget is charged) and ``"all"`` (every phase)."""
        per_phase = {phase: PhaseTotals() for phase in PHASES}
        for row in self._rows.values():
            per_phase[row.phase] = per_phase[row.phase] + row
        budget = sum((per_phase[p] for p in BUDGET_PHASES), PhaseTotals())
        overall = sum(per_phase.values(), PhaseTotals())
        out = {phase: asdict(t) for phase, t in per_phase.items()}
        out["budget"] = asdict(budget)
        out["all"] = asdict(overall)
        return out

    @property
    def model_total(self) -> int:
        """Model FLOPs charged to the budget: rollout + learning + reward (eval and pre are
        reported apart, never charged -- docs/design.md)."""
        return sum(r.model_flops for r in self._rows.values() if r.phase in BUDGET_PHASES)

    @property
    def executed_total(self) -> int:
        """Executed FLOPs of the budget phases."""
        return sum(r.executed_flops for r in self._rows.values() if r.phase in BUDGET_PHASES)

    def prefix(self, max_step: int) -> Ledger:
        """A new ledger of the rows with ``step <= max_step`` (the ledger at a budget rung)."""
        return Ledger([r for r in self.rows if r.step <= max_step])

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """The JSON payload as Python objects (FLOPs stay ints)."""
        return {"format": _FORMAT, "rows": [asdict(r) for r in self.rows]}

    def to_json(self) -> str:
        """JSON text; FLOPs stay JSON integers (exact at any size)."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        payload = json.loads(text)
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise ValueError(f"not a RACE ledger (expected format {_FORMAT!r})")
        return cls([LedgerRow(**row) for row in payload["rows"]])

    def save(self, path: str | Path, durable: bool = True) -> Path:
        """Write atomically (:func:`race.core.atomic.write_text_atomic`): a reader, or a crash,
        never sees a half-written ledger. ``durable=False`` skips the fsync."""
        from race.core.atomic import write_text_atomic

        return write_text_atomic(path, self.to_json(), durable=durable)

    @classmethod
    def load(cls, path: str | Path) -> Ledger:
        return cls.from_json(Path(path).read_text())
