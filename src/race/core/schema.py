"""The config schema (``config.schema.yaml``, package data): types, ranges, enums, defaults.

The schema is the one place where a config key's type, range, allowed values, description and
default live. Snakemake validates ``config.yaml`` against it (filling defaults); the typed
sections of :mod:`race.core.specs` read their field defaults from it (:func:`default`) and
check every value they are built with against it (:func:`check`), so a job read back from JSON
or a section changed by a command-line override obeys the same rule as the config file. The
typed layer adds only the rules between keys.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from race.core.errors import ConfigError

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


@cache
def _validator(section: str, key: str):
    """A validator of one key's schema node (JSON arrays may arrive as tuples: frozen specs)."""
    base = jsonschema.validators.validator_for(schema())
    arrays = base.TYPE_CHECKER.redefine(
        "array", lambda _checker, value: isinstance(value, list | tuple))
    return jsonschema.validators.extend(base, type_checker=arrays)(properties(section)[key])


def check(section: str, key: str, value: Any) -> None:
    """``value`` against the schema's node of ``section.key`` (its type, range, enum); a
    :class:`ConfigError` naming the key otherwise. A hashable value's verdict is remembered:
    the builders make a spec per cell, with the same values every time."""
    try:
        message = _verdict(section, key, value, type(value))
    except TypeError:  # unhashable (a list): checked every time
        message = _verdict.__wrapped__(section, key, value, type(value))
    if message is not None:
        raise ConfigError(f"{section}.{key}: {message}")


@cache
def _verdict(section: str, key: str, value: Any, kind: type) -> str | None:
    """jsonschema's message for ``value`` at ``section.key``, or None when it is valid
    (``kind`` keeps 1, 1.0 and True apart in the cache: JSON types tell them apart)."""
    error = jsonschema.exceptions.best_match(_validator(section, key).iter_errors(value))
    return None if error is None else error.message
