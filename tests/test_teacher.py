"""The noisy teacher (race.data.teacher): corruption rates measured on generated data, the clean
switch, determinism, the failure classifier, and pretraining through it."""

import json
import random
import stat
from dataclasses import replace

import pytest

from race.core.errors import ConfigError
from race.core.specs import TaskSpec, TeacherSpec
from race.data.task import failure_kind, make_splits, step_labels, verify
from race.data.teacher import SLIPS, slip_options, solution
from race.evaluation.metrics import pass_at_k

TASK = TaskSpec(n_train=3000, n_eval_in=10, n_eval_ood=10)
PROBLEMS = make_splits(TASK)["train"]
OFF = TeacherSpec(operand_slip=0.0, sign_slip=0.0, arithmetic_slip=0.0, truncate=0.0)


def _intended(problem, written):
    """(a, op, b) the problem asks at each written step, from the previous *stated* result."""
    value = problem.start
    for i, ((op, b), step) in enumerate(zip(problem.ops, written.steps, strict=False)):
        yield value, op, b, problem.ops[i + 1:len(written.steps)], step
        value = step.c


@pytest.mark.parametrize("family", SLIPS)
def test_slip_rate_matches_config_where_the_family_fits(family):
    spec = replace(OFF, **{f"{family}_slip": 0.2})
    rng = random.Random(0)
    fits = slipped = 0
    for problem in PROBLEMS:
        written = solution(problem, spec, rng, TASK.max_value)
        for a, op, b, rest, step in _intended(problem, written):
            if slip_options(a, op, b, TASK.max_value, rest)[family]:
                fits += 1
                slipped += step.slip == family
            else:
                assert step.slip is None
            assert step.slip in (None, family)
    assert fits > 3000
    assert slipped / fits == pytest.approx(0.2, abs=0.025)


def test_truncation_rate_and_only_on_long_chains():
    spec = replace(OFF, truncate=0.6, truncate_min_steps=2)
    rng = random.Random(1)
    eligible = truncated = 0
    for problem in PROBLEMS:
        written = solution(problem, spec, rng, TASK.max_value)
        if len(problem.ops) < 2:
            assert not written.truncated and len(written.steps) == 1
            continue
        eligible += 1
        truncated += written.truncated
        assert len(written.steps) == len(problem.ops) - written.truncated
        # A truncated solution is well formed and wrong; the systematic failure is what the
        # classifier and the step checker see.
        kind = failure_kind(problem, written.text)
        assert kind == ("truncated" if written.truncated else "correct")
        labels = step_labels(problem, written.text)
        assert labels[-1] is (not written.truncated) and all(labels[:-1])
    assert eligible > 1500
    assert truncated / eligible == pytest.approx(0.6, abs=0.04)


def test_slipped_chains_are_consistent_in_range_and_labelled_wrong():
    spec = TeacherSpec(operand_slip=0.1, sign_slip=0.1, arithmetic_slip=0.1, truncate=0.0)
    rng = random.Random(2)
    for problem in PROBLEMS[:800]:
        written = solution(problem, spec, rng, TASK.max_value)
        values = [problem.start] + [s.c for s in written.steps]
        assert all(0 <= v <= TASK.max_value for v in values)
        assert written.text.endswith(f"#### {written.steps[-1].c}")  # answer = last stated
        labels = step_labels(problem, written.text)
        for step, label in zip(written.steps, labels, strict=False):
            assert label is (step.slip is None)
        assert verify(written.text, problem.answer) is (not any(s.slip for s in written.steps)
                                                       or written.steps[-1].c == problem.answer)


def test_clean_teacher_writes_the_references_and_draws_nothing():
    rng = random.Random(3)
    state = rng.getstate()
    clean = TeacherSpec(noisy=False)
    for problem in PROBLEMS[:200]:
        assert solution(problem, clean, rng, TASK.max_value).text == problem.solution
    # The clean ablation leaves the random stream alone: clean base policies are the ones a
    # study without a teacher trains.
    assert rng.getstate() == state
    draws = [solution(p, TeacherSpec(), random.Random(7), TASK.max_value).text
             for p in PROBLEMS[:300]]
    again = [solution(p, TeacherSpec(), random.Random(7), TASK.max_value).text
             for p in PROBLEMS[:300]]
    assert draws == again


@pytest.mark.parametrize("section, key", [
    ({"truncate": 1.5}, "teacher.truncate"),
    ({"operand_slip": 0.5, "sign_slip": 0.4, "arithmetic_slip": 0.2}, "operand_slip + sign_slip"),
    ({"truncate_min_steps": 1}, "teacher.truncate_min_steps"),
    ({"trunc": 0.5}, "trunc"),
])
def test_bad_teacher_sections_name_the_key(section, key):
    with pytest.raises(ConfigError, match=key.replace("+", r"\+")):
        TeacherSpec.from_config(section)


def test_failure_kinds():
    problem = next(p for p in PROBLEMS if len(p.ops) == 3)
    assert failure_kind(problem, problem.solution) == "correct"
    assert failure_kind(problem, problem.solution.replace("####", "")) == "format"
    lines = problem.solution.split("\n")
    assert failure_kind(problem, "\n".join(lines[:2] + [f"#### {problem.results()[1]}"])) == (
        "truncated")
    wrong = "\n".join(lines[:-1] + [f"#### {problem.answer + 1}"])
    assert failure_kind(problem, wrong) == "other"


@pytest.mark.parametrize("n, c, k, want", [(16, 0, 16, 0.0), (16, 1, 16, 1.0), (16, 4, 1, 0.25),
                                           (4, 1, 2, 0.5), (8, 2, 4, 1 - 15 / 70)])
def test_pass_at_k_known_values(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want)


def test_pretraining_feeds_the_teacher_and_records_what_it_wrote(tmp_path, tokenizer_dir,
                                                                 umask_002):
    from race.core.specs import PretrainSpec
    from race.data.task import write_splits
    from race.policy.pretrain import pretrain

    write_splits(replace(TASK, n_train=300), tmp_path / "data")
    spec = PretrainSpec(token_budget=6000, batch_size=32, eval_examples=4)
    noisy = pretrain("nano", tmp_path / "data", tokenizer_dir, tmp_path / "noisy", spec,
                     teacher=TeacherSpec(truncate=0.9), max_value=TASK.max_value)
    written = noisy["teacher"]["written"]
    for name in ("model.safetensors", "pre.json"):  # the base policy's weights follow the umask
        assert stat.S_IMODE((tmp_path / "noisy" / name).stat().st_mode) == 0o664
    assert written["solutions"] >= 6000 // 40
    assert written["truncated"] / written["eligible_for_truncation"] == pytest.approx(0.9, abs=0.1)
    assert json.loads((tmp_path / "noisy" / "pre.json").read_text())["teacher"]["truncate"] == 0.9
    clean = pretrain("nano", tmp_path / "data", tokenizer_dir, tmp_path / "clean", spec,
                     teacher=TeacherSpec(noisy=False), max_value=TASK.max_value)
    assert clean["teacher"]["written"]["solutions"] == 0
    assert clean["tokens"] != noisy["tokens"]  # truncated solutions are shorter
