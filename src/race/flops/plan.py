"""Budget planning before any compute: what one GRPO step costs per phase, what a budget buys,
and what a study costs by stage (``race plan``, ``race check-config``).

Conventions (those of the trainer's meter, race.flops.meter.StepMeter, and of the budget stop
in race.grpo.run):

* Model FLOPs: real tokens, causal attention, the LoRA policy's forward + backward (frozen
  base: activation gradients only), the reference model's forward when ``beta > 0``.
* Worst case: every row at the given prompt length and every completion at the cap -- the
  bound the trainer's budget stop uses, so the steps printed are the fewest a budget buys.
  With ``mean_completion`` the typical case is printed beside it (every completion that long).
* A step is one optimizer update. Every ``num_iterations``-th step generates (rollout +
  reward); the others retrain on the buffered batch (learning only).
* The budget stop: step k+1 runs only if ``total_k + cost_{k+1} <= budget``.
* Reward: a rule verifier costs 0; a PRM (``reward_arch``) scores each row's prompt +
  completion once with a token-classification head, assuming it shares the policy's
  tokenizer (no re-tokenisation or chat template).
* Time: model FLOPs / an assumed sustained FLOP/s -- an assumption stated by the caller, not a
  measurement (on a GPU, generation runs far below peak: docs/design.md §8).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from race.flops import analytic as F
from race.flops.meter import BatchShapes, StepMeter


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


def step_cost(arch: F.Arch, *, rows: int, prompt_len: int, completion_len: int,
              lora: F.LoraSpec | None, beta: float = 0.0, num_iterations: int = 1,
              reward_arch: F.Arch | None = None, head_all_positions: bool = True) -> StepCost:
    """Per-phase model FLOPs of a step with every row at ``prompt_len + completion_len``.
    ``head_all_positions``: the LM head's logits at every position of the learning forward
    (TRL's plain path, what the CPU trainer charges) or at the completion positions only (the
    fused head on a GPU with Triton; race.grpo.trainer.fused_head_is_compact)."""
    meter = StepMeter(arch, lora, beta=beta, num_iterations=num_iterations,
                      head_all_positions=head_all_positions)
    shapes = BatchShapes.worst_case(rows, prompt_len, completion_len)
    reward = 0 if reward_arch is None else rows * F.reward_model_flops(
        reward_arch, prompt_len + completion_len)
    reuse = meter.learning(shapes, False).model if num_iterations > 1 else 0
    return StepCost(meter.rollout(shapes).model, reward, meter.learning(shapes, True).model,
                    reuse, num_iterations)


def steps_within(cost: StepCost, budget: float) -> dict:
    """Steps, updates, generation steps and model FLOPs of a run stopped by the budget rule."""
    cycles = int(budget // cost.cycle) if cost.cycle else 0
    total, steps, generations = cycles * cost.cycle, cycles * cost.num_iterations, cycles
    for k in range(cost.num_iterations):  # the last, partial cycle
        next_cost = cost.generation_step if k == 0 else cost.reuse_learning
        if total + next_cost > budget:
            break
        total, steps, generations = total + next_cost, steps + 1, generations + (k == 0)
    return {"steps": steps, "updates": steps, "generation_steps": generations,
            "model_flops": total}


def plan(cost: StepCost, budget: float, rows: int, flops_per_second: float | None = None) -> dict:
    """What ``budget`` buys at ``cost``: the run's steps and phases, and time if a throughput
    is assumed."""
    bought = steps_within(cost, budget)
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
        lines.append(f"  time at an assumed {result['assumed_flops_per_second']:.3g} FLOP/s: "
                     f"{result['hours']:.3g} h")
    return "\n".join(lines)


def study_plan(config: dict) -> dict:
    """A study's planned training model FLOPs by stage, each run charged its budget (an upper
    bound: a run stops within one step of it): the pilot (first seed, up to the largest pilot
    rung: a prefix of the grid's runs), the full grid (every cell to its top rung, once: the
    nested rungs cost nothing more), the validation runs at most (per reward, the top-k per
    RACE target plus the baseline allocation at every size, for each validation seed the grid
    does not run), and what the nested rungs save against one run per rung."""
    from race.study import cells as C

    cells = C.grid_cells(config)
    budgets = [float(b) for b in config["budgets"]]
    race = config["race"]
    first = sum(c.seed == config["seeds"][0] for c in cells)
    per_reward = min(race["top_k"] * max(1, len(race.get("targets") or [None]))
                     + len(config["sizes"]), len(config["sizes"]) * len(config["allocations"]))
    extra = [s for s in race["validation_seeds"] if s not in config["seeds"]]
    validation = (len(config["rewards"]) * per_reward * len(extra) * C.validation_budget(config)
                  if race["enabled"] else 0.0)
    full = len(cells) * budgets[-1]
    separate = len(cells) * sum(budgets)
    return {"cells": len(cells), "pilot": first * max(C.pilot_rungs(config)) if race["enabled"]
            else 0.0, "full_grid": full, "validation_at_most": validation,
            "total_at_most": full + validation, "one_run_per_rung": separate,
            "nested_rungs_save": separate - full}
