"""Reproducible references: a hub id loads at the revision the config pins, offline from the
hub cache; the commit it resolves to is part of a training run's fingerprint (a local folder's
fingerprint is what it always was); ``revisions:`` names only hub ids the config loads; jobs
carry their pins through JSON."""

import hashlib
import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from race.core import jobs
from race.core.errors import ConfigError
from race.core.jobs import EvalJob, TrainJob
from race.core.references import hub_references, pinned, resolve_commit, revision_of
from race.grpo.resume import (
    NOT_TRAJECTORY,
    REWARD_NOT_TRAJECTORY,
    _stamps,
    job_fingerprint,
    job_references,
)
from race.study import builders as B
from race.study.config import check_study, read_yaml, typed_study, validate_schema

ROOT = Path(__file__).resolve().parents[1]
HUB_ID = "org/tiny"
OLD, NEW = "1" * 40, "2" * 40  # two commits of HUB_ID; refs/main starts at OLD


@pytest.fixture(scope="module")
def commits(tmp_path_factory):
    """Two saved nano policies (different seeds) with the character tokenizer: one per
    commit."""
    from race.data.tokenizer import load_tokenizer, save_tokenizer
    from race.policy.ladder import build_ladder_model

    root = tmp_path_factory.mktemp("commits")
    tok = load_tokenizer(save_tokenizer(root / "tok"))
    for sha, seed in ((OLD, 0), (NEW, 1)):
        build_ladder_model("nano", tok, seed=seed).save_pretrained(root / sha)
        tok.save_pretrained(root / sha)
    return root


def _set_ref(cache: Path, repo: str, ref: str, sha: str) -> None:
    refs = cache / repo / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / ref).write_text(sha)


@pytest.fixture
def hub(commits, tmp_path, monkeypatch):
    """An offline hub cache holding HUB_ID at both commits, refs/main at OLD."""
    import shutil

    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    for sha in (OLD, NEW):
        shutil.copytree(commits / sha, cache / "models--org--tiny" / "snapshots" / sha)
    _set_ref(cache, "models--org--tiny", "main", OLD)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the environment once, at import: its constants are what counts.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # "org/tiny" must not be a folder of the working directory
    return cache


def _weight(model) -> float:
    return float(model.model.layers[0].self_attn.q_proj.weight.detach().sum())


# --------------------------------------------------------------------------- (a) loading


def test_a_pinned_hub_id_loads_from_the_cache_offline(hub, commits):
    from race.data.tokenizer import load_tokenizer
    from race.feedback.loading import resolve_model_dir
    from race.policy.ladder import load_policy

    old, new = (_weight(load_policy(commits / sha)) for sha in (OLD, NEW))
    assert old != new
    assert _weight(load_policy(HUB_ID)) == old  # unpinned: the default branch (refs/main)
    assert _weight(load_policy(HUB_ID, revision=NEW)) == new  # a commit
    _set_ref(hub, "models--org--tiny", "v2", NEW)
    assert _weight(load_policy(HUB_ID, revision="v2")) == new  # a tag
    with pinned({HUB_ID: NEW}):  # the process's pins, for loads several calls away
        assert _weight(load_policy(HUB_ID)) == new
        assert resolve_model_dir(HUB_ID) == hub / "models--org--tiny" / "snapshots" / NEW
    assert revision_of(HUB_ID) is None  # the pins end with the block
    assert resolve_model_dir(HUB_ID, revision=OLD).name == OLD
    tok = load_tokenizer(HUB_ID, revision=NEW)
    assert len(tok) == len(load_tokenizer(commits / NEW))
    assert tok("12+3=15").input_ids == load_tokenizer(commits / NEW)("12+3=15").input_ids
    with pytest.raises(OSError):  # a commit the cache does not hold: no silent fallback
        load_policy(HUB_ID, revision="3" * 40)


def test_a_revision_resolves_to_the_commit_the_cache_holds(hub):
    assert resolve_commit(HUB_ID) == resolve_commit(HUB_ID, "main") == OLD
    assert resolve_commit(HUB_ID, NEW) == NEW
    assert resolve_commit(HUB_ID, "v9") is None  # a tag never fetched
    assert resolve_commit(HUB_ID, "3" * 40) is None  # a commit never fetched
    assert resolve_commit("org/absent") is None
    assert hub_references([HUB_ID, "nano", None, "org/absent"], {HUB_ID: NEW}) == {
        HUB_ID: {"revision": NEW, "commit": NEW},
        "org/absent": {"revision": None, "commit": None}}


def test_a_hub_dataset_loads_at_its_pin_and_records_its_commit(hub, tmp_path, monkeypatch):
    from race.data.sources import write_task_data

    calls = []

    def load_dataset(name, config=None, split=None, revision=None, **kw):
        calls.append((name, split, revision))
        return [{"question": "1+1?", "answer": "so #### 2"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    _set_ref(hub, "datasets--org--gsm", "v1", NEW)
    (hub / "datasets--org--gsm" / "snapshots" / NEW).mkdir(parents=True)
    task = {"kind": "hf", "hf_id": "org/gsm", "hf_ood_id": "org/math"}
    write_task_data(task, str(tmp_path / "data"), {"org/gsm": "v1"})
    assert calls == [("org/gsm", "train", "v1"), ("org/gsm", "test", "v1"),
                     ("org/math", "test", None)]
    assert json.loads((tmp_path / "data" / "references.json").read_text()) == {
        "org/gsm": {"revision": "v1", "commit": NEW},
        "org/math": {"revision": None, "commit": None}}


# --------------------------------------------------------------------------- (b) fingerprint


def _job(tmp_path: Path, base: str, **kw) -> TrainJob:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=?\\n", "answer": "2"}\n')
    return TrainJob(base=base, train_data=str(data), run_dir=str(tmp_path / "run"),
                    rungs=[1e9], results_dir=str(tmp_path / "results"), **kw)


def test_the_fingerprint_follows_the_commit_of_a_hub_input(hub, tmp_path):
    job = _job(tmp_path, HUB_ID)
    before = job_fingerprint(job)
    assert job_fingerprint(job) == before  # nothing moved
    assert job_references(job) == {HUB_ID: {"revision": None, "commit": OLD}}
    _set_ref(hub, "models--org--tiny", "main", NEW)  # a new commit on the default branch
    assert job_fingerprint(job) != before
    assert job_references(job) == {HUB_ID: {"revision": None, "commit": NEW}}
    _set_ref(hub, "models--org--tiny", "main", OLD)
    assert job_fingerprint(job) == before
    # A pin is part of it (asked for, and resolved), and holds when the branch moves.
    pinned_job = replace(job, revisions={HUB_ID: OLD})
    assert job_fingerprint(pinned_job) != before
    at_old = job_fingerprint(pinned_job)
    _set_ref(hub, "models--org--tiny", "main", NEW)
    assert job_fingerprint(pinned_job) == at_old
    # The reward's hub PRM counts as the base does.
    prm = replace(job, reward=replace(job.reward, type="prm", prm=HUB_ID))
    moved = job_fingerprint(prm)
    _set_ref(hub, "models--org--tiny", "main", OLD)
    assert job_fingerprint(prm) != moved


def test_a_run_records_the_commits_it_trained_from(hub, tmp_path):
    """``train.json`` records each hub input's revision and commit; the rerun reuses the run
    while the pin resolves to the same commit."""
    from race.core.specs import Allocation, TaskSpec
    from race.data.task import write_splits
    from race.grpo.resume import reuse_finished
    from race.grpo.run import run_training

    write_splits(TaskSpec(n_train=40, n_eval_in=4, n_eval_ood=4), tmp_path / "data")
    alloc = Allocation(num_generations=2, prompts_per_step=1, max_completion_length=4,
                       lora_rank=2)
    job = TrainJob(base=HUB_ID, train_data=str(tmp_path / "data" / "train.jsonl"),
                   run_dir=str(tmp_path / "run"), rungs=[2e8], alloc=alloc, device="cpu",
                   results_dir=str(tmp_path / "results"), revisions={HUB_ID: "v2"})
    _set_ref(hub, "models--org--tiny", "v2", NEW)
    summary = run_training(job)
    recorded = json.loads((tmp_path / "run" / "train.json").read_text())
    assert recorded["references"] == summary["references"] == {
        HUB_ID: {"revision": "v2", "commit": NEW}}
    assert reuse_finished(job, tmp_path / "run") is not None
    _set_ref(hub, "models--org--tiny", "v2", OLD)  # the tag moved: another run
    assert reuse_finished(job, tmp_path / "run") is None


def test_a_local_folder_run_keeps_its_fingerprint(commits, tmp_path):
    """What a local input contributes is what it always did: the digest below is the one
    checkpoints written before references existed carry."""
    from race.flops.meter import FLOPS_CONVENTION

    job = _job(tmp_path, str(commits / OLD))
    fields = {k: v for k, v in json.loads(jobs.to_json(job)).items() if k not in NOT_TRAJECTORY}
    fields["reward"] = {k: v for k, v in fields["reward"].items()
                        if k not in REWARD_NOT_TRAJECTORY}
    stamps = [s for p in (Path(job.base), Path(job.train_data)) for s in _stamps(p)]
    payload = json.dumps({"job": fields, "inputs": stamps, "flops": FLOPS_CONVENTION},
                         sort_keys=True)
    assert "revisions" not in fields
    assert job_fingerprint(job) == hashlib.sha256(payload.encode()).hexdigest()
    assert job_references(job) == {}


# --------------------------------------------------------------------------- (c) the config


def _config(**revisions) -> dict:
    config = read_yaml(ROOT / "configs" / "smoke.yaml")
    config["eval"]["prm"] = "org/prm"  # a hub PRM of prm_bon
    config["revisions"] = revisions
    return config


def _study(config: dict):
    return check_study(typed_study(validate_schema(config)))


def test_revisions_pin_only_hub_ids_the_config_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert dict(_study(_config(**{"org/prm": "v1.0"})).revisions) == {"org/prm": "v1.0"}
    with pytest.raises(ConfigError, match=r"^revisions\.org/unused: not a hub id the config"):
        _study(_config(**{"org/unused": "main"}))
    with pytest.raises(ConfigError, match=r"^revisions\.nano: not a hub id"):
        _study(_config(nano="main"))
    (tmp_path / "org" / "local").mkdir(parents=True)
    config = _config(**{"org/local": "main"})
    config["eval"]["prm"] = "org/local"
    with pytest.raises(ConfigError, match=r"^revisions\.org/local: a local folder"):
        _study(config)
    with pytest.raises(ConfigError, match=r"^revisions\.org/prm: "):
        validate_schema(_config(**{"org/prm": "not a revision"}))


def test_only_a_pinned_dataset_reaches_the_data_rule():
    config = _config(**{"org/prm": "v1"})
    study = typed_study(validate_schema(config))
    assert study.data_slice() == study.slice("task")  # pinning a model reruns no data
    config["task"] = {"kind": "hf", "hf_id": "org/gsm"}
    config["revisions"]["org/gsm"] = "v2"
    study = typed_study(validate_schema(config))
    assert json.loads(study.data_slice())["revisions"] == {"org/gsm": "v2"}


# --------------------------------------------------------------------------- (d) jobs


def test_jobs_carry_their_pins_through_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = _study(_config(**{"org/prm": "v1"}))
    cell = study.grid_cells()[0]
    train, evaluate = B.train_job(study, cell), B.eval_job(study, cell)
    assert train.revisions == {}  # a ladder policy and a rule reward: nothing to pin
    assert evaluate.revisions == {"org/prm": "v1"}  # its prm_bon PRM
    assert "revisions" not in json.loads(jobs.to_json(train))  # the JSON it always had
    assert jobs.from_json(EvalJob, jobs.to_json(evaluate)) == evaluate
    hub_train = replace(_job(tmp_path, HUB_ID), revisions={HUB_ID: NEW})
    for text in (jobs.to_json(hub_train), jobs.params_json("train", hub_train)):
        assert json.loads(text)["revisions"] == {HUB_ID: NEW}
    assert jobs.from_json(TrainJob, jobs.to_json(hub_train)) == hub_train
