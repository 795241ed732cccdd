"""The synthetic verifiable task (the offline default) and the task interface.

An arithmetic *chain* starts from an integer and applies ``+``/``-`` operations left to right::

    prompt      "17+8-5=?\\n"
    solution    "17+8=25\\n25-5=20\\n#### 20"

Every solution line before the marker is one *step* ``a<op>b=c``; the last line is the final
answer after the marker ``####`` (the GSM8K convention). Values stay in ``[0, max_value]``: an
operation that would leave that range is flipped (``-`` to ``+`` or back), so every prompt is
well defined and every intermediate result has at most two digits by default.

Splits (all deterministic from the seed): ``train`` and ``eval_in`` have ``min_steps..max_steps``
steps; ``eval_ood`` has ``ood_min_steps..ood_max_steps`` (longer chains than training). No prompt
appears in two splits.

Two checks:

* :func:`verify` -- the verifier (reward ``rule``): the completion's last non-empty line must be
  ``#### <integer>`` and the integer must equal the answer. No marker, a non-integer, or text
  after the answer line is a format failure and scores 0.
* :func:`step_labels` -- the step checker (PRM training labels): a step is correct when it parses,
  its left operand equals the previous step's stated result (the problem's first number for the
  first step), its operation and operand are the problem's next ones, and its arithmetic is
  right. The answer line is correct when it equals the last step's stated result and the number
  of steps equals the problem's. Hence "every label correct" is equivalent to a well-formed
  solution whose answer is right. :func:`line_errors` names the error family of each wrong
  line (:data:`LINE_ERRORS`), for the PRM's per-family held-out AUC.

Any JSONL of ``{"prompt", "answer"}`` records plugs in through :func:`load_jsonl`, and a
``datasets`` id such as GSM8K through :func:`load_hf_split` (needs a reachable hub); both are
verified with :func:`verify_math`, which compares the number after the marker (or the last
number in the text) numerically.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from race.core.atomic import write_json_atomic
from race.core.specs import TaskSpec

MARKER = "####"
STEP_SEPARATOR = "\n"
_STEP_RE = re.compile(r"^(\d+)([+\-])(\d+)=(-?\d+)$")
_ANSWER_RE = re.compile(r"^####\s?(-?\d+)$")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Problem:
    """One chain: ``start`` then ``ops`` = ((op, operand), ...)."""

    start: int
    ops: tuple[tuple[str, int], ...]

    @property
    def prompt(self) -> str:
        body = str(self.start) + "".join(f"{op}{b}" for op, b in self.ops)
        return f"{body}=?\n"

    def results(self) -> list[int]:
        value, out = self.start, []
        for op, b in self.ops:
            value = value + b if op == "+" else value - b
            out.append(value)
        return out

    @property
    def answer(self) -> int:
        return self.results()[-1]

    @property
    def solution(self) -> str:
        lines, value = [], self.start
        for (op, b), result in zip(self.ops, self.results(), strict=True):
            lines.append(f"{value}{op}{b}={result}")
            value = result
        lines.append(f"{MARKER} {value}")
        return STEP_SEPARATOR.join(lines)

    def to_record(self) -> dict:
        return {
            "prompt": self.prompt,
            "answer": str(self.answer),
            "solution": self.solution,
            "start": self.start,
            "ops": [list(o) for o in self.ops],
        }

    @classmethod
    def from_record(cls, record: dict) -> Problem:
        return cls(int(record["start"]), tuple((str(o), int(b)) for o, b in record["ops"]))


def sample_problem(rng: random.Random, n_steps: int, spec: TaskSpec) -> Problem:
    value = rng.randint(0, spec.max_value)
    start, ops = value, []
    for _ in range(n_steps):
        b = rng.randint(1, spec.max_operand)
        op = rng.choice("+-")
        # Flip an operation that would leave [0, max_value] so every value stays small.
        if op == "-" and value - b < 0:
            op = "+"
        elif op == "+" and value + b > spec.max_value:
            op = "-"
        value = value + b if op == "+" else value - b
        ops.append((op, b))
    return Problem(start, tuple(ops))


def make_splits(spec: TaskSpec) -> dict[str, list[Problem]]:
    """Deterministic, prompt-disjoint splits ``train``, ``eval_in`` and ``eval_ood``.

    ``train`` and ``eval_in`` are one pool of distinct prompts, shuffled and then split, so
    eval-in is a held-out sample of the training distribution. Drawn one after the other, they
    would not be: each draws its step count uniformly, the space of short chains is small
    (910 one-step prompts by default), and the split drawn first takes its third of them, the
    second only what is left (it was 32% one-step prompts in eval-in, 4% in train). The OOD
    split is drawn after the pool; a prompt already drawn is skipped, so no prompt is in two
    splits and none twice in one.
    """
    rng = random.Random(spec.seed)
    seen: set[str] = set()
    plan = [
        ("in", spec.n_eval_in + spec.n_train, spec.min_steps, spec.max_steps),
        ("eval_ood", spec.n_eval_ood, spec.ood_min_steps, spec.ood_max_steps),
    ]
    splits: dict[str, list[Problem]] = {}
    for name, n, lo, hi in plan:
        out: list[Problem] = []
        attempts = 0
        while len(out) < n:
            attempts += 1
            if attempts > 50 * n + 1000:
                split = "train + eval_in" if name == "in" else name
                raise ValueError(
                    f"task: cannot draw {n} distinct prompts for {split}; "
                    "raise task.max_operand/max_value or lower the split size"
                )
            problem = sample_problem(rng, rng.randint(lo, hi), spec)
            if problem.prompt in seen:
                continue
            seen.add(problem.prompt)
            out.append(problem)
        splits[name] = out
    pool = splits.pop("in")
    rng.shuffle(pool)
    splits["eval_in"], splits["train"] = pool[:spec.n_eval_in], pool[spec.n_eval_in:]
    return {k: splits[k] for k in ("train", "eval_in", "eval_ood")}


# --------------------------------------------------------------------------- verification


def extract_answer(completion: str) -> int | None:
    """The integer on the final ``#### n`` line, or None when the format is not respected."""
    lines = [ln.strip() for ln in completion.strip().split(STEP_SEPARATOR) if ln.strip()]
    if not lines:
        return None
    match = _ANSWER_RE.match(lines[-1])
    return int(match.group(1)) if match else None


def verify(completion: str, answer: str | int) -> bool:
    """Rule verifier: a well-formed final answer line equal to ``answer``."""
    got = extract_answer(completion)
    return got is not None and str(got) == str(answer).strip()


def split_steps(completion: str) -> list[str]:
    """Non-empty lines of a completion: the steps, then (if present) the answer line."""
    return [ln.strip() for ln in completion.strip().split(STEP_SEPARATOR) if ln.strip()]


def step_labels(problem: Problem, completion: str) -> list[bool]:
    """One label per line of ``completion`` (see the module docstring for the rules).

    A completion with no lines has no labels (``[]``); callers decide what that scores.
    Lines after the answer line, a second answer line, and steps beyond the problem's length
    are wrong.
    """
    lines = split_steps(completion)
    labels: list[bool] = []
    previous = problem.start
    n_steps = 0
    answered = False
    for line in lines:
        if answered:
            labels.append(False)
            continue
        answer = _ANSWER_RE.match(line)
        if answer:
            answered = True
            labels.append(int(answer.group(1)) == previous and n_steps == len(problem.ops))
            continue
        step = _STEP_RE.match(line)
        if step is None or n_steps >= len(problem.ops):
            labels.append(False)
            n_steps += 1
            # An unparsed line states no result: nothing after it can be consistent with one.
            previous = int(step.group(4)) if step is not None else None
            continue
        a, op, b, c = int(step.group(1)), step.group(2), int(step.group(3)), int(step.group(4))
        want_op, want_b = problem.ops[n_steps]
        arithmetic = c == (a + b if op == "+" else a - b)
        labels.append(a == previous and op == want_op and b == want_b and arithmetic)
        previous = c  # consistency is checked against the stated result, right or wrong
        n_steps += 1
    return labels


#: Error families of a wrong line (:func:`line_errors`): the noisy teacher's slips
#: (:data:`race.data.teacher.SLIPS`), then the other faults of a step, of an answer line, of
#: a line's position, and of its format.
LINE_ERRORS: tuple[str, ...] = ("operand", "sign", "arithmetic", "copy", "truncated", "answer",
                                "extra", "format")


def line_errors(problem: Problem, completion: str) -> list[str | None]:
    """What is wrong with each line of ``completion``: one entry per line of
    :func:`step_labels` (same lines, same length), None exactly where its label is True, else
    the name of one family in :data:`LINE_ERRORS`:

    ``operand``     a step whose operand is not the problem's next one;
    ``sign``        a step whose operation is not the problem's next one;
    ``arithmetic``  a step whose stated result is not ``a op b`` (of the numbers written);
    ``copy``        a step whose left operand is not the previous stated result (the
                    problem's first number for the first step);
    ``truncated``   an answer line written after fewer steps than the problem has (the noisy
                    teacher's systematic failure), whatever number it states;
    ``answer``      an answer line, after as many steps as the problem has, that does not
                    repeat the last stated result;
    ``extra``       a line after the answer line, a line past the problem's number of steps,
                    or an answer line after more steps than the problem has;
    ``format``      a line that parses as neither a step nor an answer line.

    Steps are counted as :func:`step_labels` counts them: every line before the answer line,
    parsed or not. A line with several faults is named by the first that applies, in this
    priority: ``extra`` (the line should not be there at all, whatever it says), ``format``,
    then for an answer line ``truncated`` before ``answer``, and for a step the first wrong
    field reading the line left to right -- ``copy`` (a), ``sign`` (op), ``operand`` (b),
    ``arithmetic`` (c): a later field is checked against the numbers written before it, so
    the earlier fault is the likelier cause (``17-8=25`` for ``17+8`` is a sign error). Each
    slip of :mod:`race.data.teacher` is exactly one fault, so a teacher solution's lines are
    named by the slip they carry, and its truncated answer line ``truncated``.
    """
    errors: list[str | None] = []
    previous = problem.start
    n_steps = 0
    answered = False
    for line in split_steps(completion):
        if answered:
            errors.append("extra")
            continue
        answer = _ANSWER_RE.match(line)
        if answer:
            answered = True
            if n_steps > len(problem.ops):
                errors.append("extra")
            elif n_steps < len(problem.ops):
                errors.append("truncated")
            else:
                errors.append(None if int(answer.group(1)) == previous else "answer")
            continue
        step = _STEP_RE.match(line)
        if n_steps >= len(problem.ops):
            errors.append("extra")
        elif step is None:
            errors.append("format")
        else:
            a, op, b, c = (int(step.group(1)), step.group(2), int(step.group(3)),
                           int(step.group(4)))
            want_op, want_b = problem.ops[n_steps]
            faults = (("copy", a != previous), ("sign", op != want_op),
                      ("operand", b != want_b),
                      ("arithmetic", c != (a + b if op == "+" else a - b)))
            errors.append(next((name for name, wrong in faults if wrong), None))
        # As step_labels: the stated result, right or wrong; None after an unparsed line.
        previous = int(step.group(4)) if step is not None else None
        n_steps += 1
    return errors


#: What went wrong in a completion (:func:`failure_kind`), in report order.
FAILURES = ("correct", "format", "truncated", "other")


def failure_kind(problem: Problem, completion: str) -> str:
    """``correct``; ``format`` (no well-formed final answer line); ``truncated`` (the
    systematic failure of the noisy teacher: an answer line after fewer steps than the problem
    has); or ``other`` (a slip or any other wrong answer)."""
    if verify(completion, problem.answer):
        return "correct"
    if extract_answer(completion) is None:
        return "format"
    n_steps = sum(1 for line in split_steps(completion) if _STEP_RE.match(line))
    return "truncated" if n_steps < len(problem.ops) else "other"


# --------------------------------------------------------------------------- other datasets


def math_answer(completion: str) -> float | None:
    """The final answer a free-form completion states (GSM8K-style): the number after the last
    ``####`` marker if there is one, else the last number in the text; thousands separators
    are ignored. None when there is no such number."""
    text = completion.rsplit(MARKER, 1)[1] if MARKER in completion else completion
    numbers = _NUMBER_RE.findall(text)
    if not numbers:
        return None
    try:
        return float(numbers[0 if MARKER in completion else -1].replace(",", ""))
    except ValueError:
        return None


def verify_math(completion: str, answer: str | int | float) -> bool:
    """Math verifier for free-form datasets: numeric equality (to 1e-6, so ``"3.0" == 3``) of
    :func:`math_answer` and ``answer``."""
    got = math_answer(completion)
    if got is None:
        return False
    try:
        want = float(str(answer).replace(",", "").strip())
    except ValueError:
        return False
    return abs(got - want) < 1e-6


#: Each verifier by its config name (``verifier: task | math``): (whether a completion's final
#: answer is the answer, the final answer it states or None).
VERIFIERS = {"task": (verify, extract_answer), "math": (verify_math, math_answer)}


def answer_reader(verifier: str):
    """The final answer a completion states, as the verifier ``verifier`` reads it, or None
    when it states none (:data:`VERIFIERS`)."""
    return VERIFIERS[verifier][1]


@dataclass
class Record:
    """A task example as every stage sees it. ``meta`` carries task-specific fields."""

    prompt: str
    answer: str
    solution: str | None = None
    meta: dict = field(default_factory=dict)


def write_jsonl(path: str | Path, records: Iterable[dict]) -> None:
    """Write records atomically (race.core.atomic): a crash never leaves half a file."""
    from race.core.atomic import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def _a(value) -> str:
    name = "null" if value is None else type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def task_record(raw: dict, where: str) -> Record:
    """A task record from a mapping with ``prompt`` and ``answer`` (both non-empty text: a
    null, a number or an object is refused, not turned into the text "None"); other keys but
    ``solution`` go to ``meta``. ``where`` names the row in the error."""
    missing = [k for k in ("prompt", "answer") if k not in raw]
    if missing:
        raise ValueError(f"{where}: record lacks key(s) {missing}")
    for key in ("prompt", "answer"):
        value = raw[key]
        if not isinstance(value, str) or not value.strip():
            shown = "empty" if isinstance(value, str) else _a(value)
            raise ValueError(f"{where}: {key} must be non-empty text, not {shown}")
    solution = raw.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise ValueError(f"{where}: solution must be text, not {_a(solution)}")
    meta = {k: v for k, v in raw.items() if k not in ("prompt", "answer", "solution")}
    return Record(raw["prompt"], raw["answer"], solution, meta)


def load_jsonl(path: str | Path) -> list[Record]:
    """Load ``{"prompt", "answer"[, "solution"]}`` records (:func:`task_record`). An empty
    file, a line that is not UTF-8, or one that is not such an object, is an error naming
    the file and line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task data file not found: {path}")
    out = []
    for i, raw_line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}:{i}: not UTF-8 (byte {exc.start + 1} of the line)") \
                from None
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}:{i}: a record is a JSON object with prompt and answer, "
                             f"not a {type(raw).__name__}")
        out.append(task_record(raw, f"{path}:{i}"))
    if not out:
        raise ValueError(f"{path}: no records (the file is empty or blank)")
    return out


def gsm8k_record(example: dict) -> dict:
    """Map a GSM8K example (question, answer with a '#### n' tail) to a task record."""
    solution = example["answer"]
    final = solution.rsplit(MARKER, 1)[-1].strip().replace(",", "")
    return {"prompt": example["question"].strip() + "\n", "answer": final, "solution": solution}


def load_hf_split(dataset_id: str, split: str, config_name: str | None = None,
                  mapper=gsm8k_record, revision: str | None = None,
                  **load_kwargs) -> list[Record]:
    """Load a ``datasets`` split (a hub id needs a reachable hub, and loads at ``revision``,
    else at its pin (:func:`race.core.references.revision_of`), else at the default branch; a
    builder such as ``json`` with ``data_files=`` works offline). ``mapper`` turns one example
    into a task record."""
    from datasets import load_dataset

    from race.core.references import revision_of

    ds = load_dataset(dataset_id, config_name, split=split,
                      revision=revision_of(dataset_id, revision), **load_kwargs)
    return [task_record({k: v for k, v in mapper(ex).items()
                         if k in ("prompt", "answer", "solution")}, f"{dataset_id} {split} row {i}")
            for i, ex in enumerate(ds, 1)]


def is_arithmetic(record: Record) -> bool:
    return "start" in record.meta and "ops" in record.meta


def problem_of(record: Record) -> Problem:
    """The arithmetic problem behind a record (for the step checker)."""
    if not is_arithmetic(record):
        raise ValueError("record has no arithmetic chain (start/ops): no step labels available")
    return Problem.from_record(record.meta)


def write_splits(spec: TaskSpec, out_dir: str | Path) -> dict[str, Path]:
    """Write ``train.jsonl``, ``eval_in.jsonl``, ``eval_ood.jsonl`` and ``spec.json``."""
    out_dir = Path(out_dir)
    paths = {}
    for name, problems in make_splits(spec).items():
        paths[name] = out_dir / f"{name}.jsonl"
        write_jsonl(paths[name], (p.to_record() for p in problems))
    write_json_atomic(out_dir / "spec.json", asdict(spec), indent=2)
    return paths
