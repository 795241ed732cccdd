"""Config values as researchers write them: 1e18-style FLOP counts, and a clear error naming
the key for anything that is not a positive number."""

import re
from pathlib import Path

import pytest

from race.study.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def smoke_text(tmp_path: Path, budgets: str, pilot: str = "[4e9]", validation: str = "8e9") -> Path:
    text = (ROOT / "configs" / "smoke.yaml").read_text()
    text = re.sub(r"(?m)^budgets: .*$", f"budgets: {budgets}", text)
    text = re.sub(r"(?m)^  pilot_rungs: .*$", f"  pilot_rungs: {pilot}", text)
    text = re.sub(r"(?m)^  validation_budget: .*$", f"  validation_budget: {validation}", text)
    text = text.replace("results_dir: results", f"results_dir: {tmp_path / 'results'}")
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_scientific_notation_reads_as_numbers(tmp_path):
    config = load_config(smoke_text(tmp_path, "[4e9, 8e9, 1.6E10]"))
    assert config["budgets"] == [4e9, 8e9, 1.6e10]
    assert config["race"]["pilot_rungs"] == [4e9] and config["race"]["validation_budget"] == 8e9


@pytest.mark.parametrize("budgets, message", [
    ("[4e9, lots, 1.6e10]", "budgets[1]: 'lots' is not a positive number of FLOPs"),
    ("[4e9, -8e9, 1.6e10]", "budgets[1]: -8000000000 is not a positive number of FLOPs"),
])
def test_a_bad_flop_value_names_its_key(tmp_path, budgets, message):
    with pytest.raises(ConfigError) as err:
        load_config(smoke_text(tmp_path, budgets))
    assert message in str(err.value)
