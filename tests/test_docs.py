"""The docs quote no study result by hand: every accuracy, gain, AUC, share or run time of a
study lives in the generated reports (reports/summary.md), which every run rewrites, so README
and docs/ can never disagree with them."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Numbers shaped like a study's results: a percentage or an accuracy gap, a run time in
#: minutes, a metric's value.
RESULT = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?\s*(?:%|points?\b|minutes?\b)"
                    r"|(?:AUC|pass@\d+|maj@\d+|accuracy)[^.\n]{0,20}?\d\.\d+")
NUMBER = re.compile(r"\d+(?:\.\d+)?%?")
#: The numbers of that shape that are not a study's results, each with its reason.
CONVENTIONS = {
    "1%": "FLOPs the analytic model leaves out (norms, softmax, ...): a property of the model",
    "21%": "the error of the textbook '2x forward' formula: a property of the FLOP model",
    "97%": "vanilla TRL's generation share on an H200: a measured fact about the stack",
    "33%": "the same step's share of model FLOPs in generation: a fact about the stack",
    "95%": "the interval level",
    "0.5": "the threshold a PRM's step accuracy is taken at",
}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_result_number_is_typed_by_hand(path):
    text = path.read_text()
    typed = [(text.count("\n", 0, m.start()) + 1, m.group()) for m in RESULT.finditer(text)
             if NUMBER.findall(m.group().replace(" ", ""))[-1] not in CONVENTIONS]
    assert not typed, (f"{path.name} quotes results by hand (line, text): {typed}; link to "
                       "reports/summary.md instead")


def test_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
