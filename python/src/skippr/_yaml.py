"""The canonical ``skippr.yml`` style (written byte for byte like ``skipprd connect``), and
reading YAML the way skipprd does (YAML 1.2 scalars, positions kept for error messages).

Canonical style: block mappings indented by two spaces, one blank line between top-level
sections and nowhere else, lists of scalars in flow style (``[a, b]``), integers plain, and
strings plain unless they would not read back as the same string, then single-quoted with
``'`` doubled. The file ends with one newline.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Tuple, Union

import yaml
import yaml.nodes

from ._errors import ConfigError, Segment, display_path
from ._model import EnvRef

# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

#: A value to write: a scalar, a list of scalars (flow style), or a mapping (block style).
Scalar = Union[str, bool, int, EnvRef]
Node = Union[Scalar, List[Scalar], List[Dict[str, "Node"]], Dict[str, "Node"]]

_PLAIN = re.compile(r"[A-Za-z0-9_./$][A-Za-z0-9_./${}:@+-]*\Z")
_KEYWORDS = frozenset(["true", "false", "yes", "no", "on", "off", "null", "~"])
# What Rust's `str::parse::<i64>()` or `str::parse::<f64>()` accepts.
_RUST_NUMBER = re.compile(
    r"[+-]?(inf|infinity|nan|([0-9]+|[0-9]+\.[0-9]*|[0-9]*\.[0-9]+)(e[+-]?[0-9]+)?)\Z",
    re.IGNORECASE,
)
# Numbers in YAML 1.2 (as skipprd's YAML reader resolves them) that the above misses.
_YAML_ONLY_NUMBER = re.compile(r"[-+]?(0x[0-9a-fA-F]+|0o[0-7]+|0b[01]+|\.(inf|Inf|INF))\Z|\.(nan|NaN|NAN)\Z")


def plain_ok(s: str, in_flow: bool) -> bool:
    """Whether ``s`` can be written without quotes and read back as the same string."""
    return (
        _PLAIN.match(s) is not None
        and not s.endswith(":")
        and s.lower() not in _KEYWORDS
        and _RUST_NUMBER.match(s) is None
        and _YAML_ONLY_NUMBER.match(s) is None
        and not (in_flow and any(c in s for c in "{}[],"))
    )


def scalar(value: Scalar, in_flow: bool = False) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    s = str(value)
    if plain_ok(s, in_flow):
        return s
    return "'" + s.replace("'", "''") + "'"


def _entry(out: List[str], key: str, value: Node, indent: int) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        out.append(f"{pad}{scalar(key)}:")
        for k, v in value.items():
            _entry(out, k, v, indent + 2)
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        # A list of mappings: one block item each, as skipprd writes it.
        out.append(f"{pad}{scalar(key)}:")
        for item in value:
            inner: List[str] = []
            if isinstance(item, dict):
                for k, v in item.items():
                    _entry(inner, k, v, indent + 4)
            else:
                inner.append(" " * (indent + 4) + scalar(item))
            if inner:
                inner[0] = f"{pad}  - " + inner[0].lstrip()
            out.extend(inner)
    elif isinstance(value, list):
        items = ", ".join(scalar(v, in_flow=True) for v in value if not isinstance(v, dict))
        out.append(f"{pad}{scalar(key)}: [{items}]")
    else:
        out.append(f"{pad}{scalar(key)}: {scalar(value)}")


def render(sections: Dict[str, Node]) -> str:
    """The text of a file made of ``sections`` (already in order; empty ones skipped,
    except ``skippr``)."""
    blocks = []
    for name, body in sections.items():
        if name != "skippr" and isinstance(body, dict) and not body:
            continue
        lines: List[str] = []
        _entry(lines, name, body, 0)
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """Composes nodes without PyYAML's YAML 1.1 scalar resolution (``yes`` is a string
    for skipprd); plain scalars are resolved by :func:`resolve_plain` instead."""


    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.nodes.ScalarNode and implicit and implicit[0]:
            return _PLAIN_TAG
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]


_Loader.yaml_implicit_resolvers = {}

_STR_TAG = "tag:yaml.org,2002:str"
#: Given to untagged plain scalars, resolved afterwards by :func:`resolve_plain`.
_PLAIN_TAG = "!skippr/plain"
_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)\Z")
_INT_PREFIXED = re.compile(r"([-+]?)0([xob])([0-9a-fA-F]+)\Z")
_FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?\Z")
_LEADING_ZERO_INT = re.compile(r"[-+]?0[0-9]+\Z")


def resolve_plain(s: str) -> Any:
    """An unquoted scalar, as skipprd's YAML reader (YAML 1.2 core schema) reads it."""
    if s in ("", "~", "null", "Null", "NULL"):
        return None
    if s in ("true", "True", "TRUE"):
        return True
    if s in ("false", "False", "FALSE"):
        return False
    if _INT.match(s):
        return int(s)
    m = _INT_PREFIXED.match(s)
    if m:
        base = {"x": 16, "o": 8, "b": 2}[m.group(2)]
        try:
            n = int(m.group(3), base)
        except ValueError:
            return s
        return -n if m.group(1) == "-" else n
    if s.lstrip("+-") in (".inf", ".Inf", ".INF"):
        return -math.inf if s.startswith("-") else math.inf
    if s in (".nan", ".NaN", ".NAN"):
        return math.nan
    if _FLOAT.match(s) and not _LEADING_ZERO_INT.match(s):
        return float(s)
    return s


Path = Tuple[Segment, ...]


class Document:
    """A parsed file: plain Python values plus the position of every key and item."""

    def __init__(self, source: str, value: Any, positions: Dict[Path, Tuple[int, int]]) -> None:
        self.source = source
        self.value = value
        self.positions = positions

    def error(self, path: Path, message: str) -> ConfigError:
        """An error at ``path`` (or the closest enclosing entry that has a position)."""
        p = path
        while p not in self.positions and p:
            p = p[:-1]
        line, column = self.positions.get(p, (None, None))
        return ConfigError(message, display_path(path), file=self.source, line=line, column=column)


def parse(text: str, source: str) -> Document:
    """Parses ``text`` (from ``source``, named in errors); raises ConfigError on bad YAML."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()  # type: ignore[no-untyped-call]
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise ConfigError(
            f"YAML syntax error: {what}",
            file=source,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"YAML syntax error: {e}", file=source) from None
    positions: Dict[Path, Tuple[int, int]] = {}
    if node is None:
        return Document(source, None, positions)
    positions[()] = (node.start_mark.line + 1, node.start_mark.column + 1)
    value = _convert(node, (), positions, source)
    return Document(source, value, positions)


def _convert(node: yaml.nodes.Node, path: Path, positions: Dict[Path, Tuple[int, int]], source: str) -> Any:
    def fail(message: str, at: yaml.nodes.Node) -> ConfigError:
        return ConfigError(
            message,
            display_path(path),
            file=source,
            line=at.start_mark.line + 1,
            column=at.start_mark.column + 1,
        )

    if isinstance(node, yaml.nodes.ScalarNode):
        if node.tag == _PLAIN_TAG:
            return resolve_plain(node.value)
        if node.tag == _STR_TAG:
            return node.value
        try:
            return yaml.constructor.SafeConstructor().construct_object(node, deep=True)  # type: ignore[no-untyped-call]
        except yaml.YAMLError as e:
            raise fail(f"YAML syntax error: {e}", node) from None
    if isinstance(node, yaml.nodes.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            positions[path + (i,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            items.append(_convert(item, path + (i,), positions, source))
        return items
    if isinstance(node, yaml.nodes.MappingNode):
        out: Dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.nodes.ScalarNode):
                raise fail("keys must be plain names, found a list or mapping as a key", key_node)
            key = str(key_node.value)
            if key in out:
                raise ConfigError(
                    f"duplicate key `{key}`: each key may appear once",
                    display_path(path + (key,)),
                    file=source,
                    line=key_node.start_mark.line + 1,
                    column=key_node.start_mark.column + 1,
                )
            positions[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[key] = _convert(value_node, path + (key,), positions, source)
        return out
    raise fail("unsupported YAML node", node)  # pragma: no cover
