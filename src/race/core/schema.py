"""The config schema (``config.schema.yaml``, package data) and the defaults it states.

The schema is the one place where a config key's type, description and default live: Snakemake
validates ``config.yaml`` against it (filling defaults), and the typed sections of
:mod:`race.study.specs` read their field defaults from it, so a default is never written twice.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA = Path(__file__).with_name("config.schema.yaml")


@cache
def schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text())


def properties(section: str) -> dict[str, dict]:
    """The properties of a top-level section; for a map of named entries (``allocations``,
    ``rewards``, ``resources``) those of one entry."""
    node = schema()["properties"][section]
    if "properties" not in node:
        node = node["additionalProperties"]
    return node["properties"]


def default(section: str, key: str | None = None) -> Any:
    """The schema's default of ``section.key``, or of the top-level key ``section`` (a KeyError
    names a key that has none)."""
    prop = schema()["properties"][section] if key is None else properties(section)[key]
    if "default" not in prop:
        raise KeyError(f"{section}{'.' + key if key else ''} has no default in {SCHEMA.name}")
    value = prop["default"]
    return tuple(value) if isinstance(value, list) else value
