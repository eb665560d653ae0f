"""Every option's help says a whole thing: no line of ``--help`` ends mid-sentence."""

from __future__ import annotations

import argparse

from orchestrator.cli.app import build_parser


def _parsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_option_help_ends_mid_sentence() -> None:
    unfinished = []
    checked = 0
    for prog, parser in _parsers(build_parser()):
        for action in parser._actions:
            text = (action.help or "").strip()
            if not text or text == argparse.SUPPRESS:
                continue
            checked += 1
            if text[-1] in ":,;(-–—" or text.split()[-1].lower() in ("the", "a", "of", "and"):
                unfinished.append(f"{prog} {'/'.join(action.option_strings)}: ...{text[-40:]}")
    assert checked > 50, checked  # every subcommand's options were reached
    assert not unfinished, "\n".join(unfinished)
