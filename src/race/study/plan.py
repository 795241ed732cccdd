"""Budget planning before any compute: what one GRPO step costs per phase, what a budget buys,
and what a study costs by stage (``race plan``, ``race check-config``).

Conventions (those of the trainer's meter, race.flops.meter.StepMeter, and of the budget stop
in race.grpo.run):

* Units: model FLOPs (race.flops.analytic: matmuls, 2 per multiply-add) -- real tokens, causal
  attention, the LoRA policy's forward + backward (frozen base: activation gradients only;
  gradient-checkpoint recompute when on), the reference model's forward when ``beta > 0``,
  the old-policy log-prob forward when ``num_iterations > 1``. Padding (executed FLOPs),
  norms, activations and the optimizer are not counted.
* Worst case: every row at the given (longest) prompt length and every completion at the cap --
  the bound the trainer's budget stop reserves before a generation step, so the steps printed
  are the fewest a budget buys. With ``mean_completion`` a typical case is printed beside it:
  every completion that long (an assumption), the stop still reserving the worst case.
* A step is one optimizer update. Every ``num_iterations``-th step generates (rollout +
  reward + learning); the others retrain on the buffered batch (learning only).
* The budget stop: step k+1 runs only if ``total_k + bound_{k+1} <= budget``, the bound of a
  generation step being the worst case and that of a reuse step its exact cost. When every
  step costs its bound, that is ``steps = floor(budget / step)`` (``num_iterations == 1``).
* Reward: a rule verifier costs 0; a feedback model is priced by what it reads of each row
  (race.flops.meter.RewardReads, race.feedback.reads): :func:`reward_reads` measures it as the
  trainer does where both folders are here (a local folder or the hub cache), else applies
  the planning rule -- every policy token one of its tokens when both are ladder models (one
  character tokenizer), two otherwise (an estimate for tokenizers not at hand), plus the
  separator a PRM appends.
* LM head: at the completion positions of the learning forward, on every device (executed
  FLOPs, which this module does not plan, follow the device: race.flops.meter).
* Time: model FLOPs / an assumed sustained FLOP/s -- an assumption stated by the caller, not a
  measurement (on a GPU, generation runs far below peak: docs/design.md §8).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from race.core.cells import is_ladder
from race.core.study import Study
from race.flops import analytic as F
from race.flops.meter import BatchShapes, RewardReads, StepMeter, generation_step


@dataclass(frozen=True)
class StepCost:
    """Model FLOPs of the steps of one generation cycle (``num_iterations`` steps)."""

    rollout: int
    reward: int
    learning: int  # a generation step's update (+ the old log-probs forward when reusing)
    reuse_learning: int  # a reuse step's update (0 when num_iterations == 1)
    num_iterations: int

    @property
    def generation_step(self) -> int:
        return self.rollout + self.reward + self.learning

    @property
    def cycle(self) -> int:
        return self.generation_step + (self.num_iterations - 1) * self.reuse_learning


def reward_reads(policy: str, model: str | None, head: str = "token", *,
                 chat_template: bool | None = None,
                 revisions: dict[str, str] | None = None) -> RewardReads | None:
    """What a reward model named in a config reads of a row, before it is loaded: measured as
    the trainer measures it when both the policy's and the model's folders are at hand (a
    local folder, or a hub id's snapshot in the local hub cache at its pin in
    ``revisions``), else the planning rule (race.feedback.reads); None for no model or one
    whose architecture is not known offline."""
    from race.feedback.reads import folder_reads, planned_reads
    from race.flops import known_configs

    if model is None:
        return None
    try:
        arch = F.resolve_arch(model)
    except (ValueError, FileNotFoundError, KeyError):
        return None
    folders = [local_folder(spec, revisions) for spec in (policy, model)]
    if all(folders):
        return folder_reads(*map(str, folders), chat_template)
    if known_configs.is_known(model) and \
            known_configs.canonical_name(model) in known_configs.FEEDBACK:
        head = "prm_mlp"  # the known feedback model is a Qwen-Math PRM
    shared = is_ladder(model) and is_ladder(policy)  # both read the character tokenizer
    return planned_reads(arch, head, shared=shared)


def spec_reads(policy: str, reward, revisions: dict[str, str] | None = None) \
        -> RewardReads | None:
    """:func:`reward_reads` of a ``rewards:`` entry (race.core.specs.RewardSpec): its model,
    its score head (an ORM's pools the sequence) and its chat-template option."""
    return reward_reads(policy, reward.model, "sequence" if reward.type == "orm" else "token",
                        chat_template=reward.chat_template, revisions=revisions)


def local_folder(spec: str, revisions: dict[str, str] | None = None) -> Path | None:
    """The folder holding ``spec``'s tokenizer and config.json here, without downloading:
    the folder itself, or a hub id's cached snapshot at its pin; None for a ladder name (the
    planning rule is exact for it) or what is not here."""
    from race.core.references import is_hub_reference, local_snapshot

    if is_ladder(spec):
        return None
    folder = local_snapshot(spec, (revisions or {}).get(spec)) if is_hub_reference(spec) \
        else Path(spec)
    files = ("config.json", "tokenizer_config.json")
    return folder if folder is not None and all((folder / f).is_file() for f in files) \
        else None


def format_reward_reads(study: Study) -> str:
    """What each reward model reads of a row of each policy, as the budget stop prices it,
    and whether it was measured from the tokenizers or is the planning rule."""
    lines = ["reward-model reads per row of P prompt and C completion policy tokens (the budget "
             "stop's price, race.feedback.reads):"]
    for name, reward in study.rewards.items():
        if reward.model is None:
            continue
        for size in study.sizes:
            reads = spec_reads(size, reward, study.revisions)
            if reads is None:
                lines.append(f"  {name} on {size}: architecture not known offline")
                continue
            here = all(local_folder(s, study.revisions) for s in (size, reward.model))
            source = "measured from the tokenizers here" if here else (
                "exact: one character tokenizer" if is_ladder(size) and is_ladder(reward.model)
                else "the planning rule: tokenizers not here, the trainer measures them")
            lines.append(f"  {name} on {size}: {reads.prompt_expansion}·P + {reads.expansion}·C "
                         f"+ {reads.appended + reads.template} tokens ({source})")
    return "\n".join(lines) if len(lines) > 1 else ""


def step_cost(arch: F.Arch, *, rows: int, prompt_len: int, completion_len: int,
              lora: F.LoraSpec | None, beta: float = 0.0, num_iterations: int = 1,
              reward: RewardReads | None = None, grad_ckpt: bool = False) -> StepCost:
    """Per-phase model FLOPs of a step with every row at ``prompt_len + completion_len``,
    as the trainer's meter charges it (race.flops.meter.generation_step)."""
    meter = StepMeter(arch, lora, beta=beta, num_iterations=num_iterations, grad_ckpt=grad_ckpt)
    step = generation_step(meter, rows, prompt_len, completion_len, reward)
    shapes = BatchShapes.worst_case(rows, prompt_len, completion_len)
    reuse = meter.learning(shapes, generation_step=False).model if num_iterations > 1 else 0
    return StepCost(step.rollout, step.reward, step.learning, reuse, num_iterations)


def steps_within(cost: StepCost, budget: float, bound: StepCost | None = None) -> dict:
    """Steps, updates, generation steps and model FLOPs of a run stopped by the budget rule:
    steps cost ``cost``; a generation step runs only if its ``bound`` (default ``cost``: every
    step is the worst case) still fits, a reuse step only if its exact cost does. Integer
    arithmetic (FLOPs are integers, so ``total <= budget`` iff ``total <= floor(budget)``)."""
    limit = math.floor(budget)
    reserve = (bound or cost).generation_step  # what the stop sets aside for a generation step
    cycle = cost.cycle
    # Cycle j (0-based) runs whole iff j * cycle + max(reserve, cycle) <= limit: all of them
    # at once, then the last, partial cycle step by step (fewer than num_iterations + 1 steps).
    need = max(reserve, cycle)
    cycles = (limit - need) // cycle + 1 if cycle and limit >= need else 0
    total, steps, generations = cycles * cycle, cycles * cost.num_iterations, cycles
    while True:
        generating = steps % cost.num_iterations == 0
        held = reserve if generating else cost.reuse_learning
        if not held or total + held > limit:
            break
        total += cost.generation_step if generating else cost.reuse_learning
        steps, generations = steps + 1, generations + generating
    return {"steps": steps, "updates": steps, "generation_steps": generations,
            "model_flops": total}


def plan(cost: StepCost, budget: float, rows: int, flops_per_second: float | None = None,
         bound: StepCost | None = None) -> dict:
    """What ``budget`` buys at ``cost`` (the stop reserving ``bound``, default ``cost``): the
    run's steps and phases, and its time if a throughput is assumed."""
    bought = steps_within(cost, budget, bound)
    gens = bought["generation_steps"]
    reuse = bought["steps"] - gens
    phases = {"rollout": gens * cost.rollout, "reward": gens * cost.reward,
              "learning": gens * cost.learning + reuse * cost.reuse_learning}
    out = {"budget": budget, "step": asdict(cost), "generation_step_flops": cost.generation_step,
           **bought, "rollouts": gens * rows, "phases": phases}
    if flops_per_second:
        out["assumed_flops_per_second"] = flops_per_second
        out["hours"] = bought["model_flops"] / flops_per_second / 3600
    return out


def format_plan(result: dict, label: str) -> str:
    """A :func:`plan` result as lines of text, under ``label``."""
    s = result["step"]
    lines = [f"{label}: budget {result['budget']:.4g} model FLOPs",
             f"  one generation step: rollout {s['rollout']:.4g} + reward {s['reward']:.4g} + "
             f"learning {s['learning']:.4g} = {result['generation_step_flops']:.4g}"]
    if s["num_iterations"] > 1:
        lines.append(f"  one reuse step (learning only): {s['reuse_learning']:.4g}")
    total = result["model_flops"] or 1
    lines += [f"  buys {result['steps']:,} steps ({result['updates']:,} updates, "
              f"{result['generation_steps']:,} generation steps, {result['rollouts']:,} "
              f"rollouts), {result['model_flops']:.4g} model FLOPs",
              "  split: " + ", ".join(f"{p} {v / total:.1%}"
                                     for p, v in result["phases"].items())]
    if "hours" in result:
        lines.append(f"  time at an ASSUMED {result['assumed_flops_per_second']:.4g} model "
                     f"FLOP/s (not a measurement): {result['hours']:.3g} h")
    return "\n".join(lines)


def study_plan(study: Study) -> dict:
    """A study's planned training model FLOPs by stage, each run charged its budget (an upper
    bound: a run stops within one step below it; evaluation, base policies and PRMs are not
    counted):

    * ``pilot``: the first seed's grid cells up to the largest pilot rung (a prefix of those
      grid runs, so part of ``full_grid``, not on top of it);
    * ``full_grid``: every grid cell to its top rung, once (the nested rungs are snapshots of
      that one run: they cost nothing more);
    * ``validation_at_most``: the RACE validation runs at ``race.validation_budget`` -- per
      reward at most ``top_k`` per ranked target plus the baseline allocation at every size
      (capped by sizes x allocations), for each validation seed the grid does not run (the
      selection is known only after the pilot, hence the bound);
    * ``nested_rungs_save``: separate runs to every rung (``one_run_per_rung``) minus
      ``full_grid``.
    """
    cells = study.grid_cells()
    budgets = list(study.budgets)
    race = study.race
    first = sum(c.seed == study.seeds[0] for c in cells) if race.enabled else 0
    per_reward = min(race.top_k * max(1, len(study.race_targets))
                     + len(study.sizes), len(study.sizes) * len(study.allocations))
    extra = [s for s in race.validation_seeds if s not in study.seeds]
    runs = len(study.rewards) * per_reward * len(extra) if race.enabled else 0
    validation = runs * study.validation_budget()
    full = len(cells) * budgets[-1]
    separate = len(cells) * sum(budgets)
    return {"cells": len(cells), "top_rung": budgets[-1], "pilot_runs": first,
            "pilot_rung": max(float(b) for b in study.pilot_rungs()),
            "pilot": first * max(float(b) for b in study.pilot_rungs()),
            "full_grid": full, "validation_runs_at_most": runs,
            "validation_budget": study.validation_budget(),
            "validation_at_most": validation, "total_at_most": full + validation,
            "one_run_per_rung": separate, "nested_rungs_save": separate - full}


def format_study_plan(p: dict) -> str:
    """:func:`study_plan` as lines of text."""
    return "\n".join([
        "planned training model FLOPs (each run charged its budget; evaluation, base policies "
        "and PRMs not counted):",
        f"  pilot              {p['pilot']:.3g}  ({p['pilot_runs']} first-seed runs to the "
        f"largest pilot rung {p['pilot_rung']:.3g}; part of the full grid)",
        f"  full grid          {p['full_grid']:.3g}  ({p['cells']} runs to the top rung "
        f"{p['top_rung']:.3g})",
        f"  validation         <= {p['validation_at_most']:.3g}  (<= "
        f"{p['validation_runs_at_most']} runs at {p['validation_budget']:.3g}, seeds the grid "
        "does not run)",
        f"  total              <= {p['total_at_most']:.3g}",
        f"  nested rungs save  {p['nested_rungs_save']:.3g}  (one run per cell and rung would "
        f"cost {p['one_run_per_rung']:.3g})",
    ])


# --------------------------------------------------------------------------- the step limit

#: The most optimizer steps one run may take to its top budget, by the planner's count (the
#: fewest the budget buys: every completion at the cap), when the config sets no
#: ``max_steps_per_run``. A budget past it is a typo (an exponent mistyped), not a plan: it
#: is refused before compute, not run for months.
MAX_STEPS_PER_RUN = 1_000_000


@dataclass(frozen=True)
class Overlong:
    """A rung some run cannot reach within the step limit."""

    index: int  # into the budgets (or the job's rungs)
    budget: float
    run: str  # which run: a cell's size/reward/alloc, or the job's run key
    steps: int  # the fewest steps the budget buys in that run
    limit: int

    def message(self, key: str, override: str = "the config") -> str:
        """The refusal, led by ``key`` (the config's ``budgets`` or the job's ``rungs``);
        ``override`` says where ``max_steps_per_run`` is set."""
        return (f"{key}[{self.index}]: {self.budget:.4g} model FLOPs takes at least "
                f"{_count(self.steps)} steps in run {self.run} (race plan's worst case, every "
                f"completion at the cap), past the limit of {_count(self.limit)} steps per run: "
                f"a typo? If it is meant, raise max_steps_per_run in {override}")


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**9 else f"{n:.3g}"


def first_overlong(costs: dict[str, StepCost], budgets, limit: int | None) -> Overlong | None:
    """The first rung at which a run (``costs``: its worst-case step, by run label) needs more
    than ``limit`` steps (None: :data:`MAX_STEPS_PER_RUN`), with the run that needs the most
    there (the cheapest step); None when every run fits."""
    limit = limit or MAX_STEPS_PER_RUN
    for i, budget in enumerate(budgets):
        steps, run = max((steps_within(cost, budget)["steps"], run)
                         for run, cost in costs.items())
        if steps > limit:
            return Overlong(i, float(budget), run, steps, limit)
    return None


def cell_step_cost(study: Study, size: str, alloc_name: str, reward_name: str,
                   prompt_len: int) -> StepCost | None:
    """The worst-case step of a cell (prompts of ``prompt_len`` tokens), or None when the
    policy's architecture is not known offline."""
    from race.data.tokenizer import VOCAB_SIZE

    try:
        arch = F.resolve_arch(size, vocab=VOCAB_SIZE if is_ladder(size) else None)
    except (ValueError, FileNotFoundError, KeyError):
        return None
    return _allocation_step(arch, study.allocations[alloc_name], size,
                            study.rewards[reward_name], prompt_len,
                            study.training.gradient_checkpointing, study.revisions)


def job_step_cost(job, prompt_len: int) -> StepCost | None:
    """The worst-case step of a training job (race.core.jobs.TrainJob) with prompts of at
    most ``prompt_len`` tokens, or None when its base policy's architecture cannot be read
    (not built yet, or unknown offline)."""
    try:
        arch = F.resolve_arch(job.base)
    except (ValueError, FileNotFoundError, KeyError):
        return None
    return _allocation_step(arch, job.alloc, job.base, job.reward, prompt_len,
                            job.gradient_checkpointing, job.revisions)


def _allocation_step(arch: F.Arch, alloc, policy: str, reward, prompt_len: int,
                     grad_ckpt: bool, revisions: dict[str, str] | None = None) -> StepCost:
    """:func:`step_cost` of an allocation and a reward spec (race.core.specs)."""
    reads = spec_reads(policy, reward, revisions)
    return step_cost(arch, rows=alloc.rows, prompt_len=prompt_len,
                     completion_len=alloc.max_completion_length, lora=alloc.lora,
                     beta=alloc.beta, num_iterations=alloc.num_iterations, reward=reads,
                     grad_ckpt=grad_ckpt)
