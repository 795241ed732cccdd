"""The budget planner (race plan, race check-config's stage totals) against hand computations,
and one vocabulary default for every command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from race.cli import main
from race.core.errors import ConfigError
from race.flops import analytic as F
from race.flops.meter import StepMeter, generation_step_bound
from race.study.config import load_study, typed_study
from race.study.plan import (
    MAX_STEPS_PER_RUN,
    cell_step_cost,
    plan,
    reward_reads,
    step_cost,
    steps_within,
    study_plan,
)

ROOT = Path(__file__).resolve().parents[1]


def run_json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_step_and_the_floor_by_hand():
    """nano, 8 rows x (16 + 24) tokens, one update per batch, rule reward: the analytic
    formulas by hand, the trainer's bound (generation_step_bound), and steps = floor(B / step)."""
    arch, lora = F.resolve_arch("nano"), F.LoraSpec(4, F.ALL_PROJECTIONS)
    rows, p, g = 8, 16, 24
    # rollout: a prefill of the prompt (logits at its last position), then one cached decode
    # per further token; learning: forward + backward over prompt + completion, the LM head at
    # the g completion positions (on every device: executed FLOPs alone follow TRL's head)
    one_rollout = F.forward_flops(arch, p, logits=1, lora=lora) + sum(
        F.forward_flops(arch, 1, past=p + j - 1, logits=1, lora=lora) for j in range(1, g))
    assert F.generate_flops(arch, p, g, lora=lora) == one_rollout
    rollout, learning = rows * one_rollout, rows * F.train_flops(arch, p + g, logits=g,
                                                                 lora=lora)
    cost = step_cost(arch, rows=rows, prompt_len=p, completion_len=g, lora=lora)
    assert (cost.rollout, cost.reward, cost.learning, cost.reuse_learning) == (
        rollout, 0, learning, 0)
    meter = StepMeter(arch, lora, beta=0.0, num_iterations=1)
    assert generation_step_bound(meter, rows, p, g, None) == rollout + learning
    step = rollout + learning
    for budget, steps in ((7 * step, 7), (7 * step - 1, 6), (7.5 * step, 7), (step - 1, 0)):
        result = plan(cost, budget, rows)
        assert result["steps"] == result["updates"] == result["generation_steps"] == steps
        assert steps == int(budget // step)
        assert (result["rollouts"], result["model_flops"]) == (steps * rows, steps * step)


def test_steps_a_budget_buys_with_batch_reuse():
    arch, lora = F.resolve_arch("nano"), F.LoraSpec(4, F.ALL_PROJECTIONS)
    rows, p, g = 8, 16, 24
    rollout = F.batch_generate_flops(arch, [p] * rows, [g] * rows, lora=lora)
    learning = rows * F.train_flops(arch, p + g, logits=g, lora=lora)
    # with batch reuse, the generation step also computes the old log-probs: one forward
    old_logps = rows * F.forward_flops(arch, p + g, logits=g, lora=lora)
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


def test_the_typical_case_still_reserves_the_worst_case():
    arch, lora = F.resolve_arch("nano"), F.LoraSpec(4, F.ALL_PROJECTIONS)
    shapes = {"rows": 8, "prompt_len": 16, "lora": lora}
    worst = step_cost(arch, completion_len=24, **shapes)
    typical = step_cost(arch, completion_len=8, **shapes)
    budget = 3 * typical.generation_step + worst.generation_step - 1
    assert budget // typical.generation_step > 3
    # step k+1 runs only if k typical steps + one worst-case step fit: k = 0, 1, 2
    assert plan(typical, budget, 8, bound=worst)["steps"] == 3


def test_a_prm_reward_is_charged_per_row():
    arch, prm = F.resolve_arch("nano"), F.resolve_arch("mini")
    cost = step_cost(arch, rows=4, prompt_len=10, completion_len=20, lora=None,
                     reward=reward_reads("nano", "mini"))
    # a ladder PRM on a ladder policy: prompt + completion + the separator it appends
    assert cost.reward == 4 * F.reward_model_flops(prm, 31)
    # another tokenizer: two of its tokens per policy token, at most (an estimate)
    qwen = reward_reads("nano", "Qwen2.5-0.5B")
    assert qwen.tokens(10, 20) == 61 and reward_reads("nano", "mini", "sequence").tokens(1, 1) == 2
    assert reward_reads("nano", None) is None


def test_race_plan_flags_and_config(capsys):
    flags = run_json(capsys, "nano", "--budget", "1e9", "--prompts", "2", "--generations", "4",
                     "--prompt-len", "16", "--completion-len", "24", "--lora-rank", "4",
                     "--mean-completion", "12")
    cost = step_cost(F.resolve_arch("nano"), rows=8, prompt_len=16, completion_len=24,
                     lora=F.LoraSpec(4, F.ALL_PROJECTIONS))
    assert flags["worst"] == json.loads(json.dumps(plan(cost, 1e9, 8)))
    assert flags["typical"]["steps"] >= flags["worst"]["steps"] > 0
    # the smoke study's allocation, its rule+prm reward (a nano PRM), the task's longest
    # prompt (9 characters) and its largest rung
    config = run_json(capsys, "--config", str(ROOT / "configs" / "smoke.yaml"), "--size",
                      "nano", "--alloc", "updates", "--reward", "rule+prm")
    assert (config["rows"], config["prompt_len"], config["completion_len"]) == (8, 9, 24)
    step = config["worst"]["step"]
    assert step["num_iterations"] == 2 and step["reuse_learning"] > 0
    assert step["reward"] == 8 * F.reward_model_flops(F.resolve_arch("nano"), 9 + 24 + 1)
    assert config["worst"]["budget"] == 1.6e10
    assert main(["plan", "--config", str(ROOT / "configs" / "smoke.yaml"), "--size", "nano",
                 "--alloc", "updates", "--prompts", "3"]) == 2
    assert "drop --prompts" in capsys.readouterr().err


def test_race_plan_text_names_its_assumptions(capsys):
    assert main(["plan", "qwen2.5-1.5b", "--budget", "1e18", "--prompt-len", "128",
                 "--completion-len", "512", "--mean-completion", "256",
                 "--flops-per-second", "2.967e14"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Qwen2.5-1.5B (1,543,714,304 parameters): 64 rows")
    assert "worst case (every completion at the 512-token cap" in out
    assert "typical case (ASSUMED: every completion 256 tokens" in out
    assert "time at an ASSUMED 2.967e+14 model FLOP/s (not a measurement)" in out


@pytest.mark.parametrize("budget", ["-5", "0", "nan"])
def test_a_budget_that_buys_nothing_is_refused(capsys, budget):
    assert main(["plan", "nano", "--budget", budget]) == 2
    assert "--budget must be a positive number of model FLOPs" in capsys.readouterr().err


def test_study_stage_totals(capsys):
    config = load_study(ROOT / "configs" / "smoke.yaml")
    planned = study_plan(config)
    cells = 2 * 2 * 2  # sizes x rewards x allocations, one seed
    assert planned["full_grid"] == cells * 1.6e10
    assert planned["pilot"] == cells * 4e9
    assert planned["nested_rungs_save"] == cells * (4e9 + 8e9)
    # per reward: top-1 for one target + the baseline at both sizes; seed 1 only
    assert planned["validation_at_most"] == 2 * 3 * 1 * 8e9
    assert planned["total_at_most"] == cells * 1.6e10 + 2 * 3 * 8e9
    assert main(["check-config", str(ROOT / "configs" / "smoke.yaml")]) == 0
    out = capsys.readouterr().out
    assert "  pilot              3.2e+10" in out and "  full grid          1.28e+11" in out
    assert "  nested rungs save  9.6e+10" in out
    # Without race.targets the pilot ranks every target its rungs measure (the smoke study
    # evaluates search targets at every rung: all six); top-1 of each + 2 baselines, capped
    # at the 2 x 2 configs of a reward.
    race = {k: v for k, v in config.config["race"].items() if k != "targets"}
    assert study_plan(typed_study({**config.config, "race": race}))[
        "validation_runs_at_most"] == 2 * min(6 + 2, 4) * 1


def test_one_vocabulary_default(capsys):
    from race.data.tokenizer import VOCAB_SIZE

    assert F.LADDER_REFERENCE_VOCAB == VOCAB_SIZE
    assert main(["flops", "micro", "--seq", "8", "--json"]) == 0
    flops = json.loads(capsys.readouterr().out)
    assert flops["vocab"] == VOCAB_SIZE
    models = subprocess.run([sys.executable, "-m", "race.cli", "models"], capture_output=True,
                            text=True, check=True).stdout
    micro = next(line for line in models.splitlines() if line.startswith("| micro"))
    assert f"| {flops['params']:,} |" in micro
    assert flops["params"] == F.resolve_arch("micro").params()


def test_a_missing_input_file_is_named_with_exit_2(tmp_path, capsys):
    missing = tmp_path / "pilot.csv"
    assert main(["select", str(missing), "--top-k", "1", "--baseline", "g8",
                 "--out", str(tmp_path / "selected.json")]) == 2
    assert f"race select: No such file or directory: {missing}" in capsys.readouterr().err
    assert not (tmp_path / "selected.json").exists()


# --------------------------------------------------------------------------- the step limit


def _smoke(tmp_path: Path, **override) -> Path:
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    raw.update(results_dir=str(tmp_path / "results"), **override)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_budget_past_the_step_limit_is_refused_with_race_plans_numbers(tmp_path, capsys):
    """The first rung at which a cell needs more steps than max_steps_per_run is refused,
    naming the rung, the cell with the cheapest step and its steps as race plan counts them;
    the rungs below it pass."""
    with pytest.raises(ConfigError) as error:
        load_study(_smoke(tmp_path, max_steps_per_run=10))
    worst = run_json(capsys, "--config", str(ROOT / "configs" / "smoke.yaml"), "--size",
                     "nano", "--alloc", "updates", "--reward", "rule", "--budget", "8e9")["worst"]
    assert str(error.value) == (
        f"budgets[1]: 8e+09 model FLOPs takes at least {worst['steps']} steps in run "
        "size~nano/reward~rule/alloc~updates (race plan's worst case, every completion at the "
        "cap), past the limit of 10 steps per run: a typo? If it is meant, raise "
        "max_steps_per_run in the config")


def test_an_absurd_budget_is_a_typo_unless_the_config_says_so(tmp_path):
    budgets = [4.0e9, 8.0e9, 1.6e10, 1.0e30]
    with pytest.raises(ConfigError, match=r"budgets\[3\]: 1e\+30 model FLOPs takes at least "
                                          r"2\.21e\+21 steps .* past the limit of 1,000,000 "
                                          r"steps per run: .* raise max_steps_per_run"):
        load_study(_smoke(tmp_path, budgets=budgets))
    assert load_study(_smoke(tmp_path, budgets=budgets, max_steps_per_run=10**22)).budgets[-1] \
        == 1e30


# configs/rehearsal.yaml names the stand-ins `race stand-ins` writes (not in a fresh clone): the
# rehearsal's own run (tests/test_rehearsal.py) passes this check when its workflow loads it.
@pytest.mark.parametrize("name", ["config.yaml", "configs/smoke.yaml", "configs/qwen2.5.yaml",
                                  "configs/qwen2.5-1gpu.yaml"])
def test_the_shipped_studies_are_far_below_the_default_limit(name):
    study = load_study(ROOT / name)
    prompt = study.max_prompt_tokens()
    most = max(steps_within(cell_step_cost(study, size, alloc, reward, prompt),
                            study.budgets[-1])["steps"]
               for size in study.sizes for alloc in study.allocations for reward in study.rewards)
    assert 50 * most <= MAX_STEPS_PER_RUN


def test_race_train_refuses_a_job_past_the_limit_before_loading_a_model(tmp_path, capsys):
    """A job given directly (--job) is checked against its own data: prompts counted at their
    UTF-8 bytes, so its steps are no more than the run's; its run options can lift the limit."""
    from race.cli.train import check_run_length
    from race.core import jobs

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "12+3=?\n", "answer": "15"}) + "\n")
    job = jobs.TrainJob(base="nano", train_data=str(data), run_dir=str(tmp_path / "run"),
                        rungs=[1e9, 1e30], run_key="size~nano/reward~rule/alloc~g8/seed~0")
    assert main(["train", "--job", jobs.to_json(job)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("race train: rungs[1]: 1e+30 model FLOPs takes at least ")
    assert "in run size~nano/reward~rule/alloc~g8/seed~0" in err and "--run-options" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()
    check_run_length(jobs.with_run_options("train", job, '{"max_steps_per_run": 1e22}'))


def test_race_plan_gap_prompts_by_hand(capsys):
    """``race plan --gap 0.05 --accuracy 0.4``: configs at 0.425 and 0.375, paired on the same
    prompts, each prompt's variance p(1 - p): n = 2^2 * (0.425 * 0.575 + 0.375 * 0.625) /
    0.05^2 = 4 * 0.47875 / 0.0025 = 766 at the expected z = 2."""
    assert run_json(capsys, "--gap", "0.05", "--accuracy", "0.4")["prompts"] == 766
    # 80% power adds z_0.8 = 0.8416 to the line: 2.8416^2 * 191.5 = 1546.3 -> 1547.
    assert run_json(capsys, "--gap", "0.05", "--accuracy", "0.4", "--power", "0.8")[
        "prompts"] == 1547
    # Correlated per-prompt scores (shared prompts) need fewer.
    assert run_json(capsys, "--gap", "0.05", "--accuracy", "0.4", "--correlation", "0.5")[
        "prompts"] < 766
    assert main(["plan", "--gap", "0.05", "--accuracy", "0.4"]) == 0
    assert "needs 766 evaluation prompts per config" in capsys.readouterr().out
    for argv, message in ((["--gap", "0.05"], "--gap needs --accuracy"),
                          (["--accuracy", "0.4"], "--accuracy needs --gap"),
                          (["--gap", "1.5", "--accuracy", "0.4"], "gap must be a fraction"),
                          (["--gap", "0.2", "--accuracy", "0.95"], "must stay in [0, 1]")):
        assert main(["plan", *argv]) == 2
        assert message in capsys.readouterr().err
