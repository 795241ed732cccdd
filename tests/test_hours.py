"""Device-hours per phase (race.study.hours, race check-config): where each phase's rate comes
from and in what order, the per-phase FLOPs and hours against hand computations, evaluation in
the total, the output naming every source, and the rates file round trip."""

import json
from pathlib import Path

import pytest
import yaml

from race.cli import main
from race.flops import analytic as F
from race.study.config import load_study
from race.study.hours import (
    PHASES,
    eval_flops,
    phase_rates,
    read_rates,
    snapshot_eval_flops,
    study_hours,
    train_phase_flops,
    validation_per_reward,
    write_rates,
)
from race.study.plan import cell_step_cost, study_plan

ROOT = Path(__file__).resolve().parents[1]


def smoke(tmp_path: Path, **overrides) -> Path:
    """configs/smoke.yaml with its results under ``tmp_path`` and top-level ``overrides``."""
    config = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    config.update(results_dir=str(tmp_path / "results"),
                  reports_dir=str(tmp_path / "results" / "reports"), **overrides)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def finished_run(results: Path, key: str, device: str, phases: dict, evals=()) -> None:
    """A finished run's train.json (``phases``: {phase: (model FLOPs, seconds)}) and perf.json,
    and one eval.json per ``(budget, model FLOPs, seconds)`` in ``evals``."""
    run = results / "runs" / key
    run.mkdir(parents=True)
    (run / "perf.json").write_text(json.dumps({"device": device}))
    (run / "train.json").write_text(json.dumps({"phases": {
        p: {"model_flops": f, "executed_flops": f, "tokens": 1, "wall_s": s}
        for p, (f, s) in phases.items()}}))
    for budget, flops, seconds in evals:
        (run / f"budget~{budget}").mkdir()
        (run / f"budget~{budget}" / "eval.json").write_text(json.dumps(
            {"executed_total": {"model": flops, "executed": flops, "tokens": 1},
             "wall_s": seconds}))


CELL = "size~nano/reward~rule/alloc~base/seed~0"


def test_rates_file_round_trip_and_refusals(tmp_path):
    path = tmp_path / "out" / "rates.json"
    written = write_rates(path, device="NVIDIA H200", measured="gpu_check.py",
                          rollout={"peft": 1e10, "merged": 2e11}, learning=5e12, eval=3e11)
    assert read_rates(path) == written == {
        "format": "race-rates/1", "unit": "model FLOP/s", "device": "NVIDIA H200",
        "measured": "gpu_check.py",
        "phases": {"rollout": {"peft": 1e10, "merged": 2e11}, "learning": 5e12, "eval": 3e11}}
    for bad, match in (({"format": "other"}, "not a rates file"),
                       ({"phases": {"learning": -1}}, "positive"),
                       ({"phases": {"rollout": 1e9}}, "map rollout engines"),
                       ({"phases": {"rollout": {"vllm": 1e9}}}, "map rollout engines"),
                       ({"phases": {"pre": 1e9}}, "unknown phase")):
        path.write_text(json.dumps({"format": "race-rates/1", **bad}))
        with pytest.raises(ValueError, match=match):
            read_rates(path)


def test_each_phase_takes_the_first_source_that_has_a_rate(tmp_path):
    """Flag > --flops-per-second > rates file (rollout: the config's engine) > finished runs
    on the study's device > none; 0-FLOP phases (a rule reward) and other devices left out."""
    study = load_study(smoke(tmp_path, device="cpu"))  # rollout_engine: fused
    results = Path(study.results_dir)
    finished_run(results, CELL, "cpu", {"rollout": (100, 2), "learning": (300, 1),
                                        "reward": (0, 0.5)}, evals=[("4e+09", 1000, 4)])
    finished_run(results, "size~nano/reward~rule+prm/alloc~base/seed~0", "cpu",
                 {"rollout": (200, 1), "learning": (300, 2), "reward": (40, 4)})
    finished_run(results, "size~micro/reward~rule/alloc~base/seed~0", "cuda",
                 {"rollout": (1e9, 1), "learning": (1e9, 1), "reward": (1e9, 1)},
                 evals=[("4e+09", 1e9, 1)])
    measured = phase_rates(study)
    assert {p: r.flops_per_s for p, r in measured.items()} == {
        "rollout": 300 / 3, "learning": 600 / 3, "reward": 40 / 4, "eval": 1000 / 4}
    assert measured["learning"].source.startswith("measured: 2 finished run(s) in ")
    assert measured["eval"].source.startswith("measured: 1 finished evaluation(s)")

    rates = tmp_path / "rates.json"
    write_rates(rates, device="H200", measured="here", rollout={"peft": 7.0}, learning=8.0)
    filed = phase_rates(study, rates_file=rates)
    assert {p: r.flops_per_s for p, r in filed.items()} == {
        "rollout": 100.0, "learning": 8.0, "reward": 10.0, "eval": 250.0}  # no fused rollout
    assert filed["learning"].source == f"rates file {rates} (H200)"
    assert filed["learning"].note == f"rates file {rates}: here"
    write_rates(rates, device="H200", measured="here", rollout={"fused": 6.0})
    assert phase_rates(study, rates_file=rates)["rollout"].flops_per_s == 6.0

    one = phase_rates(study, {"reward": 3.0}, flops_per_second=2.0, rates_file=rates)
    assert {p: r.flops_per_s for p, r in one.items()} == {
        "rollout": 2.0, "learning": 2.0, "reward": 3.0, "eval": 2.0}
    assert one["reward"].source == "--reward-flops-per-second"
    assert one["eval"].source == "--flops-per-second (one rate for every phase)"

    empty = load_study(smoke(tmp_path / "empty", device="cpu"))
    none = phase_rates(empty, rates_file=rates)
    assert none["rollout"].flops_per_s == 6.0
    assert none["eval"].flops_per_s is None
    assert none["eval"].source.startswith("no rate: give --eval-flops-per-second")
    assert "has no evaluation rate" in none["eval"].source


def test_training_split_and_hours_by_hand(tmp_path):
    """Each run charged its budget, split as its cell's worst-case cycle splits; hours = FLOPs
    / the phase's rate / 3600; the total adds the evaluation."""
    study = load_study(smoke(tmp_path))
    prompt = study.max_prompt_tokens()
    flops = train_phase_flops(study)
    full = {p: 0.0 for p in ("rollout", "learning", "reward")}
    for cell in study.grid_cells():
        c = cell_step_cost(study, cell.size, cell.alloc, cell.reward, prompt)
        cycle = c.rollout + c.reward + c.learning + (c.num_iterations - 1) * c.reuse_learning
        full["rollout"] += 1.6e10 * c.rollout / cycle
        full["reward"] += 1.6e10 * c.reward / cycle
        full["learning"] += 1.6e10 * (c.learning + (c.num_iterations - 1) * c.reuse_learning
                                      ) / cycle
    assert flops["full_grid"] == pytest.approx(full)
    planned = study_plan(study)
    assert sum(flops["full_grid"].values()) == pytest.approx(planned["full_grid"])
    assert sum(flops["pilot"].values()) == pytest.approx(planned["pilot"])
    assert flops["full_grid"]["reward"] > 0  # the rule+prm cells' PRM
    # validation: per reward and phase the largest shares of that reward's configs
    assert validation_per_reward(study) * len(study.rewards) == planned[
        "validation_runs_at_most"]
    assert sum(flops["validation"].values()) >= planned["validation_at_most"] * (1 - 1e-12)

    evaluation = eval_flops(study)
    rates = phase_rates(study, {"rollout": 1e9, "learning": 2e9, "reward": 4e9, "eval": 5e8})
    hours = study_hours(flops, evaluation, rates)
    for stage in ("pilot", "full_grid", "validation"):
        for p, rate in (("rollout", 1e9), ("learning", 2e9), ("reward", 4e9)):
            assert hours[stage][p] == pytest.approx(flops[stage][p] / rate / 3600)
    assert hours["evaluation"]["eval"] == pytest.approx(evaluation["total_at_most"] / 5e8 / 3600)
    assert hours["total"]["eval"] == hours["evaluation"]["eval"] > 0
    assert hours["total"]["rollout"] == pytest.approx(
        hours["full_grid"]["rollout"] + hours["validation"]["rollout"])
    # without an evaluation rate the total is not known, the training phases still are
    partial = study_hours(flops, evaluation, phase_rates(study, {"rollout": 1e9,
                                                                "learning": 2e9,
                                                                "reward": 4e9}))
    assert partial["total"]["eval"] is None and partial["total"]["learning"] > 0


def test_evaluation_flops_by_hand(tmp_path):
    """One size, one reward, one allocation: every target's generation (the shared pool once:
    max(k, bon_n); native_reward on sampled_pass1's pool) and the PRM's scoring, every
    completion at its cap; the study: cells x rungs + base policies + validation."""
    config = yaml.safe_load(smoke(tmp_path).read_text())
    config.update(sizes=["nano"], rewards={"rule+prm": config["rewards"]["rule+prm"]},
                  allocations={"base": config["allocations"]["base"]})
    config["eval"].update(k=4, bon_n=2)
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(config))
    study = load_study(path)
    e = study.eval
    arch = F.resolve_arch("nano")
    p, p_ood = 9, 2 + 3 * 2 + 3  # "19", three "+9" steps, "=?\n"; training prompts: 2 steps

    def gen(rows, prompt, new):
        return rows * F.generate_flops(arch, prompt, new)

    prm = 8 * 2 * F.reward_model_flops(arch, p + 24 + 1)  # bon_n samples, the PRM's "\n"
    native = 8 * 2 * F.reward_model_flops(arch, p + 24 + 1)  # the rule+prm reward's PRM
    snapshot = (gen(20, p, 24) + gen(20, p_ood, 40) + gen(8 * 2, p, 24)  # pass1s, sampled
                + gen(8 * 4, p, 24) + prm + native)  # the k = 4 pool serves bon_n = 2
    assert (e.n_in, e.sampled_prompts, e.sampled_k, e.native_prompts) == (20, 8, 2, 8)
    assert snapshot_eval_flops(study, "nano", "rule+prm", e.targets) == snapshot
    ev = eval_flops(study)  # the base policy's native reward: the first reward, rule+prm
    assert validation_per_reward(study) == 1  # one config: the baseline alone, for seed 1
    assert (ev["grid"], ev["base"], ev["validation_at_most"]) == (3 * snapshot, snapshot,
                                                                  snapshot)
    assert ev["total_at_most"] == ev["grid"] + ev["base"] + ev["validation_at_most"]
    unshared = {**config, "eval": {**config["eval"], "share_samples": False}}
    path.write_text(yaml.safe_dump(unshared))
    assert snapshot_eval_flops(load_study(path), "nano", "rule+prm", e.targets) == (
        snapshot + gen(8 * 2, p, 24) * 2)  # maj_k's and prm_bon's pools, native's own


def test_check_config_names_each_rate_and_its_source(tmp_path, capsys):
    path = smoke(tmp_path, device="cpu")
    study = load_study(path)
    finished_run(Path(study.results_dir), CELL, "cpu",
                 {"rollout": (100, 2), "learning": (300, 1), "reward": (40, 4)})
    rates = tmp_path / "rates.json"
    write_rates(rates, device="NVIDIA H200", measured="gpu_check.py", learning=5e12)
    assert main(["check-config", str(path), "--rollout-flops-per-second", "1.5e9",
                 "--rates", str(rates)]) == 0
    out = capsys.readouterr().out
    assert "  rollout (fused):    1.5e+09 — --rollout-flops-per-second\n" in out
    assert f"  learning:           5e+12 — rates file {rates} (NVIDIA H200)\n" in out
    assert f"  (rates file {rates}: gpu_check.py)\n" in out
    assert "  reward:             10 — measured: 1 finished run(s) in " in out
    assert "  evaluation:         no rate: give --eval-flops-per-second" in out
    assert "planned evaluation model FLOPs" in out
    assert "  evaluation <=  evaluation no rate = not known\n" in out
    assert "  total <=       rollout " in out and "evaluation no rate = not known\n" in out
    assert main(["check-config", str(path), "--flops-per-second", "1e9"]) == 0
    out = capsys.readouterr().out
    hours = [line for line in out.splitlines() if line.startswith("  total <=  ")]
    assert len(hours) == 1 and hours[0].endswith(" h")
    assert all(f"{label}:" in out for label in ("rollout (fused)", "learning", "reward",
                                                "evaluation"))
    rates.write_text("{}")
    assert main(["check-config", str(path), "--rates", str(rates)]) == 2
    assert "not a rates file" in capsys.readouterr().err
    assert set(PHASES) == {"rollout", "learning", "reward", "eval"}
