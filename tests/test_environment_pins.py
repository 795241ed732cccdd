"""The pinned stack: the top-level pins, the lock of every package under them
(envs/constraints.txt, written by ``make lock``) and the conda env file agree, and the
environment the tests run in is the locked one."""

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ENVS = Path(__file__).resolve().parents[1] / "envs"


def pin(line: str) -> tuple[str, str]:
    """(normalised name, version) of an exact pin ``name[extras]==version``."""
    req = Requirement(line)
    specs = list(req.specifier)
    assert len(specs) == 1 and specs[0].operator == "==", f"{line!r} is not an exact pin"
    spec = specs[0]
    return canonicalize_name(req.name), spec.version


def pins(path: Path) -> dict[str, str]:
    """``name -> version`` of a requirements file's pins (comments and ``-r`` includes left
    out)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return dict(pin(line) for line in lines if line and not line.startswith("-"))


LOCK = pins(ENVS / "constraints.txt")


def test_lock_lines_are_plain_versions():
    for name, version in LOCK.items():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.]*", version), (name, version)
        assert Version(version).local is None, f"{name}: local label in the lock ({version})"


@pytest.mark.parametrize("requirements", ["requirements.txt", "requirements-dev.txt"])
def test_top_level_pins_are_locked_at_the_same_version(requirements):
    for name, version in pins(ENVS / requirements).items():
        assert LOCK.get(name) == version, (
            f"{requirements} pins {name}=={version}, envs/constraints.txt has "
            f"{LOCK.get(name)}: run `make lock`")


def test_package_requirements_admit_the_locked_versions():
    """pyproject.toml's dependencies (what `pip install -e .` asks for) admit the lock."""
    project = tomllib.loads((ENVS.parent / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        req = Requirement(line)
        locked = LOCK.get(canonicalize_name(req.name))
        assert locked is not None and req.specifier.contains(locked), (line, locked)


def test_conda_env_carries_the_same_pins():
    env = yaml.safe_load((ENVS / "race.yaml").read_text())
    (pip_section,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert dict(pin(line) for line in pip_section) == pins(ENVS / "requirements.txt")


def test_the_test_environment_is_the_locked_one():
    """What `make` installed is what the lock says (a local label such as torch's +cpu aside):
    a package that drifted would make a rerun compute on other code than the lock names."""
    drifted = {}
    for name, version in LOCK.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # a platform without this package (the lock lists the lock machine's)
        if Version(installed).public != version:
            drifted[name] = (installed, version)
    assert not drifted, f"installed vs locked: {drifted}"
