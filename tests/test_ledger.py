"""The FLOP ledger: totals, exact JSON round trip, resume-safe appends."""

from __future__ import annotations

import json

import pytest

from race.flops.ledger import PHASES, Ledger, LedgerRow

BIG = 3 * 2**60 + 7  # far beyond 2**53: a float would lose the trailing 7


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.add(0, "rollout", 100, 120, 10, 0.5)
    ledger.add(0, "learning", 300, 330, 20, 1.0)
    ledger.add(0, "reward", 0, 0, 10, 0.1)
    ledger.add(1, "rollout", BIG, BIG + 1, 10, 0.5)
    ledger.add(1, "eval", 50, 60, 5, 0.2)
    ledger.add(2, "pre", 7, 8, 1, 0.3)
    return ledger


def test_totals_per_phase_budget_and_overall():
    totals = _ledger().totals()
    assert set(totals) == set(PHASES) | {"budget", "all"}
    assert totals["rollout"] == {"model_flops": 100 + BIG, "executed_flops": 121 + BIG,
                                 "tokens": 20, "wall_s": 1.0}
    assert totals["learning"]["model_flops"] == 300
    assert totals["budget"]["model_flops"] == 400 + BIG  # eval and pre are kept apart
    assert totals["all"]["model_flops"] == 457 + BIG
    assert totals["all"]["tokens"] == 56
    assert totals["all"]["wall_s"] == pytest.approx(2.6)
    assert _ledger().model_total == 400 + BIG
    assert _ledger().executed_total == 451 + BIG


def test_steps_and_prefix():
    ledger = _ledger()
    assert ledger.steps == [0, 1, 2]
    first = ledger.prefix(0)
    assert first.steps == [0] and first.model_total == 400
    assert len(ledger.prefix(1)) == 5
    assert len(ledger) == 6  # the original is untouched


def test_json_round_trip_is_exact(tmp_path):
    ledger = _ledger()
    text = ledger.to_json()
    assert json.loads(text)["rows"][3]["model_flops"] == BIG  # a JSON integer, not a float
    assert Ledger.from_json(text) == ledger
    path = ledger.save(tmp_path / "sub" / "ledger.json")
    loaded = Ledger.load(path)
    assert loaded == ledger
    assert loaded.totals() == ledger.totals()
    assert [p.name for p in path.parent.iterdir()] == ["ledger.json"]  # no temp file left


def test_replayed_step_is_a_noop_and_conflict_raises():
    ledger = _ledger()
    ledger.add(1, "rollout", BIG, BIG + 1, 10, 0.5)  # a resumed run replays step 1
    assert len(ledger) == 6 and ledger.model_total == 400 + BIG
    with pytest.raises(ValueError, match=r"step 1 phase 'rollout'"):
        ledger.add(1, "rollout", BIG, BIG + 2, 10, 0.5)
    reloaded = Ledger.from_json(ledger.to_json())
    reloaded.append(LedgerRow(0, "learning", 300, 330, 20, 1.0))
    assert reloaded == ledger


def test_rows_are_validated():
    ledger = Ledger()
    with pytest.raises(ValueError, match="phase"):
        ledger.add(0, "search", 1, 1, 1, 0.0)
    with pytest.raises(TypeError, match="model_flops"):
        ledger.add(0, "rollout", 1.5e20, 1, 1, 0.0)
    with pytest.raises(ValueError, match="wall_s"):
        ledger.add(0, "rollout", 1, 1, 1, -1.0)
    with pytest.raises(ValueError, match="format"):
        Ledger.from_json("{}")
