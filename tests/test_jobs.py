"""Typed jobs: one builder per verb, the same job from the workflow and from a human, JSON
round trips, and errors that name the bad cell or rung."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from race.core import cells as C
from race.core import jobs
from race.study import builders as B
from race.study.config import check_study, load_study, typed_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke():
    return load_study(ROOT / "configs" / "smoke.yaml")


def test_every_job_round_trips_through_json(smoke):
    cell = smoke.grid_cells()[0]
    built = [B.train_job(smoke, cell), B.eval_job(smoke, cell),
             B.base_eval_job(smoke, "nano"), B.pretrain_job(smoke, "micro"),
             B.prm_job(smoke, "nano")]
    for job in built:
        assert jobs.from_json(type(job), jobs.to_json(job)) == job
        # The wire format is dataclasses.asdict's, built without its deep copy, except that
        # a reward entry holds only the keys it sets (RewardSpec.to_dict: the entry as written
        # plus the schema's defaults), and a field of OMIT_DEFAULT at its default is left
        # out (a spec's too: eval.engine unset).
        plain = {k: v for k, v in asdict(job).items() if not jobs.omitted(job, k)}
        if "spec" in plain:
            plain["spec"] = {k: v for k, v in plain["spec"].items()
                             if not jobs.omitted(job.spec, k)}
        if getattr(job, "reward", None) is not None:
            plain["reward"] = job.reward.to_dict()
            assert None not in plain["reward"].values()
        assert jobs.to_json(job) == json.dumps(plain, sort_keys=True)


def test_a_human_gets_the_workflows_job(smoke):
    cell = smoke.grid_cells()[-1]
    assert B.job_for_cell("train", smoke, cell.key) == B.train_job(smoke, cell)
    assert B.job_for_cell("evaluate", smoke, cell.key) == B.eval_job(smoke, cell)
    assert B.job_for_cell("evaluate", smoke, "size~nano") == B.base_eval_job(smoke, "nano")
    assert B.job_for_cell("pretrain", smoke, "size~micro") == B.pretrain_job(smoke, "micro")
    assert B.job_for_cell("prm", smoke, "size~nano") == B.prm_job(smoke, "nano")
    one = B.job_for_cell("evaluate", smoke, cell.key, budget=8e9)
    assert [s.out for s in one.snapshots] == [
        str(C.rung_dir(smoke.run_dir(cell), 8e9) / "eval.json")]


def test_one_evaluation_job_per_cell_covers_its_rungs(smoke):
    grid = smoke.grid_cells()[0]
    job = B.eval_job(smoke, grid)
    assert [s.adapter for s in job.snapshots] == [
        str(C.rung_dir(smoke.run_dir(grid), b)) for b in smoke.budgets]
    assert job.spec.train_temperature == smoke.training.temperature
    assert job.prm == smoke.prm_dir("nano")
    # The cell's reward entry, every key at the config's value (the schema adds defaults).
    written = smoke.config["rewards"][grid.reward]
    assert {k: job.reward.to_dict()[k] for k in written} == written
    validation_only = C.Cell(grid.size, grid.reward, grid.alloc, 1)
    assert [s.out for s in B.eval_job(smoke, validation_only).snapshots] == [
        str(C.rung_dir(smoke.run_dir(validation_only), smoke.validation_budget())
            / "eval.json")]


def test_search_targets_only_at_the_top_rung(smoke):
    config = typed_study({**smoke.config, "eval": {**smoke.config["eval"],
                                                   "search_at": "base_and_top"}})
    cell = config.grid_cells()[0]
    snapshots = B.eval_job(config, cell).snapshots
    below = [t for t in smoke.eval.targets if t not in ("maj_k", "prm_bon")]
    assert [s.targets for s in snapshots] == [below] * (len(smoke.budgets) - 1) + [None]
    one = B.job_for_cell("evaluate", config, cell.key, budget=smoke.budgets[0])
    assert one.snapshots[0].targets == below
    assert all(s.targets is None for s in B.eval_job(smoke, cell).snapshots)
    assert B.base_eval_job(config, cell.size).snapshots[0].targets is None
    bad = {**config.config, "race": {**config.config["race"], "targets": ["maj_k"]}}
    with pytest.raises(C.ConfigError, match=r"race.targets\[0\]: maj_k runs only at the top"):
        check_study(typed_study(bad))


@pytest.mark.parametrize("verb, key, budget, message", [
    ("train", "size~nano/reward~rule/alloc~nope/seed~0", None, "allocation 'nope'"),
    ("train", "size~nano/reward~rule", None, "missing ['alloc', 'seed']"),
    ("train", "size~nano/reward~rule/alloc~base/seed~7", None, "seed '7' is neither"),
    ("train", "size~nano/reward~rule/alloc~base/seed~0", 4e9, "--budget applies to evaluate"),
    ("evaluate", "size~nano/reward~rule/alloc~base/seed~0", 5e9, "not an evaluated rung"),
    ("evaluate", "size~nano", 4e9, "a base policy has no budget rungs"),
    ("pretrain", "size~mini", None, "a ladder size of the config"),
    ("prm", "size~micro", None, "a ladder PRM size of the config"),
])
def test_bad_cells_name_what_is_wrong(smoke, verb, key, budget, message):
    with pytest.raises(C.ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        B.job_for_cell(verb, smoke, key, budget)


def test_jobs_carry_dtype_not_threads(smoke):
    """training.dtype is in the train and eval jobs; threads are the rule's (--threads), so a
    change of resources.*.threads changes no job and reruns nothing."""
    raw = smoke.config
    config = typed_study({**raw, "training": {**raw["training"], "dtype": "bfloat16"},
                          "resources": {**raw["resources"], "train": {
                              **raw["resources"]["train"], "threads": 4}}})
    cell = config.grid_cells()[0]
    assert B.train_job(config, cell).dtype == "bfloat16"
    assert B.eval_job(config, cell).dtype == "bfloat16"
    assert jobs.to_json(B.train_job(config, cell)) == jobs.to_json(B.train_job(
        typed_study({**config.config, "resources": raw["resources"]}), cell))


def test_evaluation_and_prm_sampling_decode_with_the_configured_engine(smoke):
    """eval.engine unset: evaluation, base-policy evaluation and PRM sampling decode with
    training.rollout_engine (never null: the schema's default is peft); eval.engine names
    another. A job at its default engine keeps the JSON it had before the engines were
    configurable (a train job with peft, an evaluation or PRM-sampling job with fused), so an
    existing study reruns nothing."""
    raw = smoke.config

    def decoders(config):
        cell = config.grid_cells()[0]
        built = [B.eval_job(config, cell), B.base_eval_job(config, cell.size),
                 B.prm_samples_job(config)]
        for job in built:
            assert jobs.from_json(type(job), jobs.to_json(job)) == job
        return built, B.train_job(config, cell)

    built, train = decoders(smoke)
    assert smoke.training.rollout_engine == train.rollout_engine == "fused"
    assert [j.engine for j in built] == ["fused"] * 3
    assert not any('"engine"' in jobs.to_json(j) for j in built)
    assert '"rollout_engine": "fused"' in jobs.to_json(train)
    unset = typed_study({**raw, "training": {k: v for k, v in raw["training"].items()
                                             if k != "rollout_engine"}})
    built, train = decoders(unset)
    assert train.rollout_engine == "peft" and "rollout_engine" not in jobs.to_json(train)
    assert [j.engine for j in built] == ["peft"] * 3
    assert all('"engine": "peft"' in jobs.to_json(j) for j in built)
    merged = typed_study({**raw, "training": {**raw["training"], "rollout_engine": "merged"}})
    assert [j.engine for j in decoders(merged)[0]] == ["merged"] * 3
    chosen = typed_study({**merged.config, "eval": {**raw["eval"], "engine": "static"}})
    built, train = decoders(chosen)
    assert [j.engine for j in built] == ["static"] * 3 and train.rollout_engine == "merged"
    with pytest.raises(C.ConfigError, match="eval.engine"):
        typed_study({**raw, "eval": {**raw["eval"], "engine": "vllm"}})


@pytest.mark.parametrize("live", [False, True])
def test_run_options_travel_apart_from_the_job(smoke, live):
    """The rule's params hold the job less its run options (a change of those would rerun
    it); the options JSON the rule passes beside it restores the very job a human gets."""
    config = typed_study({**smoke.config, "mlflow": {
        **smoke.config["mlflow"], "live": live, "tracking_uri": "http://127.0.0.1:5000"}})
    cell = config.grid_cells()[0]
    job = B.train_job(config, cell)
    assert (job.mlflow is not None) == live
    params = json.loads(jobs.params_json("train", job))
    assert not set(jobs.RUN_OPTIONS["train"]) & set(params)
    rebuilt = jobs.with_run_options("train", jobs.from_json(jobs.TrainJob,
                                                            jobs.params_json("train", job)),
                                    B.run_options_json("train", config))
    assert rebuilt == job == B.job_for_cell("train", config, cell.key)
    # Editing a run option leaves the params as they were.
    faster = typed_study({**config.config, "training": {**config.config["training"],
                                                        "save_every": 3}})
    assert jobs.params_json("train", B.train_job(faster, cell)) == jobs.params_json(
        "train", job)
    # So does the step limit race train checks its budget against: a run option, passed
    # only when the study sets it.
    limited = typed_study({**config.config, "max_steps_per_run": 10**7})
    assert jobs.params_json("train", B.train_job(limited, cell)) == jobs.params_json(
        "train", job)
    assert "max_steps_per_run" not in B.run_options_json("train", config)
    assert jobs.with_run_options("train", job, B.run_options_json(
        "train", limited)) == B.train_job(limited, cell)
    assert jobs.params_json("evaluate", B.eval_job(config, cell)) == jobs.to_json(
        B.eval_job(config, cell))
    with pytest.raises(ValueError, match=r"not a run option of race train: \['seed'\]"):
        jobs.with_run_options("train", job, '{"seed": 3}')
    # Nor does any rule's config slice hold them (the tables, the mirror, the report).
    every = list(limited.config)
    assert all(typed_study({**limited.config, **edit}).slice(*every) == limited.slice(*every)
               for edit in ({"max_steps_per_run": 10**6},
                            {"training": {**limited.config["training"], "save_every": 7}},
                            {"mlflow": {**limited.config["mlflow"], "live": not live}}))
    sliced = json.loads(limited.slice(*every))
    assert "save_every" not in sliced["training"] and "live" not in sliced["mlflow"]
    assert "max_steps_per_run" not in sliced and sliced["training"] and sliced["mlflow"]
