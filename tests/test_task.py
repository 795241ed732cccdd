import json

import pytest

from race.core.specs import TaskSpec
from race.data.task import (
    LINE_ERRORS,
    Problem,
    extract_answer,
    line_errors,
    load_jsonl,
    make_splits,
    problem_of,
    step_labels,
    verify,
    verify_math,
    write_jsonl,
    write_splits,
)

SMALL = TaskSpec(seed=3, n_train=500, n_eval_in=50, n_eval_ood=50)


def test_splits_are_deterministic_and_disjoint():
    a, b = make_splits(SMALL), make_splits(SMALL)
    assert {k: [p.prompt for p in v] for k, v in a.items()} == {
        k: [p.prompt for p in v] for k, v in b.items()}
    prompts = {k: {p.prompt for p in v} for k, v in a.items()}
    assert len(prompts["train"]) == 500 and len(prompts["eval_in"]) == 50
    assert not prompts["train"] & prompts["eval_in"]
    assert not prompts["train"] & prompts["eval_ood"]
    assert not prompts["eval_in"] & prompts["eval_ood"]
    assert make_splits(TaskSpec(seed=4, n_train=500, n_eval_in=50, n_eval_ood=50)) != a


def test_step_counts_per_split_and_values_in_range():
    splits = make_splits(SMALL)
    for p in splits["train"] + splits["eval_in"]:
        assert 1 <= len(p.ops) <= 3
    for p in splits["eval_ood"]:
        assert 4 <= len(p.ops) <= 5
    for p in splits["train"]:
        assert all(0 <= v <= SMALL.max_value for v in p.results())
        assert verify(p.solution, p.answer)
        assert all(step_labels(p, p.solution))


def test_eval_in_has_the_step_mix_of_train():
    # Eval-in is a held-out sample of the training distribution: with the default split sizes
    # the one-step chains (910 distinct prompts) are a few percent of both, not a third of the
    # split drawn first.
    splits = make_splits(TaskSpec(n_train=20000, n_eval_in=400))
    for steps in (1, 2, 3):
        train, held_out = (sum(len(p.ops) == steps for p in splits[k]) / len(splits[k])
                           for k in ("train", "eval_in"))
        # within three binomial standard errors of a 400-prompt sample
        assert abs(held_out - train) < 3 * (train * (1 - train) / 400) ** 0.5, steps
    assert sum(len(p.ops) == 1 for p in splits["eval_in"]) / 400 < 0.1


def test_bad_spec_names_the_key():
    with pytest.raises(ValueError, match="ood_min_steps"):
        TaskSpec(max_steps=3, ood_min_steps=3)
    with pytest.raises(ValueError, match="task.max_value must be >= 2 \\* task.max_operand - 1"):
        TaskSpec(max_operand=14, max_value=20)  # 9+1-14 would flip to 10-14 = -4
    with pytest.raises(ValueError, match="cannot draw 1100 distinct prompts for train \\+ eval_in"):
        make_splits(TaskSpec(max_operand=1, max_value=1, n_train=1000, n_eval_in=100))


PROBLEM = Problem(17, (("+", 8), ("-", 5)))


def test_problem_rendering():
    assert PROBLEM.prompt == "17+8-5=?\n"
    assert PROBLEM.solution == "17+8=25\n25-5=20\n#### 20"
    assert PROBLEM.answer == 20


@pytest.mark.parametrize("completion, expected", [
    ("17+8=25\n25-5=20\n#### 20", True),
    ("#### 20", True),  # the verifier checks the answer, not the steps
    ("17+8=25\n25-5=20\n####20", True),
    ("17+8=25\n25-5=21\n#### 21", False),  # wrong answer
    ("17+8=25\n25-5=20\n20", False),  # missing marker
    ("17+8=25\n25-5=20\n#### 20\nmore text", False),  # text after the answer line
    ("#### twenty", False),
    ("", False),
    ("%%$#@!", False),
])
def test_verifier(completion, expected):
    assert verify(completion, "20") is expected


@pytest.mark.parametrize("completion, labels", [
    ("17+8=25\n25-5=20\n#### 20", [True, True, True]),
    ("17+8=26\n26-5=21\n#### 21", [False, True, True]),  # wrong arithmetic, then consistent
    ("17+8=25\n24-5=19\n#### 19", [True, False, True]),  # inconsistent with previous result
    ("17+9=26\n26-5=21\n#### 21", [False, True, True]),  # not the problem's operand
    ("17+8=25\n#### 25", [True, False]),  # stops early: the answer line is wrong
    ("17+8=25\n25-5=20", [True, True]),  # missing marker: steps still labelled
    ("17+8=25\n25-5=20\n20+1=21\n#### 21", [True, True, False, False]),  # extra step
    ("17+8=25\n25-5=20\n#### 20\n#### 20", [True, True, True, False]),
    ("garbage\n#### 20", [False, False]),
    ("17+8=25\n25*5=20\n#### 25", [True, False, False]),  # an unparsed line states no result
    ("", []),
])
def test_step_checker(completion, labels):
    assert step_labels(PROBLEM, completion) == labels


def test_all_steps_correct_iff_verified_on_sampled_variants():
    import random

    rng = random.Random(0)
    for p in make_splits(SMALL)["eval_in"]:
        lines = p.solution.split("\n")
        i = rng.randrange(len(lines))
        broken = lines.copy()
        broken[i] = broken[i][:-1] + str((int(broken[i][-1]) + 1) % 10)
        text = "\n".join(broken)
        labels = step_labels(p, text)
        assert all(labels) is False
        assert not verify(text, p.answer) or i < len(lines) - 1


@pytest.mark.parametrize("completion, errors", [
    ("17+8=25\n25-5=20\n#### 20", [None, None, None]),
    ("17+9=26\n26-5=21\n#### 21", ["operand", None, None]),  # operand copied off by one
    ("17-8=9\n9-5=4\n#### 4", ["sign", None, None]),  # the other operation applied
    ("17+8=26\n26-5=21\n#### 21", ["arithmetic", None, None]),  # result off by one
    ("17+8=25\n24-5=19\n#### 19", [None, "copy", None]),  # not the previous result
    ("17+8=25\n#### 25", [None, "truncated"]),  # the teacher's truncation
    ("#### 20", ["truncated"]),  # no step at all, right number or not
    ("17+8=25\n25-5=20\n#### 21", [None, None, "answer"]),
    ("17+8=25\n25-5=20\n20+1=21\n#### 21", [None, None, "extra", "extra"]),
    ("17+8=25\n25-5=20\n#### 20\n#### 20", [None, None, None, "extra"]),
    ("17+8=25\n25-5=20\n#### 20\nmore text", [None, None, None, "extra"]),
    ("17+8=25\n25-5=20\ngarbage", [None, None, "extra"]),  # past the length: extra first
    ("garbage\n#### 20", ["format", "truncated"]),  # an unparsed line counts as a step
    ("17+8=25\n25*5=20\n#### 25", [None, "format", "answer"]),  # no stated result to repeat
    ("17+8=25\n25-5=20", [None, None]),  # no answer line: steps still named
    ("", []),
    # Several faults: the first wrong field, left to right (copy, sign, operand, arithmetic).
    ("18-9=1\n1-5=-4\n#### -4", ["copy", None, None]),
    ("17-9=25\n25-5=20\n#### 20", ["sign", None, None]),
    ("17+9=25\n25-5=20\n#### 20", ["operand", None, None]),
])
def test_line_errors_name_each_family(completion, errors):
    assert line_errors(PROBLEM, completion) == errors
    assert [e is None for e in errors] == step_labels(PROBLEM, completion)
    assert {e for e in errors} - {None} <= set(LINE_ERRORS)


def test_line_errors_cover_every_family_once():
    named = set()
    for completion in ("17+9=26\n26-5=21\n#### 21", "17-8=9\n9-5=4\n#### 4",
                       "17+8=26\n26-5=21\n#### 21", "17+8=25\n24-5=19\n#### 19",
                       "17+8=25\n#### 25", "17+8=25\n25-5=20\n#### 21",
                       "17+8=25\n25-5=20\n#### 20\nx", "x\n25-5=20\n#### 20"):
        named |= set(line_errors(PROBLEM, completion)) - {None}
    assert named == set(LINE_ERRORS)


def test_line_errors_agree_with_step_labels_on_noisy_teacher_solutions():
    """On teacher solutions every wrong line is named by the slip the teacher made (its
    truncated answer line ``truncated``); on mangled ones None sits where the label is True."""
    import random

    from race.core.specs import TeacherSpec
    from race.data.teacher import solution

    spec = TeacherSpec(operand_slip=0.15, sign_slip=0.15, arithmetic_slip=0.15, truncate=0.5)
    rng = random.Random(0)
    splits = make_splits(SMALL)
    problems = splits["train"][:300] + splits["eval_ood"]
    seen = set()
    for p in problems:
        written = solution(p, spec, rng, SMALL.max_value)
        text = written.text
        errors = line_errors(p, text)
        assert errors == [s.slip for s in written.steps] + (
            ["truncated"] if written.truncated else [None])
        assert [e is None for e in errors] == step_labels(p, text)
        seen |= set(errors)
        lines = text.split("\n")  # a mangled copy: a line dropped, repeated or garbled
        i = rng.randrange(len(lines))
        how = rng.choice(("drop", "repeat", "garble"))
        lines[i:i + 1] = {"drop": [], "repeat": [lines[i]] * 2, "garble": ["1=+?"]}[how]
        mangled = "\n".join(lines)
        errors = line_errors(p, mangled)
        assert [e is None for e in errors] == step_labels(p, mangled)
        seen |= set(errors)
    assert seen == {None, *LINE_ERRORS}


def test_extract_answer():
    assert extract_answer("a\n#### 12\n") == 12
    assert extract_answer("#### -3") == -3
    assert extract_answer("12") is None


def test_jsonl_roundtrip_and_user_jsonl(tmp_path):
    paths = write_splits(SMALL, tmp_path)
    records = load_jsonl(paths["eval_in"])
    assert len(records) == 50
    p = problem_of(records[0])
    assert p.prompt == records[0].prompt and str(p.answer) == records[0].answer
    assert json.loads((tmp_path / "spec.json").read_text())["seed"] == 3

    user = tmp_path / "user.jsonl"
    write_jsonl(user, [{"prompt": "What is 2+2?\n", "answer": "4", "source": "me"}])
    (rec,) = load_jsonl(user)
    assert rec.meta == {"source": "me"} and verify_math("2+2 = 4. #### 4", rec.answer)
    with pytest.raises(ValueError, match="no arithmetic chain"):
        problem_of(rec)


def test_jsonl_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_jsonl(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1.*answer"):
        load_jsonl(bad)


def test_math_verifier():
    assert verify_math("so the total is 1,234", "1234")
    assert verify_math("#### 3.0", "3")
    assert not verify_math("no numbers here", "3")
    assert verify_math("first 5 then 7 #### 5", "5")


def test_gsm8k_mapping_code_path(tmp_path):
    """The datasets path, exercised offline on a local JSON file through load_dataset."""
    from race.data.task import gsm8k_record, load_hf_split

    data = tmp_path / "gsm.json"
    write_jsonl(data, [{"question": "Tom has 3 apples and buys 2. How many?",
                        "answer": "3+2=5\n#### 5"}])
    records = load_hf_split("json", "train", mapper=gsm8k_record, data_files=str(data))
    assert records[0].answer == "5" and records[0].prompt.endswith("?\n")
    assert verify_math("3+2=5\n#### 5", records[0].answer)


def test_the_ood_dataset_takes_its_own_config_name(tmp_path, monkeypatch):
    """task.hf_config names hf_id's config; an OOD dataset of its own (hf_ood_id) takes
    hf_ood_config, not the in-distribution one."""
    import race.data.task as task_mod
    from race.data.sources import write_task_data
    from race.data.task import Record

    calls = []

    def fake_split(dataset, split, name=None, **kw):
        calls.append((dataset, split, name))
        return [Record("1+1=?\n", "2", "1+1=2\n#### 2", {})]

    monkeypatch.setattr(task_mod, "load_hf_split", fake_split)
    write_task_data({"kind": "hf", "hf_id": "openai/gsm8k", "hf_config": "main",
                     "hf_ood_id": "org/math", "hf_ood_config": "algebra"}, str(tmp_path))
    assert calls == [("openai/gsm8k", "train", "main"), ("openai/gsm8k", "test", "main"),
                     ("org/math", "test", "algebra")]
