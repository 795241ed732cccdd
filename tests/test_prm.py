"""Feedback models: step labels, aggregation, FLOPs vs FlopCounterMode, the Qwen-Math adapter,
rewards, bad input, and a PRM training smoke test (tiny models, CPU, a few seconds each)."""

import json
import math
import random
import re
import shutil
import stat

import pytest
import torch
from safetensors import safe_open
from transformers import Qwen2Config, Qwen2ForSequenceClassification, Qwen2ForTokenClassification

from race.core.specs import PRM_AGGREGATES, PRMSpec, TaskSpec
from race.data.task import LINE_ERRORS, Problem, step_labels, verify, write_splits
from race.data.tokenizer import ALPHABET, build_tokenizer
from race.feedback.kind import QWEN_STEP_TOKEN
from race.feedback.loading import load_feedback_model, load_prm
from race.feedback.prm_data import (
    IGNORE_INDEX,
    Example,
    balance,
    corrupt,
    encode,
    error_metrics,
    labelled,
    positive_rate,
    prm_text,
    roc_auc,
    split_prompts,
    step_errors,
)
from race.feedback.prm_training import prm_train_flops
from race.feedback.qwen_math import QwenMathPRM, QwenMathPRMModule
from race.feedback.rewards import FeedbackReward, build_model_reward, combine
from race.feedback.scores import AGGREGATES, aggregate
from race.flops import analytic as F
from race.flops.counter import count_flops
from race.flops.meter import PhaseFlops
from race.policy.ladder import ladder_config

PROMPT = "17+8-5=?\n"
PROBLEM = Problem(17, (("+", 8), ("-", 5)))
GOOD = "17+8=25\n25-5=20\n#### 20"
BAD = "17+8=25\n25-5=21\n#### 21"  # wrong arithmetic in step 2, answer consistent with it


def _tiny_config(vocab: int, pad: int, layers: int = 1, **extra) -> Qwen2Config:
    return Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=256, pad_token_id=pad, tie_word_embeddings=False,
                       **extra)


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory, tokenizer):
    """Our on-disk PRM layout: a random-init 2-label token classifier + the char tokenizer."""
    path = tmp_path_factory.mktemp("prm")
    torch.manual_seed(1)
    config = ladder_config("nano", len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    config.num_labels = 2
    Qwen2ForTokenClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _qwen_math_tokenizer(alphabet: str = ALPHABET + "\\{}", template: str | None = None):
    tok = build_tokenizer(alphabet)
    tok.add_special_tokens({"additional_special_tokens": [QWEN_STEP_TOKEN]})
    if template:
        tok.chat_template = template
    return tok


def _save_qwen_math(path, tok) -> QwenMathPRMModule:
    torch.manual_seed(2)
    module = QwenMathPRMModule(_tiny_config(len(tok), tok.pad_token_id, layers=2))
    module.save_pretrained(path)
    tok.save_pretrained(path)
    return module


@pytest.fixture(scope="module")
def qwen_math_saved(tmp_path_factory):
    """(directory, the module that was saved there) of a tiny Qwen-Math-convention PRM."""
    path = tmp_path_factory.mktemp("qwen_math")
    return path, _save_qwen_math(path, _qwen_math_tokenizer()).eval()


@pytest.fixture(scope="module")
def qwen_math_dir(qwen_math_saved):
    return qwen_math_saved[0]


# --------------------------------------------------------------------------- data and labels


def test_labels_sit_on_the_separator_closing_each_line(tokenizer):
    example = labelled(PROBLEM, PROMPT, BAD, "sample")
    assert example.labels == (True, False, True)
    ids, targets = encode(tokenizer, example)
    text, n = prm_text(PROMPT, BAD)
    assert text == PROMPT + "17+8=25\n25-5=21\n#### 21\n" and n == 3  # separator appended
    newline = tokenizer.convert_tokens_to_ids("\n")
    lines_end = [i for i, t in enumerate(ids) if t == newline][1:]  # the prompt's own "\n" first
    assert lines_end[-1] == len(ids) - 1
    assert [targets[i] for i in lines_end] == [1, 0, 1]
    assert all(t == IGNORE_INDEX for i, t in enumerate(targets) if i not in lines_end)


def test_blank_lines_and_spaces_are_not_steps(tokenizer):
    messy = "17+8=25\n\n 25-5=20 \n#### 20\n\n"
    assert prm_text(PROMPT, messy)[0] == prm_text(PROMPT, GOOD)[0]
    assert labelled(PROBLEM, PROMPT, messy, "sample").labels == (True, True, True)
    assert labelled(PROBLEM, PROMPT, "  \n", "sample") is None  # nothing to label


def test_corruptions_are_wrong_and_balance_fills_the_rarer_class():
    rng = random.Random(0)
    spec = TaskSpec(n_train=50, n_eval_in=5, n_eval_ood=5)
    from race.data.task import make_splits

    problems = make_splits(spec)["train"]
    for p in problems:
        assert all(step_labels(p, p.solution))
        assert not all(step_labels(p, corrupt(p, rng)))
    pool = [(p, p.prompt, p.solution) for p in problems]
    good = [labelled(p, p.prompt, p.solution, "sample") for p in problems[:10]]
    wrong = [Example(p.prompt, "x", (False, False), "sample") for p in problems[:10]]
    added = balance(good, pool, random.Random(1), target=0.6, tolerance=0.1)
    assert added and {e.source for e in added} == {"corrupt"}
    assert positive_rate(good + added) <= 0.6 < positive_rate(good + added[:-1])
    added = balance(wrong, pool, random.Random(1), target=0.6, tolerance=0.1)
    assert {e.source for e in added} == {"reference"} and positive_rate(wrong + added) >= 0.6
    mixed = good[:3] + wrong[:3]  # inside the band: nothing added
    assert balance(mixed, pool, random.Random(1), target=positive_rate(mixed), tolerance=0.1) == []


def test_heldout_split_is_by_prompt_and_seeded():
    prompts = [f"{i}+1=?\n" for i in range(20)] * 3
    held = split_prompts(prompts, 0.25, seed=0)
    assert len(held) == 5 and held == split_prompts(prompts, 0.25, seed=0)
    assert held != split_prompts(prompts, 0.25, seed=1)


def test_auc_matches_the_rank_statistic_and_sklearn():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert roc_auc([0.5, 0.5], [0, 1]) == 0.5  # a tie counts one half
    assert math.isnan(roc_auc([0.2, 0.3], [1, 1]))
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    scores = [round(rng.random(), 1) for _ in range(300)]  # many ties
    labels = [int(rng.random() < s) for s in scores]
    assert roc_auc(scores, labels) == pytest.approx(sklearn.roc_auc_score(labels, scores))


def test_auc_per_error_family_on_known_scores():
    # correct steps score 0.9, 0.6, 0.5; operand steps 0.1, 0.2 (always below): AUC 1;
    # arithmetic steps 0.7, 0.5: of the 6 (correct, wrong) pairs the correct step ranks above
    # in 3 (0.9 > 0.7, 0.9 > 0.5, 0.6 > 0.5), ties in 1 (0.5 = 0.5): AUC 3.5/6;
    # truncated 0.95 (above every correct step): AUC 0; other families: no step, nan.
    scores = [0.9, 0.1, 0.6, 0.7, 0.2, 0.5, 0.5, 0.95]
    labels = [1, 0, 1, 0, 0, 1, 0, 0]
    errors = [None, "operand", None, "arithmetic", "operand", None, "arithmetic", "truncated"]
    got = error_metrics(scores, labels, errors)
    assert list(got) == list(LINE_ERRORS)
    assert got["operand"] == {"auc": 1.0, "steps": 2}
    assert got["arithmetic"] == {"auc": pytest.approx(3.5 / 6), "steps": 2}
    assert got["truncated"] == {"auc": 0.0, "steps": 1}
    for family in ("sign", "copy", "answer", "extra", "format"):
        assert got[family]["steps"] == 0 and math.isnan(got[family]["auc"])
    # The same numbers as the overall AUC restricted to correct + that family's steps.
    keep = [i for i, e in enumerate(errors) if e in (None, "arithmetic")]
    assert got["arithmetic"]["auc"] == roc_auc([scores[i] for i in keep],
                                               [labels[i] for i in keep])
    assert all(math.isnan(m["auc"]) for m in error_metrics([0.3], [0], ["sign"]).values())
    with pytest.raises(ValueError, match="errors"):
        error_metrics(scores, labels, errors[:-1])


def test_examples_carry_the_error_family_of_each_line():
    truncated = labelled(PROBLEM, PROMPT, "17+8=25\n#### 25", "sample")
    assert truncated.errors == (None, "truncated")
    bad = labelled(PROBLEM, PROMPT, BAD, "sample")
    assert bad.labels == (True, False, True) and bad.errors == (None, "arithmetic", None)
    assert step_errors([truncated, bad]) == [None, "truncated", None, "arithmetic", None]
    with pytest.raises(ValueError, match="labelled"):
        step_errors([Example(PROMPT, "x", (False,), "sample")])


# --------------------------------------------------------------------------- aggregation


aggregate_steps = aggregate  # FixedModel.score's argument shadows the name


def test_aggregation_rules_on_fixed_step_scores():
    scores = [0.9, 0.5, 0.8]
    assert aggregate(scores, "min") == 0.5
    assert aggregate(scores, "last") == 0.8
    assert aggregate(scores, "product") == pytest.approx(0.36)
    assert aggregate(scores, "mean") == pytest.approx(2.2 / 3)
    assert aggregate([0.4], "mean") == 0.4
    assert all(aggregate([], how) == 0.0 for how in ("min", "last", "product", "mean"))
    with pytest.raises(ValueError, match="aggregate"):
        aggregate(scores, "median")


def test_aggregate_names_agree_with_specs_and_schema():
    from race.core import schema

    assert AGGREGATES == PRM_AGGREGATES == ("min", "last", "product", "mean")
    assert tuple(schema.properties("rewards")["aggregate"]["enum"]) == AGGREGATES
    assert tuple(schema.properties("eval")["prm_aggregate"]["enum"]) == AGGREGATES


class FixedModel:
    """A feedback model with fixed step scores (the interface FeedbackReward needs)."""

    kind = "prm"

    def __init__(self, steps):
        self.steps = steps

    def score(self, prompts, completions, aggregate="min"):
        return [aggregate_steps(s, aggregate) for s in self.steps]

    def consume(self):
        return PhaseFlops(7, 9, 3)

    reads = "what the model reads"  # handed on as is by the reward


def test_rule_plus_prm_weighting_on_fixed_scores():
    steps = [[0.9, 0.2], [0.6, 0.7], []]
    completions = [GOOD, BAD, ""]
    answers = ["20", "20", "20"]
    reward = FeedbackReward(FixedModel(steps), "rule+prm", aggregate="min", weight=0.25)
    got = reward([PROMPT] * 3, completions, answer=answers)
    # rule = [1, 0, 0]; min = [0.2, 0.6, 0.0]; reward = 0.75 * rule + 0.25 * min
    assert got == pytest.approx([0.75 + 0.05, 0.15, 0.0])
    assert got == pytest.approx(combine([1, 0, 0], [0.2, 0.6, 0.0], 0.25))
    assert reward.__name__ == "rule+prm" and reward.reads == FixedModel.reads
    assert reward.consume() == PhaseFlops(7, 9, 3)
    rule_only = FeedbackReward(FixedModel(steps), "rule+prm", weight=0.0)
    assert rule_only([PROMPT] * 3, completions, answer=answers) == [1.0, 0.0, 0.0]
    assert rule_only.reads is None  # the PRM is not run at weight 0: nothing reserved
    prm = FeedbackReward(FixedModel(steps), "prm", aggregate="product")
    assert prm([PROMPT] * 3, completions) == pytest.approx([0.18, 0.42, 0.0])
    partial = FeedbackReward(FixedModel(steps), "rule+prm", aggregate="mean", weight=0.5)
    # rule = [1, 0, 0]; mean = [0.55, 0.65, 0.0]: partial credit for the wrong completion
    assert partial([PROMPT] * 3, completions, answer=answers) == pytest.approx(
        [0.775, 0.325, 0.0])
    with pytest.raises(ValueError, match="answer"):
        reward([PROMPT], [GOOD])
    with pytest.raises(ValueError, match="weight"):
        FeedbackReward(FixedModel(steps), "rule+prm", weight=1.5)


def test_prm_scores_count_only_for_a_completion_that_states_an_answer():
    # The step labels never mark a missing answer line, so a PRM scores "first step, then
    # stop" like a solution; the reward gives it nothing from the PRM.
    steps = [[0.9, 0.8], [0.9], [0.9]]
    completions = [GOOD, GOOD.split("\n")[0], "the answer is 20"]
    prm = FeedbackReward(FixedModel(steps), "prm", aggregate="min")
    assert prm([PROMPT] * 3, completions) == pytest.approx([0.8, 0.0, 0.0])
    partial = FeedbackReward(FixedModel(steps), "rule+prm", aggregate="mean", weight=0.5)
    assert partial([PROMPT] * 3, completions, answer=["20"] * 3) == pytest.approx(
        [0.5 + 0.5 * 0.85, 0.0, 0.0])
    # The math verifier reads the last number of free-form text as the answer.
    math_prm = FeedbackReward(FixedModel(steps), "prm", aggregate="min", verifier="math")
    assert math_prm([PROMPT] * 3, completions) == pytest.approx([0.8, 0.9, 0.9])
    orm = FeedbackReward(FixedModel(steps), "orm")  # an ORM reads the whole completion
    assert orm([PROMPT] * 3, completions) == pytest.approx([0.8, 0.9, 0.9])


# --------------------------------------------------------------------------- our PRM


def test_scores_are_probabilities_batched_like_unbatched(prm_dir):
    prm = load_prm(str(prm_dir))
    prompts = [PROMPT, "3+4=?\n", PROMPT, PROMPT]
    completions = [GOOD, "3+4=7\n#### 7", "", BAD + "\n"]
    batched = prm.step_scores(prompts, completions)
    assert [len(s) for s in batched] == [3, 2, 0, 3]
    assert all(0.0 < x < 1.0 for s in batched for x in s)
    alone = [prm.step_scores([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    for b, a in zip(batched, alone, strict=True):  # right padding: positions unchanged
        assert b == pytest.approx(a, abs=1e-5)
    assert prm.score(prompts, completions, aggregate="last") == pytest.approx(
        [s[-1] if s else 0.0 for s in batched])
    assert prm.score(prompts, completions, aggregate="mean") == pytest.approx(
        [sum(s) / len(s) if s else 0.0 for s in batched])
    # A last line without the separator is scored as if it had one.
    assert prm.step_scores([PROMPT], [BAD])[0] == pytest.approx(batched[3], abs=1e-6)


def test_step_score_is_the_softmax_at_each_separator(prm_dir, tokenizer):
    prm = load_prm(str(prm_dir))
    model = Qwen2ForTokenClassification.from_pretrained(prm_dir).eval()
    text, _ = prm_text(PROMPT, GOOD)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probs = model(input_ids=ids).logits.softmax(-1)[0, :, 1]
    newline = tokenizer.convert_tokens_to_ids("\n")
    want = [float(probs[i]) for i, t in enumerate(ids[0].tolist()) if t == newline][1:]
    assert prm.step_scores([PROMPT], [GOOD])[0] == pytest.approx(want, abs=1e-6)


def _triangle(arch: F.Arch, n: int) -> int:
    """The masked upper triangle of one row's attention block (both attention matmuls)."""
    return arch.layers * 2 * 2 * arch.heads * arch.head_dim * (n * n - n * (n + 1) // 2)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_reward_flops_match_flop_counter(prm_dir, impl):
    prm = load_feedback_model(str(prm_dir), attn_implementation=impl)
    prompts = [PROMPT, "3+4=?\n", PROMPT]
    completions = [GOOD, "3+4=7\n#### 7", "17+8=25\n#### 25"]
    with count_flops() as fc:
        prm.step_scores(prompts, completions)
    padded = prm.consume()
    assert padded.executed == pytest.approx(fc.total, rel=0.01)
    assert padded.executed == fc.total  # in fact exact
    lengths = [len(prm.tokenize(prm_text(p, c)[0])) for p, c in zip(prompts, completions,
                                                                    strict=True)]
    assert padded.tokens == sum(lengths)
    assert padded.model == sum(F.reward_model_flops(prm.arch, n, head="token") for n in lengths)
    assert padded.executed > padded.model
    # Without padding (one row) executed - model is exactly the masked attention triangle.
    with count_flops() as fc:
        prm.step_scores([PROMPT], [GOOD])
    single = prm.consume()
    assert single.executed == fc.total
    assert single.executed - single.model == _triangle(prm.arch, single.tokens)
    assert prm.consume() == PhaseFlops(0, 0, 0)  # consume resets


def test_bound_covers_a_worst_case_call(prm_dir, tokenizer):
    reward = build_model_reward({"type": "prm", "prm": str(prm_dir)}, tokenizer=tokenizer)
    prompt, completion = "12+13+1=?\n", "12+13=25\n25+1=26\n#### 26"
    rows = 3
    reward([prompt] * rows, [completion] * rows)
    spent = reward.consume()
    bound = rows * reward.reads.row_flops(len(prompt), len(completion))
    assert spent.model <= bound
    assert bound == rows * F.reward_model_flops(reward.model.arch, len(prompt) + len(completion)
                                                + 1, head="token")


def test_empty_completions_score_zero_and_cost_nothing(prm_dir):
    prm = load_prm(str(prm_dir))
    assert prm.score([PROMPT, PROMPT], ["", " \n\n"]) == [0.0, 0.0]
    assert prm.step_scores([PROMPT], [""]) == [[]]
    assert prm.consume() == PhaseFlops(0, 0, 0)


def test_ladder_name_resolves_under_results_dir(prm_dir, tmp_path, tokenizer):
    shutil.copytree(prm_dir, tmp_path / "prm" / "size~nano")
    reward = build_model_reward({"type": "prm", "prm": "nano", "aggregate": "last"},
                                tokenizer=tokenizer, results_dir=str(tmp_path))
    assert reward.__name__ == "prm"
    direct = load_prm(str(prm_dir)).score([PROMPT], [GOOD], aggregate="last")
    assert reward(prompts=[PROMPT], completions=[GOOD], answer=["20"],
                  completion_ids=[[1]]) == pytest.approx(direct)
    with pytest.raises(FileNotFoundError, match="race prm --config CONFIG --cell size~micro"):
        load_prm("micro", results_dir=str(tmp_path))


def test_rule_plus_prm_through_the_config_entry(prm_dir, tokenizer):
    reward = build_model_reward({"type": "rule+prm", "prm": str(prm_dir), "weight": 0.3},
                                tokenizer=tokenizer)
    prm = load_prm(str(prm_dir))
    completions = [GOOD, BAD]
    rule = [float(verify(c, "20")) for c in completions]
    want = [0.7 * r + 0.3 * s for r, s in zip(rule, prm.score([PROMPT] * 2, completions),
                                              strict=True)]
    assert reward([PROMPT] * 2, completions, answer=["20", "20"]) == pytest.approx(want)


# --------------------------------------------------------------------------- bad input


def test_uncovered_vocabulary_fails_at_load_and_at_call(tmp_path, tokenizer):
    narrow = build_tokenizer("0123456789+-=?# \n")  # no letters, no "*"
    config = _tiny_config(len(narrow), narrow.pad_token_id)
    config.num_labels = 2
    Qwen2ForTokenClassification(config).save_pretrained(tmp_path)
    narrow.save_pretrained(tmp_path)
    # At load: the policy's vocabulary (the full alphabet) is probed.
    with pytest.raises(ValueError, match=r"feedback model .*: its tokenizer does not cover the "
                                         r"policy's text: '\*' maps to the unknown token"):
        load_feedback_model(str(tmp_path), policy_tokenizer=tokenizer)
    # At call time: the task probe alone passes at load, the completion's "x" does not.
    prm = load_feedback_model(str(tmp_path))
    assert prm.name == str(tmp_path) and len(prm.score([PROMPT], [GOOD])) == 1
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path))}.*'x'"):
        prm.score([PROMPT], ["17+8=25x\n#### 25"])


def test_unknown_hub_id_offline_fails_clearly(monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"not a local directory.*hf download"):
        load_prm("no-such-org/no-such-prm")
    with pytest.raises(FileNotFoundError, match="not a PRM ladder name"):
        load_prm("/no/such/dir")


def test_spec_validation_errors(prm_dir):
    with pytest.raises(ValueError, match="needs the 'prm' key"):
        build_model_reward({"type": "prm"})
    with pytest.raises(ValueError, match="aggregate"):
        build_model_reward({"type": "prm", "prm": str(prm_dir), "aggregate": "median"})
    with pytest.raises(TypeError, match="unknown feedback-model option"):
        load_feedback_model(str(prm_dir), temperature=2)


# --------------------------------------------------------------------------- Qwen-Math PRM


def test_qwen_math_checkpoint_uses_the_official_key_names(qwen_math_dir):
    with safe_open(str(qwen_math_dir / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias",
            "model.embed_tokens.weight", "model.norm.weight"} <= keys
    assert all(k.startswith(("model.", "score.")) for k in keys)
    config = json.loads((qwen_math_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForProcessRewardModel"]


def test_a_qwen_math_prm_is_saved_with_the_umask(tmp_path, umask_002):
    """safetensors writes 0600; the PRM (the stand-ins' layout) comes out 0664 under umask 002."""
    _save_qwen_math(tmp_path, _qwen_math_tokenizer())
    assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == 0o664


def test_qwen_math_scores_equal_a_manual_computation(qwen_math_saved):
    qwen_math_dir, module = qwen_math_saved  # the module as it was before saving
    prm = load_feedback_model(str(qwen_math_dir), attn_implementation="eager")
    assert isinstance(prm, QwenMathPRM) and not prm.chat
    tok = prm.tokenizer
    sep = tok.convert_tokens_to_ids(QWEN_STEP_TOKEN)
    completions = [GOOD, "17+8=25\n#### 25", ""]
    got = prm.step_scores([PROMPT] * 3, completions)
    for completion, scores in zip(completions[:2], got, strict=False):
        body = "".join(line + QWEN_STEP_TOKEN for line in completion.split("\n"))
        ids = tok(PROMPT + body, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            probs = module(ids).logits.softmax(-1)[0, :, 1]
        want = [float(probs[i]) for i, t in enumerate(ids[0].tolist()) if t == sep]
        assert len(want) == len(completion.split("\n")) and scores == pytest.approx(want,
                                                                                     abs=1e-6)
        assert all(0.0 < s < 1.0 for s in scores)
    assert got[2] == []


def test_qwen_math_flops_match_flop_counter(qwen_math_dir):
    prm = load_feedback_model(str(qwen_math_dir), attn_implementation="eager")
    with count_flops() as fc:
        prm.step_scores([PROMPT, "3+4=?\n"], [GOOD, "3+4=7\n#### 7"])
    spent = prm.consume()
    assert spent.executed == pytest.approx(fc.total, rel=0.01)
    assert spent.model < spent.executed


def test_qwen_math_chat_template_conversation(tmp_path):
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                "{% endfor %}")
    _save_qwen_math(tmp_path, _qwen_math_tokenizer(template=template))
    prm = load_feedback_model(str(tmp_path))
    assert prm.chat
    text, n = prm._format(PROMPT, GOOD)
    assert n == 3 and text.startswith("system: Please reason step by step")
    assert text.count(QWEN_STEP_TOKEN) == 3 and f"user: {PROMPT}" in text
    assert len(prm.step_scores([PROMPT], [GOOD])[0]) == 3
    assert prm.template_tokens > 0


def _two_digit_tokenizer():
    """A policy tokenizer whose numbers 10-99 are single tokens: one policy token can become
    two characters of a character-level feedback model."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<pad>", "<unk>", "<eos>", *dict.fromkeys(ALPHABET),
              *(str(n) for n in range(10, 100))]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(pieces)},
                                      unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d\d|[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>")


def test_bound_covers_a_prm_that_reads_more_tokens_than_the_policy(tmp_path):
    """The budget stop's reward bound when the PRM tokenizes differently: a two-digit policy
    token is two PRM tokens (expansion 2), and the PRM's chat template adds its own tokens; a
    call on the worst rows (all two-digit numbers) stays within the bound."""
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    _save_qwen_math(tmp_path, _qwen_math_tokenizer(template=template))
    policy = _two_digit_tokenizer()
    reward = build_model_reward({"type": "prm", "prm": str(tmp_path)}, tokenizer=policy)
    assert reward.reads.expansion == 2 and reward.model.template_tokens > 0
    prompt, completion = "17+18+11=?\n", "17+18=35\n35+11=46\n#### 46"
    lengths = [len(policy(t, add_special_tokens=False)["input_ids"]) for t in (prompt, completion)]
    assert lengths == [8, 18]  # 11 and 26 PRM characters: more PRM tokens than policy tokens
    rows = 3
    reward([prompt] * rows, [completion] * rows)
    spent = reward.consume()
    assert 0 < spent.model <= rows * reward.reads.row_flops(*lengths)
    # The same call bounded as if the PRM read the policy's tokens would be too low.
    same = rows * reward.model.ledger.row_flops(sum(lengths) + 1)
    assert spent.model > same


def test_qwen_math_without_step_token_fails_at_load(tmp_path):
    tok = build_tokenizer()  # no <extra_0>
    QwenMathPRMModule(_tiny_config(len(tok), tok.pad_token_id)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no step separator token '<extra_0>'"):
        load_prm(str(tmp_path))


def test_qwen_math_missing_head_fails_at_load(tmp_path, qwen_math_dir):
    from safetensors.torch import load_file, save_file

    shutil.copytree(qwen_math_dir, tmp_path / "m")
    state = load_file(str(tmp_path / "m" / "model.safetensors"))
    del state["score.2.bias"]
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(ValueError, match="score"):
        load_prm(str(tmp_path / "m"))


# --------------------------------------------------------------------------- ORM


def test_orm_score_is_the_sigmoid_of_its_logit(tmp_path, tokenizer):
    config = _tiny_config(len(tokenizer), tokenizer.pad_token_id, num_labels=1)
    torch.manual_seed(3)
    model = Qwen2ForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reward = build_model_reward({"type": "orm", "orm": str(tmp_path)}, tokenizer=tokenizer)
    completions = [GOOD, "3+4=7", ""]
    prompts = [PROMPT, "3+4=?\n", PROMPT]
    with count_flops() as fc:
        got = reward(prompts, completions)
    for p, c, g in zip(prompts[:2], completions[:2], got, strict=False):
        ids = tokenizer(p + c, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            want = torch.sigmoid(model(input_ids=ids).logits[0, 0]).item()
        assert g == pytest.approx(want, abs=1e-6)
    assert got[2] == 0.0
    spent = reward.consume()
    assert spent.executed == fc.total and spent.model < spent.executed
    with pytest.raises(ValueError, match="not usable as a prm reward"):
        build_model_reward({"type": "prm", "prm": str(tmp_path)})


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_prm_training_flops_match_flop_counter(tokenizer, impl):
    config = _tiny_config(len(tokenizer), tokenizer.pad_token_id, num_labels=2)
    config._attn_implementation = impl
    model = Qwen2ForTokenClassification(config).train()
    ids = torch.randint(4, len(tokenizer), (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # one padded row
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 5] = 1
    with count_flops() as fc:
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    arch = F.Arch.from_config(config)
    executed = 3 * prm_train_flops(arch, 11, "full" if impl == "eager" else "sdpa")
    assert fc.total == pytest.approx(executed, rel=0.01)
    assert prm_train_flops(arch, 8) < prm_train_flops(arch, 11, "full")


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, tokenizer):
    """Task data and one random-init nano base policy (its samples are junk: mistakes)."""
    from race.policy.ladder import build_ladder_model

    root = tmp_path_factory.mktemp("study")
    write_splits(TaskSpec(n_train=60, n_eval_in=5, n_eval_ood=5), root / "data")
    policy = build_ladder_model("nano", tokenizer, seed=0)
    policy.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    return root


TINY = {"n_prompts": 16, "samples_per_prompt": 2, "max_new_tokens": 20, "steps": 4,
        "batch_size": 4, "heldout_frac": 0.25, "seed": 3}


def test_prm_training_smoke_cli_and_determinism(tiny_study, tmp_path, umask_002):
    from race.cli import main
    from race.core.jobs import PrmJob, PrmSamplesJob, to_json
    from race.feedback.prm_sampling import settings_of
    from race.feedback.prm_training import read_examples, train_prm

    out = tmp_path / "prm" / "size~nano"
    job = PrmJob(size="nano", policies=[str(tiny_study / "base")],
                 data_dir=str(tiny_study / "data"), out_dir=str(out),
                 spec=PRMSpec.from_config({"sizes": ["nano"], **TINY}))
    assert main(["prm", "--job", to_json(job)]) == 0
    record = json.loads((out / "prm.json").read_text())
    for name in ("model.safetensors", "config.json", "tokenizer.json", "samples.jsonl"):
        assert (out / name).is_file()
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o664  # umask 002
    assert record["phase"] == "pre" and record["size"] == "nano"
    assert record["spec"] == {**vars(PRMSpec()), **TINY}
    assert record["flops"]["sampling"]["model_flops"] > 0
    training = record["flops"]["training"]
    assert 0 < training["model_flops"] <= training["executed_flops"]
    assert record["model_flops"] == training["model_flops"] + record["flops"]["sampling"][
        "model_flops"]
    assert record["examples"]["heldout"] > 0 and record["heldout"]["all"]["steps"] > 0
    # Per error family: AUC (None without steps) and count, next to the overall AUC.
    assert set(record["auc_by_error"]) == set(record["steps_by_error"]) == set(LINE_ERRORS)
    assert sum(record["steps_by_error"].values()) == round(
        record["steps"] * (1 - record["positive_rate"]))
    for family, n in record["steps_by_error"].items():
        assert record["heldout"]["sampled_by_error"][family]["steps"] == n
        auc = record["auc_by_error"][family]
        assert (auc is None) if n == 0 or record["positive_rate"] == 0 else 0 <= auc <= 1
    assert set(record["heldout"]["all_by_error"]) == set(LINE_ERRORS)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    held = {s["prompt"] for s in samples if s["split"] == "heldout"}
    assert all(len(s["errors"]) == len(s["labels"]) for s in samples)
    assert all((e is None) == bool(y) for s in samples for e, y in zip(s["errors"], s["labels"],
                                                                       strict=True))
    assert held and not held & {s["prompt"] for s in samples if s["split"] == "train"}
    # what bench/calibration/prm_draws.py --score-with reads
    heldout = read_examples(out / "samples.jsonl")
    assert len(heldout) == record["examples"]["heldout"]
    assert {e.prompt for e in heldout} == held
    # The trained PRM loads by ladder name and scores.
    prm = load_prm("nano", results_dir=str(tmp_path))
    assert len(prm.score([PROMPT], [GOOD])) == 1
    # The study's way: the samples drawn once (race prm-samples), then read by the PRM job.
    # The same samples give the same PRM, bit for bit; the sampling's FLOPs are counted in
    # samples.json alone.
    policies, spec = [str(tiny_study / "base")], PRMSpec(**TINY)
    drawn = tmp_path / "samples"
    samples_job = PrmSamplesJob(policies=policies, data_dir=str(tiny_study / "data"),
                                out_dir=str(drawn), **settings_of(spec))
    assert main(["prm-samples", "--job", to_json(samples_job)]) == 0
    sampled = json.loads((drawn / "samples.json").read_text())
    assert {k: sampled[k] for k in ("model_flops", "executed_flops", "tokens")} == record[
        "flops"]["sampling"]
    again = train_prm("nano", policies, tiny_study / "data", tmp_path / "again", spec,
                      samples=drawn)
    for key in ("auc", "accuracy", "final_loss", "examples"):
        assert again[key] == record[key] or (key == "auc" and record[key] is None)
    assert again["flops"] == {"training": record["flops"]["training"]}
    assert again["model_flops"] == training["model_flops"] and again["samples"] == str(drawn)
    assert ((out / "model.safetensors").read_bytes()
            == (tmp_path / "again" / "model.safetensors").read_bytes())
    # Samples drawn with other settings are refused, naming the folder and the setting.
    with pytest.raises(ValueError, match=r"samples .*drawn with settings"):
        train_prm("nano", policies, tiny_study / "data", tmp_path / "other",
                  PRMSpec(**{**TINY, "seed": 4}), samples=drawn)


def test_prm_spec_from_config():
    spec = PRMSpec.from_config({"sizes": ["nano"], "steps": 7})
    assert spec.steps == 7 and spec == PRMSpec(steps=7)
    with pytest.raises(ValueError, match="unknown key"):
        PRMSpec.from_config({"stepz": 7})
    with pytest.raises(ValueError, match="batch_size"):
        PRMSpec(batch_size=0)


def test_prm_starts_from_a_given_backbone(tiny_study, tokenizer, tmp_path):
    """``backbone``: the PRM's weights come from that checkpoint (not the sampling policies'),
    and a checkpoint of another architecture is an error, never a silent random init."""
    from safetensors.torch import load_file

    from race.feedback.prm_training import train_prm
    from race.policy.ladder import build_ladder_model

    other = tmp_path / "other"
    build_ladder_model("nano", tokenizer, seed=1).save_pretrained(other)
    policies, data = [str(tiny_study / "base")], tiny_study / "data"
    # A vanishing learning rate: the trained PRM's backbone is its initial one.
    spec = PRMSpec(**{**TINY, "learning_rate": 1e-12})
    record = train_prm("nano", policies, data, tmp_path / "prm", spec, backbone=other)
    assert record["init"] == str(other) and record["spec"]["init"] == "base"
    key = "model.embed_tokens.weight"
    trained = load_file(tmp_path / "prm" / "model.safetensors")[key]
    assert torch.allclose(trained, load_file(other / "model.safetensors")[key], atol=1e-6)
    assert not torch.allclose(trained, load_file(tiny_study / "base" / "model.safetensors")[key])
    assert train_prm("nano", policies, data, tmp_path / "own", spec)["init"] == policies[0]

    micro = tmp_path / "micro"
    build_ladder_model("micro", tokenizer, seed=0).save_pretrained(micro)
    with pytest.raises(ValueError, match="no base policy of size 'nano'"):
        train_prm("nano", policies, data, tmp_path / "bad", spec, backbone=micro)
