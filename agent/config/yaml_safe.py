"""YAML read safely and fast: libyaml's safe loader where PyYAML was built with it (its wheels are),
else the pure-Python one. The same documents for ~10x less CPU: the pure-Python loader cost an agent
about 0.2 s at every start and reload, and the tests minutes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str | bytes) -> Any:
    """One document, as yaml.safe_load."""
    return yaml.load(text, Loader=LOADER)


def load_all(text: str | bytes) -> Iterator[Any]:
    """Every document, as yaml.safe_load_all."""
    return yaml.load_all(text, Loader=LOADER)
