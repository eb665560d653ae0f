"""Safe YAML loading with line numbers, duplicate-key rejection and YAML 1.2 scalars.

Config files are loaded with a ``SafeLoader`` subclass, so no tag can build a
Python object. Two deliberate departures from PyYAML's YAML 1.1 defaults, both
what the YAML 1.2 core schema says and what users of these files expect:

- ``1e-4`` and ``2E5`` are numbers (1.1 reads them as strings);
- only ``true``/``false`` are booleans: ``save_strategy: no`` stays the string
  ``"no"``; ``012`` is twelve, ``1:30`` and ``2024-01-01`` stay strings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.contract.errors import ConfigError

Loc = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema's implicit scalar types."""


_NULL_TAG = "tag:yaml.org,2002:null"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"

_INT_RE = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_RE = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)

_Loader.yaml_implicit_resolvers = {}
_Loader.add_implicit_resolver(
    _NULL_TAG, re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
_Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# int before float: the float pattern also matches plain digits.
_Loader.add_implicit_resolver(_INT_TAG, _INT_RE, list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))
_Loader.add_implicit_resolver(_MERGE_TAG, re.compile(r"^(?:<<)$"), ["<"])


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _construct_bool(loader: _Loader, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


_Loader.add_constructor(_INT_TAG, _construct_int)
_Loader.add_constructor(_FLOAT_TAG, _construct_float)
_Loader.add_constructor(_BOOL_TAG, _construct_bool)


@dataclass
class YamlDoc:
    """A loaded YAML file: its data and the line of every key and list item."""

    file: str
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> int | None:
        """The line of ``loc``, or of its nearest enclosing key that has one."""
        for end in range(len(loc), 0, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return None

    def error(self, message: str, loc: Loc = ()) -> ConfigError:
        return ConfigError(
            message, file=self.file, line=self.line_of(loc), key=format_loc(loc) or None
        )


def format_loc(loc: Loc) -> str:
    """``('scenarios', 2, 'arguments')`` -> ``scenarios[2].arguments``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def read_text(path: str | Path, what: str) -> str:
    """Read a UTF-8 text file or raise a one-line ``ConfigError`` saying why not."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found", file=p) from None
    except IsADirectoryError:
        raise ConfigError(f"{what} is a directory, not a file", file=p) from None
    except PermissionError:
        raise ConfigError(f"{what} is not readable (permission denied)", file=p) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} is not UTF-8 text ({exc.reason})", file=p) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", file=p) from None


def load_yaml(path: str | Path, what: str = "YAML file") -> YamlDoc:
    """Load one YAML document safely; duplicate keys and syntax errors name their line."""
    text = read_text(path, what)
    return parse_yaml(text, str(path))


def parse_yaml(text: str, file: str) -> YamlDoc:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        doc = YamlDoc(file=file, data=None)
        if node is None:
            return doc
        _index(node, (), doc.lines, file, set())
        doc.data = loader.construct_document(node)
        return doc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = "; ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"YAML syntax error: {problem}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML error: {exc}", file=file) from None
    except RecursionError:
        raise ConfigError("YAML nesting is too deep", file=file) from None
    finally:
        loader.dispose()


def _key_of(node: yaml.Node) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _index(node: yaml.Node, loc: Loc, lines: dict[Loc, int], file: str, seen: set[int]) -> None:
    """Record the line of each key and list item; reject duplicate keys."""
    # An alias points at a node already walked; walking it again could be
    # exponential (the "billion laughs" shape), so each node is walked once.
    if id(node) in seen:
        return
    seen.add(id(node))
    for child_loc, child, line in _children(node, loc, file):
        lines.setdefault(child_loc, line)
        _index(child, child_loc, lines, file, seen)


def _children(node: yaml.Node, loc: Loc, file: str) -> Iterator[tuple[Loc, yaml.Node, int]]:
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield (*loc, i), item, item.start_mark.line + 1
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = _key_of(key_node)
            line = key_node.start_mark.line + 1
            if key is None:
                raise ConfigError(
                    "a mapping key must be a plain value, not a list or mapping",
                    file=file,
                    line=line,
                    key=format_loc(loc) or None,
                )
            if key in first_line:
                raise ConfigError(
                    f"duplicate key '{key}' (first defined on line {first_line[key]})",
                    file=file,
                    line=line,
                    key=format_loc(loc) or None,
                )
            first_line[key] = line
            yield (*loc, key), value_node, line
