"""One version, everywhere it is said: the agent's `__version__` (what its results annotation and
`gpu-healthcheck status -o wide` show per node), the package, the chart and its appVersion, the
images' OCI label, every image of ours the manifests and the README name, and a CHANGELOG section.
A release moves them together (CHANGELOG.md says how); this test fails on the one left behind."""

from __future__ import annotations

import re
from pathlib import Path

from agent import __version__
from agent.config import yaml_safe

ROOT = Path(__file__).resolve().parent.parent
OUR_IMAGE = re.compile(r"ghcr\.io/gpu-healthcheck/(agent|hostengine):([0-9][\w.+-]*)")


def test_the_package_the_chart_and_the_images_carry_the_agents_version() -> None:
    (project,) = re.findall(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    chart = yaml_safe.load((ROOT / "charts" / "gpu-healthcheck" / "Chart.yaml").read_text())
    assert project == __version__
    assert chart["version"] == __version__, "the chart's version moves with the app's"
    assert chart["appVersion"] == __version__, "appVersion is the default image tag (values.image.tag)"
    for dockerfile in ("Dockerfile.agent", "Dockerfile.hostengine"):
        text = (ROOT / dockerfile).read_text()
        assert f"ARG VERSION={__version__}\n" in text, dockerfile


def test_every_image_of_ours_that_the_install_and_the_readme_name_has_the_version() -> None:
    files = [
        *sorted((ROOT / "manifests").rglob("*.yaml")),
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
    ]
    files += [ROOT / "Dockerfile.agent", ROOT / "Dockerfile.hostengine"]
    seen = {
        (f.relative_to(ROOT).as_posix(), tag) for f in files for _, tag in OUR_IMAGE.findall(f.read_text())
    }
    assert {f for f, _ in seen} >= {"manifests/60-agent.yaml", "manifests/40-hostengine.yaml", "README.md"}
    stale = sorted((f, tag) for f, tag in seen if tag != __version__)
    assert not stale, f"images not at {__version__}: {stale}"


def test_the_changelog_has_an_unreleased_heading_and_this_versions_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "Unreleased", headings
    assert __version__ in [h.split()[0] for h in headings[1:]], headings


def test_the_image_pattern_sees_a_stale_tag() -> None:
    assert OUR_IMAGE.findall("image: ghcr.io/gpu-healthcheck/agent:0.1.0") == [("agent", "0.1.0")]
