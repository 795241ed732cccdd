"""The budget planner (race plan, race check-config's stage totals) against hand computations,
and one vocabulary default for every command."""

import subprocess
import sys
from pathlib import Path

from race.flops import analytic as F
from race.flops.plan import plan, step_cost, study_plan
from race.study.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_steps_a_budget_buys_by_hand():
    arch, lora = F.resolve_arch("nano"), F.LoraSpec(4, F.ALL_PROJECTIONS)
    rows, p, g = 8, 16, 24
    rollout = F.batch_generate_flops(arch, [p] * rows, [g] * rows, lora=lora)
    learning = rows * F.train_flops(arch, p + g, logits=p + g - 1, lora=lora)
    # with batch reuse, the generation step also computes the old log-probs: one forward
    old_logps = rows * F.forward_flops(arch, p + g, logits=p + g - 1, lora=lora)
    cost = step_cost(arch, rows=rows, prompt_len=p, completion_len=g, lora=lora,
                     num_iterations=2)
    assert (cost.rollout, cost.learning, cost.reuse_learning, cost.reward) == (
        rollout, learning + old_logps, learning, 0)
    generation = rollout + learning + old_logps
    # 3 cycles of (generation step, reuse step), then one more generation step fits, not its
    # reuse step: 7 steps, 4 of them generating.
    budget = 3 * (generation + learning) + generation + learning // 2
    result = plan(cost, budget, rows, flops_per_second=1e9)
    assert (result["steps"], result["generation_steps"], result["rollouts"]) == (7, 4, 32)
    assert result["model_flops"] == 4 * generation + 3 * learning <= budget
    assert result["phases"] == {"rollout": 4 * rollout, "reward": 0,
                                "learning": 4 * (learning + old_logps) + 3 * learning}
    assert result["hours"] == result["model_flops"] / 1e9 / 3600


def test_a_prm_reward_is_charged_per_row():
    arch, prm = F.resolve_arch("nano"), F.resolve_arch("mini")
    cost = step_cost(arch, rows=4, prompt_len=10, completion_len=20, lora=None,
                     reward_arch=prm)
    assert cost.reward == 4 * F.reward_model_flops(prm, 30)


def test_study_stage_totals():
    config = load_config(ROOT / "configs" / "smoke.yaml")
    planned = study_plan(config)
    cells = 2 * 2 * 2  # sizes x rewards x allocations, one seed
    assert planned["full_grid"] == cells * 1.6e10
    assert planned["pilot"] == cells * 4e9
    assert planned["nested_rungs_save"] == cells * (4e9 + 8e9)
    # per reward: top-1 for one target + the baseline at both sizes; seed 1 only
    assert planned["validation_at_most"] == 2 * 3 * 1 * 8e9


def test_one_vocabulary_default():
    from race.data.tokenizer import VOCAB_SIZE

    assert F.LADDER_REFERENCE_VOCAB == VOCAB_SIZE
    models = subprocess.run([sys.executable, "-m", "race.cli", "models"], capture_output=True,
                            text=True, check=True).stdout
    nano = next(line for line in models.splitlines() if line.startswith("| nano"))
    assert f"{F.resolve_arch('nano').params():,}" in nano
