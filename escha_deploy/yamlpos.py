"""YAML with source positions, so every profile error can name file:line.

``load_yaml_with_positions(path)`` returns the plain data (PyYAML ``safe_load``) and a map from
key path (a tuple of keys and list indexes) to ``(file, line)``. Missing keys are looked up at
their nearest ancestor (the pattern of Dagster's ``source_position.py``, style-anchors
section 7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import BadInput

Positions = dict[tuple, tuple[str, int]]


def _walk(node: yaml.Node, path: tuple, file: str, out: Positions) -> None:
    out.setdefault(path, (file, node.start_mark.line + 1))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            # the key's own line names the key; children keep their own lines
            out[path + (key,)] = (file, key_node.start_mark.line + 1)
            _walk(value_node, path + (key,), file, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), file, out)


def parse_yaml_text(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text; raise ``BadInput`` with ``file:line`` on a syntax error."""
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInput(f"{file}{line}: malformed YAML: {problem}") from None
    positions: Positions = {}
    if node is not None:
        _walk(node, (), file, positions)
    return data, positions


def load_yaml_with_positions(path: Path) -> tuple[Any, Positions]:
    """Read and parse a YAML file; ``BadInput`` naming the file when it cannot be read."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror}") from None
    return parse_yaml_text(text, str(path))


def position_of(positions: Positions, loc: tuple) -> tuple[str, int] | None:
    """The position of ``loc``, or of its nearest ancestor that has one."""
    while True:
        if loc in positions:
            return positions[loc]
        if not loc:
            return None
        loc = loc[:-1]
