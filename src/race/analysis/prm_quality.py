"""How good the study's feedback models are: one row per PRM it trained, from its ``prm.json``.

The reward axis of the study ("a stronger reward model") is only as meaningful as the PRMs on
it, so the report shows what each one checks before any frontier is read. Conventions:

- Every number is the PRM's own held-out measurement (:func:`race.feedback.prm_training.train_prm`):
  its scores on the sampled completions of prompts it was not trained on, one score per step
  line, against the step checker's labels (a fraction in [0, 1]).
- ``auc``: the step AUC over every held-out step; ``auc_step_lines``: the same without the
  answer lines (an answer line is correct whenever it repeats the last stated result, an easy
  positive, so ``auc`` alone can hide a PRM that checks no arithmetic); ``accuracy``: at a 0.5
  threshold.
- ``auc_<family>`` / ``n_<family>``: the AUC of the correct steps against one error family's
  wrong steps (:data:`race.data.task.LINE_ERRORS`) and how many such steps there were; NaN for a
  family without steps. A PRM whose AUC on a family is near 0.5 does not see that error: as a
  reward it pays for it.
- ``used_by``: the reward systems scoring with that PRM, and ``eval`` when it reranks
  best-of-n in evaluation (``eval.prm``). A hub or path PRM has no ``prm.json`` and no row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from race.analysis.markdown import md_table, num
from race.data.task import LINE_ERRORS

FEEDBACK_COLUMNS = (
    ["prm", "used_by", "init", "params", "train_steps", "heldout_steps", "auc",
     "auc_step_lines", "accuracy"]
    + [f"auc_{f}" for f in LINE_ERRORS] + [f"n_{f}" for f in LINE_ERRORS]
)


def read_records(paths: Iterable[str | Path]) -> list[dict]:
    """The ``prm.json`` records at ``paths``, in the order given; ``ValueError`` naming the
    file when one is missing, not JSON, or not a PRM record (no ``size``)."""
    records = []
    for p in map(Path, paths):
        try:
            record = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"PRM record {p}: cannot be read ({exc})") from exc
        if not isinstance(record, dict) or "size" not in record:
            raise ValueError(f"PRM record {p}: not a prm.json (no 'size' key)")
        records.append(record)
    return records


def users(config: Mapping, prm: str) -> str:
    """The reward systems (and ``eval``) of ``config`` that score with PRM ``prm``, joined by
    ", " (a reward's own name may hold a "+")."""
    rewards = config.get("rewards") or {}
    names = sorted(name for name, r in rewards.items()
                   if isinstance(r, Mapping) and r.get("prm") == prm)
    evaluation = config.get("eval") if isinstance(config.get("eval"), Mapping) else {}
    if evaluation.get("prm") == prm:
        names.append("eval")
    return ", ".join(names)


def _value(x: object) -> float:
    return math.nan if x is None else float(x)


def feedback_table(records: Iterable[Mapping], config: Mapping | None = None) -> pd.DataFrame:
    """One row per PRM record (columns :data:`FEEDBACK_COLUMNS`), sorted by PRM name.

    ``init`` is "random" or the folder the backbone came from (its last two path parts, e.g.
    ``base/size~mini``: no absolute paths in a report)."""
    rows = []
    for r in records:
        held = r.get("heldout") or {}
        by_error = r.get("steps_by_error") or {}
        init = str(r.get("init", ""))
        row = {"prm": r["size"], "used_by": users(config or {}, r["size"]),
               "init": init if init in ("random", "") else "/".join(Path(init).parts[-2:]),
               "params": r.get("params"), "train_steps": (r.get("spec") or {}).get("steps"),
               "heldout_steps": r.get("steps"), "auc": _value(r.get("auc")),
               "auc_step_lines": _value((held.get("sampled_no_answer") or {}).get("auc")),
               "accuracy": _value(r.get("accuracy"))}
        for family in LINE_ERRORS:
            row[f"auc_{family}"] = _value((r.get("auc_by_error") or {}).get(family))
            row[f"n_{family}"] = by_error.get(family, 0)
        rows.append(row)
    table = pd.DataFrame(rows, columns=FEEDBACK_COLUMNS)
    return table.sort_values("prm", kind="mergesort").reset_index(drop=True)


def feedback_md(table: pd.DataFrame) -> str:
    """The table for report.md: AUCs per PRM, then per error family as "AUC (steps)" for the
    families any PRM saw."""
    if table.empty:
        return ("No record of a trained PRM: the study trained none (rule or hub rewards "
                "only), or `race report` was given none (`--prm`).")
    families = [f for f in LINE_ERRORS if table[f"n_{f}"].sum() > 0]
    header = ["PRM", "used by", "init", "held-out steps", "AUC", "step lines", "accuracy"]
    header += families
    rows = []
    for r in table.itertuples(index=False):
        row = [r.prm, r.used_by or "–", r.init or "–", num(r.heldout_steps, ".0f"),
               num(r.auc, ".3f"), num(r.auc_step_lines, ".3f"), num(r.accuracy, ".3f")]
        for f in families:
            auc, n = getattr(r, f"auc_{f}"), int(getattr(r, f"n_{f}"))
            row.append(f"{num(auc, '.2f')} ({n})")
        rows.append(row)
    return md_table(rows, header)
