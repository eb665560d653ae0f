"""The YAML loader: safe, duplicate keys rejected, YAML 1.2 scalars, lines in errors."""

from __future__ import annotations

import pytest

from orchestrator.config.yamlio import format_loc, load_yaml, parse_yaml
from orchestrator.contract.errors import ConfigError


def test_scalars_follow_yaml_1_2() -> None:
    doc = parse_yaml(
        "lr: 2e-5\nbig: 1E3\nneg: -1.5e-4\nint: 012\nhex: 0x1f\n"
        "answer: no\nflag: True\noff: off\nwhen: 2024-01-01\nclock: 1:30\nnothing: null\n"
        "tilde: ~\nempty:\ninf: .inf\n",
        "t.yaml",
    )
    assert doc.data == {
        "lr": 2e-5,
        "big": 1000.0,
        "neg": -1.5e-4,
        "int": 12,
        "hex": 31,
        "answer": "no",
        "flag": True,
        "off": "off",
        "when": "2024-01-01",
        "clock": "1:30",
        "nothing": None,
        "tilde": None,
        "empty": None,
        "inf": float("inf"),
    }
    assert isinstance(doc.data["lr"], float)


def test_duplicate_key_names_both_lines() -> None:
    with pytest.raises(
        ConfigError, match=r"t\.yaml:3: a: duplicate key 'b' \(first defined on line 2\)"
    ):
        parse_yaml("a:\n  b: 1\n  b: 2\n", "t.yaml")


def test_duplicate_top_level_key() -> None:
    with pytest.raises(ConfigError, match=r"t\.yaml:2: duplicate key 'x'"):
        parse_yaml("x: 1\nx: 2\n", "t.yaml")


def test_syntax_error_has_line() -> None:
    with pytest.raises(ConfigError, match=r"t\.yaml:3: YAML syntax error: "):
        parse_yaml("a: 1\nb: [1, 2\nc: 3\n", "t.yaml")


def test_python_tags_are_refused() -> None:
    with pytest.raises(ConfigError, match="YAML syntax error: could not determine a constructor"):
        parse_yaml("x: !!python/object/apply:os.system ['true']\n", "t.yaml")


def test_several_documents_are_refused() -> None:
    with pytest.raises(ConfigError, match="expected a single document"):
        parse_yaml("a: 1\n---\nb: 2\n", "t.yaml")


def test_lines_of_keys_and_items() -> None:
    doc = parse_yaml("top:\n  - name: a\n  - name: b\n    arguments:\n      x: 1\n", "t.yaml")
    assert doc.line_of(("top", 1, "arguments", "x")) == 5
    assert doc.line_of(("top", 1)) == 3
    # a key that does not exist falls back to its nearest parent
    assert doc.line_of(("top", 1, "missing")) == 3


def test_aliases_are_walked_once() -> None:
    # the "billion laughs" shape: construction shares objects, indexing must not explode
    text = "a: &a [1, 2]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(20)
    )
    doc = parse_yaml(text, "t.yaml")
    assert doc.data["b"] == [[1, 2], [1, 2]]


def test_missing_file_and_directory(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: scenarios file not found"):
        load_yaml(tmp_path / "nope.yaml", "scenarios file")
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        load_yaml(tmp_path, "scenarios file")


def test_binary_file_is_refused(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_yaml(path, "scenarios file")


def test_format_loc() -> None:
    assert format_loc(("scenarios", 2, "arguments", "r")) == "scenarios[2].arguments.r"
    assert format_loc(()) == ""
