"""parse_node_json / node_from_dict on the derived Node object (real 7-of-8 allocatable excerpt)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.node import NodeObject
from agent.core.probed import ParseError
from agent.probes.node_object import node_from_dict, parse_node_json

FIX = Path(__file__).parent / "fixtures" / "k8s-node"
NODE = FIX / "DERIVED-h100x8-node-allocatable-gpu-7-of-8.json"
EXCERPT = FIX / "issue-k8s-device-plugin-1014-h100x8-allocatable-gpu-7-of-8-after-xid94.txt"


def test_derived_node_7_of_8() -> None:
    node = parse_node_json(NODE.read_text(encoding="utf-8"))
    assert node.name == "gpu-node-1"
    assert node.capacity_gpus == 8 and node.allocatable_gpus == 7
    assert node.labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert node.boot_id == "00000000-0000-0000-0000-000000000001"


def test_derived_values_match_the_real_excerpt() -> None:
    """The GPU quantities in the derived JSON are the ones in the real `kubectl describe` text."""
    text = EXCERPT.read_text(encoding="utf-8")
    capacity, allocatable = text.split("Allocatable:")
    assert "nvidia.com/gpu:             8" in capacity
    assert "nvidia.com/gpu:             7" in allocatable


def _node(**status: Any) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": "n1"}, "status": status}


def test_from_dict_as_sanitized_by_the_client() -> None:
    """sanitize_for_serialization gives camelCase JSON; list items carry no kind."""
    obj = _node(allocatable={"nvidia.com/gpu": "8"}, capacity={"nvidia.com/gpu": 8})
    del obj["kind"]
    node = node_from_dict(obj)
    assert node == NodeObject(name="n1", labels={}, allocatable_gpus=8, capacity_gpus=8, boot_id=None)


def test_no_gpu_resource_is_none() -> None:
    node = node_from_dict(_node(allocatable={"cpu": "4"}, nodeInfo={"bootID": ""}))
    assert node.allocatable_gpus is None and node.capacity_gpus is None and node.boot_id is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"kind": "Pod", "metadata": {"name": "x"}}',
        '{"kind": "Node"}',
        '{"kind": "Node", "metadata": {"name": ""}}',
        '{"kind": "Node", "metadata": {"name": "n", "labels": []}}',
        '{"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "x"}}}',
        '{"kind": "Node", "metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu": true}}}',
        '{"kind": "Node", "metadata": {"name": "n"}, "status": []}',
    ],
)
def test_bad_input_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_node_json(text)


def test_truncated_json_is_a_parse_error() -> None:
    text = NODE.read_text(encoding="utf-8")
    with pytest.raises(ParseError):
        parse_node_json(text[: len(text) // 2])


@settings(max_examples=300)
@given(st.text())
def test_random_text_never_raises_other_errors(text: str) -> None:
    try:
        result = parse_node_json(text)
    except ParseError:
        return
    assert isinstance(result, NodeObject)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300)
@given(
    st.fixed_dictionaries(
        {"kind": st.just("Node"), "metadata": _json, "status": _json},
    )
)
def test_random_node_shapes_never_raise_other_errors(doc: dict[str, Any]) -> None:
    try:
        result = parse_node_json(json.dumps(doc))
    except ParseError:
        return
    assert isinstance(result, NodeObject)
