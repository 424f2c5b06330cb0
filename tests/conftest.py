"""Shared pytest configuration."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubeenv.fixtures import *  # noqa: F403  (real kube-apiserver fixtures)

FAKE_DCGM = Path(__file__).parent / "fakes" / "dcgm"


@pytest.fixture
def fake_dcgm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fake DCGM bindings (tests/fakes/dcgm) found through the real loader's env override; yields
    the fake engine's state module, reset before and after, with any held diag released."""
    from agent.probes.dcgm.bindings import ENV, load_bindings

    monkeypatch.setenv(ENV, str(FAKE_DCGM))
    load_bindings()
    import fake_engine  # type: ignore[import-not-found]

    fake_engine.reset()
    yield fake_engine
    fake_engine.diag_release.set()
    fake_engine.reset()
