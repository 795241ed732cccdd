"""The reward model's reads priced from the step formatting (race.feedback.reads), on Qwen2.5's
real vocabulary: adversarial completions never cost the PRM more tokens than the bound, and
``race check-config`` and the trainer agree on every cell of both Qwen configs."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from race.feedback.reads import expansion, line_parts
from race.study.qwen_vocab import write_qwen25_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Sam has 12 coins, gets 3, then gives 4 away. How many now?\n"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """Qwen2.5's policy and Math-PRM tokenizers (the real vocabulary), saved and reloaded."""
    from race.data.tokenizer import load_tokenizer

    out = tmp_path_factory.mktemp("qwen")
    return {role: load_tokenizer(write_qwen25_tokenizer(out / role, role))
            for role in ("policy", "prm")}


@pytest.fixture(scope="module")
def prm(qwen, tmp_path_factory):
    """A tiny PRM in the Qwen2.5-Math-PRM layout on the real vocabulary, loaded as the trainer
    loads a reward's model (its reads measured against the policy's tokenizer)."""
    from race.feedback.loading import load_feedback_model
    from race.feedback.qwen_math import QwenMathPRMModule
    from race.policy.ladder import ladder_config

    folder = tmp_path_factory.mktemp("prm")
    write_qwen25_tokenizer(folder, "prm")
    torch.manual_seed(0)
    QwenMathPRMModule(ladder_config("nano", 152064, layers=1)).save_pretrained(folder)
    return load_feedback_model(str(folder), policy_tokenizer=qwen["policy"], device="cpu")


def test_line_parts_follow_split_steps():
    assert line_parts(" 12") == ([(" 12", "12", " 12", "12")], 0)
    # A run of newlines, however long, ends at most one line; blank middles end none.
    assert line_parts("\n" * 32)[1] == 1 and line_parts(" \n \n ")[1] == 1
    parts, ends = line_parts(".\nab\n")
    assert parts == [(".", "."), ("ab",), ("", "")] and ends == 2


def test_the_real_vocabulary_prices_what_split_steps_can_make(qwen):
    """A token of 32 newlines is one separator, not 32; the prompt, cut alike by both, is
    one PRM token per policy token."""
    e = expansion(qwen["policy"], qwen["prm"], "<extra_0>")
    assert e.prompt == 1 and 2 <= e.completion < 32
    newlines = qwen["policy"].convert_tokens_to_ids("Ċ" * 32)
    assert qwen["policy"].decode([newlines]) == "\n" * 32


def _adversaries(tok, cap: int) -> dict[str, list[int]]:
    """Completions of ``cap`` policy tokens built to cost the PRM the most."""
    vocab = tok.get_vocab()
    special = set(tok.all_special_ids)
    texts = {i: tok.decode([i]) for i in range(len(tok)) if i not in special}
    newline_runs = [i for i, t in texts.items() if t and set(t) == {"\n"}]
    spaces = max((i for i, t in texts.items() if t and set(t) == {" "}),
                 key=lambda i: len(texts[i]))
    digits = [vocab[d] for d in "0123456789"]
    line_ends = [i for i, t in texts.items() if "\n" in t and t.strip()]
    encoded = tok(list(texts.values()), add_special_tokens=False)["input_ids"]
    cost = {i: len(ids) for i, ids in zip(texts, encoded, strict=True)}
    longest = sorted(texts, key=lambda i: -cost[i])
    cut = [i for i, t in texts.items() if "\ufffd" in t]
    rng = torch.Generator().manual_seed(0)
    random_ids = torch.randint(0, 151643, (cap,), generator=rng).tolist()

    def fill(ids):
        return (ids * (cap // len(ids) + 1))[:cap]

    return {
        "all-newline tokens": fill(newline_runs),
        "longest whitespace token": fill([spaces]),
        "digits and newlines": fill([d for d in digits for d in (d, vocab["Ċ"])]),
        "separators' sources": fill(line_ends[:64]),
        "worst pieces at the cap": fill(longest[:16]),
        "worst pieces between newlines": fill([x for i in longest[:8] for x in (i, vocab["Ċ"])]),
        "cut characters": fill(cut[:64]),
        "random tokens": random_ids,
    }


def test_adversarial_completions_stay_within_the_bound(qwen, prm):
    """Each adversarial completion, formatted and tokenized as the PRM reads it, is at most
    ``reads.tokens(P, C)`` PRM tokens, and a scored batch's model FLOPs at most the bound."""
    policy = qwen["policy"]
    reads = prm.reads
    assert reads.template > 0 and reads.appended == 1 and reads.prompt_expansion == 1
    prompt_len = len(policy(PROMPT, add_special_tokens=False)["input_ids"])
    for cap in (8, 64):
        completions = {}
        for name, ids in _adversaries(policy, cap).items():
            text = policy.decode(ids, skip_special_tokens=True)
            encoded = prm._encode(PROMPT, text)
            used = 0 if encoded is None else len(encoded[0])
            assert used <= reads.tokens(prompt_len, cap), (name, cap, used)
            completions[name] = text
        prm.consume()
        prm.step_scores([PROMPT] * len(completions), list(completions.values()))
        spent = prm.consume()
        assert spent.model <= len(completions) * reads.row_flops(prompt_len, cap)


# --------------------------------------------------------------------------- check-config = trainer


def _hub_cache(root: Path, tokenizers: Path, ids: list[str]) -> None:
    """A Hugging Face cache holding each hub id's snapshot at ``main``: its config.json (the
    published architecture, race.flops.known_configs) and its tokenizer files, as a download
    leaves them (files linked, not copied: the tokenizer is the same for every Qwen2.5)."""
    from huggingface_hub.file_download import repo_folder_name

    from race.flops import known_configs

    for n, repo in enumerate(ids):
        commit = f"{n:040x}"
        folder = root / repo_folder_name(repo_id=repo, repo_type="model")
        snapshot = folder / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(commit)
        prm = repo in {f"Qwen/{name}" for name in known_configs.FEEDBACK}
        config = known_configs.config_dict(repo)
        config["architectures"] = ["Qwen2ForProcessRewardModel" if prm else "Qwen2ForCausalLM"]
        (snapshot / "config.json").write_text(json.dumps(config))
        for f in (tokenizers / ("prm" if prm else "policy")).iterdir():
            os.symlink(f, snapshot / f.name)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """The hub ids of both Qwen configs in a local cache, HF_HUB_CACHE pointed at it."""
    from race.study.config import load_study

    root = tmp_path_factory.mktemp("hub")
    for role in ("policy", "prm"):
        write_qwen25_tokenizer(root / "files" / role, role)
    ids = sorted({s for c in ("qwen2.5.yaml", "qwen2.5-1gpu.yaml")
                  for study in [load_study(ROOT / "configs" / c)]
                  for s in [*study.sizes, *(r.model for r in study.rewards.values() if r.model)]})
    _hub_cache(root / "cache", root / "files", ids)
    patch = pytest.MonkeyPatch()
    from huggingface_hub import constants

    patch.setattr(constants, "HF_HUB_CACHE", str(root / "cache"))
    patch.setattr(constants, "HF_HUB_OFFLINE", True)
    yield root / "cache"
    patch.undo()
    shutil.rmtree(root / "files", ignore_errors=True)


def _trainer_reads(reward, policy_tokenizer, monkeypatch):
    """The reward the trainer builds for ``reward`` (race.feedback.rewards.build_reward), its
    feedback model's weights on the meta device: a 7B checkpoint is not needed to read its
    tokenizer and config, which is all the bound reads."""
    from transformers import Qwen2Config

    from race.feedback import qwen_math
    from race.feedback.rewards import build_reward

    def from_config(cls, path, **_):
        with torch.device("meta"):
            return cls(Qwen2Config.from_pretrained(path))

    monkeypatch.setattr(qwen_math.QwenMathPRMModule, "from_pretrained",
                        classmethod(from_config))
    return build_reward({"device": "meta", **reward.to_dict()}, tokenizer=policy_tokenizer)


@pytest.mark.parametrize("config", ["qwen2.5-1gpu.yaml", "qwen2.5.yaml"])
def test_check_config_and_the_trainer_agree_on_every_cell(config, hub_cache, monkeypatch):
    """With the real vocabulary in the hub cache, ``race check-config``'s first-rung verdict
    (race.study.config.first_step_bound) equals the trainer's (race.grpo.run.MeteredRun), and
    both admit every cell."""
    from transformers import Qwen2Config

    from race.core.cells import Cell
    from race.data.tokenizer import load_tokenizer
    from race.flops.analytic import Arch
    from race.grpo.run import MeteredRun
    from race.study.builders import train_job
    from race.study.config import first_step_bound, load_study
    from race.study.plan import local_folder

    study = load_study(ROOT / "configs" / config)  # its checks pass: every cell is admitted
    prompt = study.max_prompt_tokens()
    first = study.budgets[0]
    for size in study.sizes:
        folder = local_folder(size, study.revisions)
        assert folder is not None and str(folder).startswith(str(hub_cache))
        tokenizer = load_tokenizer(folder)
        arch = Arch.from_config(Qwen2Config.from_pretrained(folder))
        for reward_name, spec in study.rewards.items():
            reward = _trainer_reads(spec, tokenizer, monkeypatch)
            if spec.model is not None:
                assert reward.reads.prompt_expansion == 1 and reward.reads.template > 0
            for alloc in study.allocations:
                job = train_job(study, Cell(size, reward_name, alloc, study.seeds[0]))
                trainer = MeteredRun(job, arch, reward, prompt).first_step_bound()
                planned = first_step_bound(study, size, alloc, reward_name, prompt)
                assert planned == trainer, (size, reward_name, alloc)
                assert trainer <= first, (size, reward_name, alloc, trainer, first)
