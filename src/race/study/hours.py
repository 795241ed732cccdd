"""A study's device-hours per phase and per stage (``race check-config``), each phase at its own
sustained rate, and the rates file that carries measured rates.

Hours = model FLOPs / a rate in model FLOP/s / 3600. One rate per phase: ``rollout`` (for the
config's ``training.rollout_engine``), ``learning``, ``reward`` and ``eval`` (evaluation, never
charged to a budget). A phase's rate comes from the first of these that has one:

1. its own flag (``--rollout-flops-per-second``, ``--learning-...``, ``--reward-...``,
   ``--eval-...``);
2. ``--flops-per-second``: one rate for every phase;
3. a rates file (``--rates FILE``: :func:`read_rates`, written by :func:`write_rates`);
4. the study's own finished work on its device: each phase's model FLOPs over its wall seconds
   in the runs' ``train.json`` (phases that cost 0 FLOPs, a rule reward, left out), and
   ``executed_total.model`` over ``wall_s`` of the rung evaluations' ``eval.json`` (model
   loading included; base policies' evaluations name no device and are left out);

else none, and that phase's hours are "no rate", never another phase's rate.

FLOPs (model FLOPs, race.flops.analytic):

* training: each run charged its budget (race.study.plan.study_plan), split among rollout,
  learning and reward as its cell's worst-case generation cycle splits
  (race.study.plan.cell_step_cost: every row at the longest prompt, every completion at the
  cap; a cycle is one generation step and ``num_iterations - 1`` reuse steps). Validation runs
  are selected after the pilot: per reward and phase, the ``per_reward`` largest shares among
  that reward's configs (an upper bound on each phase);
* evaluation (:func:`snapshot_eval_flops`): worst case, every prompt at the longest training
  prompt (OOD: the longest OOD chain; a hub task: ``task.max_prompt_tokens``) and every
  completion at ``max_new_tokens``; the model FLOPs of what an evaluation job runs (its
  ``executed_total.model``: a shared sample pool once), LoRA charged only when
  ``eval.merge_adapter`` is off; every grid cell at every rung (the search targets only at the
  top rung under ``search_at: base_and_top``), every base policy, and the validation snapshots
  (at most ``per_reward`` per reward and validation seed, each the reward's costliest size).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from race.core.cells import PERF, is_ladder
from race.core.engines import ROLLOUT_ENGINES
from race.core.specs import SEARCH_TARGETS
from race.core.study import Study
from race.flops import analytic as F

TRAIN_PHASES = ("rollout", "learning", "reward")
PHASES = (*TRAIN_PHASES, "eval")
LABEL = {"rollout": "rollout", "learning": "learning", "reward": "reward", "eval": "evaluation"}
FLAG = {p: f"--{p}-flops-per-second" for p in PHASES}
RATES_FORMAT = "race-rates/1"


# --------------------------------------------------------------------------- the rates file
#
# {"format": "race-rates/1", "unit": "model FLOP/s",
#  "device": "NVIDIA H200", "measured": "where and how the rates were measured",
#  "phases": {"rollout": {"peft": 1.0e10, "merged": 2.0e11}, "learning": 5.0e12,
#             "reward": 4.0e12, "eval": 3.0e11}}
#
# Every phase optional; rollout by engine (:data:`ROLLOUT_ENGINES`).


def _positive(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{where}: expected a positive number of model FLOP/s, got {value!r}")
    return float(value)


def _check_phases(phases, where: str) -> dict:
    if not isinstance(phases, dict):
        raise ValueError(f"{where}: 'phases' must be a mapping")
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise ValueError(f"{where}: unknown phase(s) {sorted(unknown)}; known: {list(PHASES)}")
    out = {}
    for phase, value in phases.items():
        if value is None:
            continue
        if phase == "rollout":
            if not isinstance(value, dict) or set(value) - set(ROLLOUT_ENGINES):
                raise ValueError(f"{where}: 'rollout' must map rollout engines "
                                 f"({', '.join(ROLLOUT_ENGINES)}) to model FLOP/s")
            out[phase] = {e: _positive(v, f"{where}: rollout.{e}") for e, v in value.items()}
        else:
            out[phase] = _positive(value, f"{where}: {phase}")
    return out


def write_rates(path: str | Path, *, device: str, measured: str,
                rollout: dict[str, float] | None = None, learning: float | None = None,
                reward: float | None = None, eval: float | None = None) -> dict:
    """Write a rates file (format above; model FLOP/s; None: not measured) and return it."""
    from race.core.atomic import write_json_atomic

    phases = {"rollout": rollout or None, "learning": learning, "reward": reward, "eval": eval}
    payload = {"format": RATES_FORMAT, "unit": "model FLOP/s", "device": str(device),
               "measured": str(measured), "phases": _check_phases(phases, str(path))}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, payload)
    return payload


def read_rates(path: str | Path) -> dict:
    """A rates file, checked (ValueError naming the file otherwise)."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--rates {path}: cannot read it ({exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != RATES_FORMAT:
        raise ValueError(f"--rates {path}: not a rates file (format {RATES_FORMAT!r})")
    return {**payload, "phases": _check_phases(payload.get("phases", {}), f"--rates {path}")}


# --------------------------------------------------------------------------- rates


@dataclass(frozen=True)
class Rate:
    """A phase's sustained model FLOP/s (None: none known) and where it comes from (or why
    there is none)."""

    flops_per_s: float | None
    source: str
    note: str | None = None  # printed once for every phase that shares it (a file's origin)


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _on_device(study: Study, run_dir: Path) -> str | None:
    """The device a run computed on (its perf.json), if the study's ``device`` admits it."""
    device = (_load(run_dir / PERF) or {}).get("device")
    return device if device is not None and study.device in ("auto", device) else None


def measured_rates(study: Study) -> dict[str, Rate]:
    """Each phase's rate over the study's finished runs and rung evaluations on its device
    (module docstring); a phase with none is left out."""
    totals = {p: [0.0, 0.0, 0] for p in PHASES}  # FLOPs, seconds, files
    for summary in sorted(study.results.glob("runs/*/*/*/*/train.json")):
        phases = (_load(summary) or {}).get("phases")
        if not isinstance(phases, dict) or _on_device(study, summary.parent) is None:
            continue
        for p in TRAIN_PHASES:
            phase = phases.get(p) or {}
            flops, seconds = phase.get("model_flops", 0), phase.get("wall_s", 0)
            if flops > 0 and seconds > 0:
                totals[p][0] += flops
                totals[p][1] += seconds
                totals[p][2] += 1
    for ev in sorted(study.results.glob("runs/*/*/*/*/budget~*/eval.json")):
        payload = _load(ev) or {}
        flops = (payload.get("executed_total") or {}).get("model", 0)
        seconds = payload.get("wall_s", 0)
        if flops > 0 and seconds > 0 and _on_device(study, ev.parents[1]) is not None:
            totals["eval"][0] += flops
            totals["eval"][1] += seconds
            totals["eval"][2] += 1
    where = f"{study.results}/runs"
    out = {}
    for p, (flops, seconds, n) in totals.items():
        if n:
            what = f"{n} finished evaluation(s)" if p == "eval" else f"{n} finished run(s)"
            note = " (the runs do not record their engine)" if p == "rollout" else ""
            out[p] = Rate(flops / seconds, f"measured: {what} in {where}{note}")
    return out


def phase_rates(study: Study, flags: dict[str, float | None] | None = None,
                flops_per_second: float | None = None,
                rates_file: str | Path | None = None) -> dict[str, Rate]:
    """Each phase's :class:`Rate` by the precedence of the module docstring; ``flags``: the
    per-phase flags by phase. Raises ValueError for an unreadable rates file."""
    flags = flags or {}
    engine = study.training.rollout_engine
    rates = read_rates(rates_file) if rates_file is not None else None
    measured = measured_rates(study)
    out = {}
    for p in PHASES:
        missing = []
        if flags.get(p) is not None:
            out[p] = Rate(_positive(flags[p], FLAG[p]), FLAG[p])
            continue
        if flops_per_second is not None:
            out[p] = Rate(_positive(flops_per_second, "--flops-per-second"),
                          "--flops-per-second (one rate for every phase)")
            continue
        if rates is not None:
            value = rates["phases"].get(p)
            if p == "rollout":
                value = (value or {}).get(engine)
            if value is not None:
                out[p] = Rate(value, f"rates file {rates_file} ({rates.get('device')})",
                              f"rates file {rates_file}: {rates.get('measured')}")
                continue
            what = f"{engine} rollout" if p == "rollout" else LABEL[p]
            missing.append(f"rates file {rates_file} has no {what} rate")
        if p in measured:
            out[p] = measured[p]
            continue
        missing.append(f"no finished {'evaluation' if p == 'eval' else 'run'} on this device "
                       f"in {study.results}/runs")
        out[p] = Rate(None, f"no rate: give {FLAG[p]}, --flops-per-second or --rates FILE ("
                            + "; ".join(missing) + ")")
    return out


# --------------------------------------------------------------------------- FLOPs


def validation_per_reward(study: Study) -> int:
    """The most validation runs per reward and validation seed, as race.study.plan.study_plan
    counts them: ``top_k`` per ranked target plus the baseline at every size, capped by the
    reward's configs."""
    return min(study.race.top_k * max(1, len(study.race_targets)) + len(study.sizes),
               len(study.sizes) * len(study.allocations))


def _extra_seeds(study: Study) -> list[int]:
    return [s for s in study.race.validation_seeds if s not in study.seeds] \
        if study.race.enabled else []


def train_phase_flops(study: Study) -> dict[str, dict[str, float]] | None:
    """Training model FLOPs by stage (``pilot``, ``full_grid``, ``validation``) and phase
    (module docstring); None when a cell's step is not known offline (an architecture not
    known, or a hub task without ``task.max_prompt_tokens``)."""
    from race.study.plan import cell_step_cost

    prompt = study.max_prompt_tokens()
    if prompt is None:
        return None
    shares = {}
    for size in study.sizes:
        for reward in study.rewards:
            for alloc in study.allocations:
                cost = cell_step_cost(study, size, alloc, reward, prompt)
                if cost is None or not cost.cycle:
                    return None
                learning = cost.learning + (cost.num_iterations - 1) * cost.reuse_learning
                shares[size, reward, alloc] = {"rollout": cost.rollout / cost.cycle,
                                               "learning": learning / cost.cycle,
                                               "reward": cost.reward / cost.cycle}
    top, pilot_rung = float(study.budgets[-1]), max(study.pilot_rungs())
    cells = study.grid_cells()
    first = [c for c in cells if c.seed == study.seeds[0]] if study.race.enabled else []

    def stage(cells, budget):
        return {p: sum(shares[c.size, c.reward, c.alloc][p] for c in cells) * budget
                for p in TRAIN_PHASES}

    n, runs = validation_per_reward(study), len(_extra_seeds(study))
    validation = {p: 0.0 for p in TRAIN_PHASES}
    for reward in study.rewards:
        mine = [s for (_, r, _), s in shares.items() if r == reward]
        for p in TRAIN_PHASES:
            validation[p] += runs * study.validation_budget() * sum(
                sorted((s[p] for s in mine), reverse=True)[:n])
    return {"pilot": stage(first, pilot_rung), "full_grid": stage(cells, top),
            "validation": validation}


def _policy_arch(size: str) -> F.Arch:
    from race.data.tokenizer import VOCAB_SIZE

    return F.resolve_arch(size, vocab=VOCAB_SIZE if is_ladder(size) else None)


def _eval_prompts(study: Study) -> tuple[int, int, int | None, int | None]:
    """(eval-in records, eval-OOD records, longest eval-in prompt, longest OOD prompt) in
    policy tokens: for the arithmetic task its split sizes and chain lengths (in characters,
    as race.core.study.Study.max_prompt_tokens counts them), for a hub task ``n_in`` /
    ``n_ood`` and ``task.max_prompt_tokens`` for both."""
    e = study.eval
    if study.source.kind != "arithmetic":
        return e.n_in, e.n_ood, study.max_prompt_tokens(), study.max_prompt_tokens()
    t = study.task
    ood = len(str(t.max_value)) + t.ood_max_steps * (1 + len(str(t.max_operand))) + 3
    return t.n_eval_in, t.n_eval_ood, study.max_prompt_tokens(), ood


def _reads(policy: str, model: str | None, head: str = "token"):
    """The scoring price of a feedback model (race.study.plan.reward_reads); LookupError when
    its architecture is not known offline."""
    from race.study.plan import reward_reads

    if model is None:
        return None
    reads = reward_reads(policy, model, head)
    if reads is None:
        raise LookupError(f"the architecture of {model} is not known offline")
    return reads


def snapshot_eval_flops(study: Study, size: str, reward: str, targets, *,
                        lora: F.LoraSpec | None = None) -> int:
    """Model FLOPs of evaluating one snapshot of ``size`` on ``targets`` (a cell's ``reward``
    scores native_reward), worst case (module docstring), what the job runs: with
    ``share_samples`` one pool of max(k, bon_n) for maj_k and prm_bon, and native_reward on
    sampled_pass1's pool when that pool is large enough (race.evaluation.targets).
    LookupError when a model or the longest prompt is not known offline."""
    e = study.eval
    n_in, n_ood, prompt, ood = _eval_prompts(study)
    if prompt is None:
        raise LookupError("the longest prompt is not known before the data is built (set "
                          "task.max_prompt_tokens)")
    arch = _policy_arch(size)

    def generate(rows: int, prompt_len: int, new: int) -> int:
        return rows * F.generate_flops(arch, prompt_len, new, lora=lora) if rows else 0

    total, new = 0, e.max_new_tokens
    if "in_pass1" in targets:
        total += generate(min(e.n_in, n_in), prompt, new)
    if "ood_pass1" in targets:
        total += generate(min(e.n_ood, n_ood), ood, e.max_new_tokens_ood)
    sampled = (min(e.sampled_prompts, n_in), e.sampled_k)
    if "sampled_pass1" in targets:
        total += generate(sampled[0] * sampled[1], prompt, new)
    searched = min(e.sample_prompts, n_in)
    want = {}
    if "maj_k" in targets:
        want["maj_k"] = e.k
    if "prm_bon" in targets and study.eval_prm is not None:
        want["prm_bon"] = e.bon_n
        reads = _reads(size, study.eval_prm)
        total += searched * e.bon_n * reads.row_flops(prompt, new)
    if want:
        per_prompt = max(want.values()) if e.share_samples else sum(want.values())
        total += generate(searched * per_prompt, prompt, new)
    if "native_reward" in targets:
        spec = study.rewards[reward]
        native = (min(e.native_prompts, n_in), e.native_samples)
        shared = (e.share_samples and "sampled_pass1" in targets and sampled[0] >= native[0]
                  and sampled[1] >= native[1])
        if not shared:
            total += generate(native[0] * native[1], prompt, new)
        reads = _reads(size, spec.model, "sequence" if spec.type == "orm" else "token")
        if reads is not None:
            total += native[0] * native[1] * reads.row_flops(prompt, new)
    return total


def eval_flops(study: Study) -> dict:
    """The study's evaluation model FLOPs (module docstring): ``grid`` (every cell at every
    rung), ``base`` (every base policy), ``validation_at_most``, ``total_at_most``, with the
    snapshot counts; ``error`` (and no FLOPs) when it cannot be estimated offline."""
    e = study.eval
    top = float(study.budgets[-1])
    below_top = tuple(t for t in e.targets if t not in SEARCH_TARGETS) \
        if study.search_only_at_top else e.targets
    try:
        grid = sum(snapshot_eval_flops(
            study, c.size, c.reward, e.targets if float(b) == top else below_top,
            lora=None if e.merge_adapter else study.allocations[c.alloc].lora)
            for c in study.grid_cells() for b in study.budgets)
        base = sum(snapshot_eval_flops(study, s, study.base_reward, e.targets)
                   for s in study.sizes)
        n, seeds = validation_per_reward(study), len(_extra_seeds(study))
        validation = sum(n * seeds * max(
            snapshot_eval_flops(study, s, r, e.targets,
                                lora=None if e.merge_adapter else a.lora)
            for s in study.sizes for a in study.allocations.values())
            for r in study.rewards) if seeds else 0
    except (LookupError, ValueError, FileNotFoundError) as exc:
        return {"error": str(exc)}
    cells = len(study.grid_cells())
    return {"grid": grid, "grid_snapshots": cells * len(study.budgets), "base": base,
            "base_snapshots": len(study.sizes), "validation_at_most": validation,
            "validation_snapshots_at_most": len(study.rewards) * n * seeds,
            "total_at_most": grid + base + validation}


# --------------------------------------------------------------------------- hours


def study_hours(train: dict | None, evaluation: dict, rates: dict[str, Rate]) -> dict:
    """Hours by stage (``pilot``, ``full_grid``, ``validation``, ``evaluation``) and phase:
    FLOPs / rate / 3600; 0 for a phase of no FLOPs; None where the rate or the FLOPs are not
    known. ``total``: full grid + validation + evaluation (the pilot is part of the grid)."""
    def hours(flops, phase):
        if flops is None:
            return None
        if flops == 0:
            return 0.0
        rate = rates[phase].flops_per_s
        return None if rate is None else flops / rate / 3600

    out = {}
    for stage in ("pilot", "full_grid", "validation"):
        out[stage] = {p: hours(None if train is None else train[stage][p], p)
                      for p in TRAIN_PHASES}
    out["evaluation"] = {"eval": hours(evaluation.get("total_at_most"), "eval")}
    out["total"] = {p: _sum(out[s].get(p, 0.0) for s in ("full_grid", "validation",
                                                        "evaluation"))
                    for p in PHASES}
    return out


def _sum(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def format_rates(rates: dict[str, Rate], engine: str) -> str:
    """Each phase's rate and its source, one line each."""
    lines = ["rates, model FLOP/s (a phase's flag, else --flops-per-second, else --rates, else "
             "this study's finished work on its device):"]
    for p, rate in rates.items():
        label = f"rollout ({engine})" if p == "rollout" else LABEL[p]
        value = "" if rate.flops_per_s is None else f"{rate.flops_per_s:.3g} — "
        lines.append(f"  {label + ':':<19} {value}{rate.source}")
    notes = dict.fromkeys(r.note for r in rates.values() if r.note)
    lines += [f"  ({note})" for note in notes]
    return "\n".join(lines)


def format_eval_flops(ev: dict) -> str:
    """:func:`eval_flops` as lines of text."""
    if "error" in ev:
        return f"planned evaluation model FLOPs: not estimated ({ev['error']})"
    return "\n".join([
        "planned evaluation model FLOPs (never charged to a budget; worst case: every prompt "
        "at the longest, every completion at max_new_tokens):",
        f"  grid rungs         {ev['grid']:.3g}  ({ev['grid_snapshots']} snapshots: every "
        "cell at every rung)",
        f"  base policies      {ev['base']:.3g}  ({ev['base_snapshots']} snapshots)",
        f"  validation         <= {ev['validation_at_most']:.3g}  (<= "
        f"{ev['validation_snapshots_at_most']} snapshots)",
        f"  total              <= {ev['total_at_most']:.3g}",
    ])


def format_study_hours(hours: dict, rates: dict[str, Rate]) -> str:
    """:func:`study_hours` as lines: per stage each phase's hours and their sum; a phase
    without a rate says so, as do FLOPs not known offline."""
    def h(value: float | None, phase: str) -> str:
        if value is not None:
            return f"{value:.3g}"
        return "no rate" if rates[phase].flops_per_s is None else "not known"

    lines = ["device-hours per phase (model FLOPs / the phase's rate; each run charged its "
             "budget, split as its cell's worst-case step):"]
    rows = {"pilot": "pilot", "full_grid": "full grid", "validation": "validation <=",
            "training": "training <=", "evaluation": "evaluation <=", "total": "total <="}
    hours = {**hours, "training": {p: _sum([hours["full_grid"][p], hours["validation"][p]])
                                   for p in TRAIN_PHASES}}
    for stage, name in rows.items():
        phases = hours[stage]
        total = _sum(phases.values())
        lines.append(f"  {name:<15}" + ", ".join(f"{LABEL[p]} {h(v, p)}"
                                                 for p, v in phases.items())
                     + (f" = {total:.3g} h" if total is not None else " = not known")
                     + ("  (part of the full grid)" if stage == "pilot" else "")
                     + ("  (full grid + validation)" if stage == "training" else ""))
    return "\n".join(lines)
