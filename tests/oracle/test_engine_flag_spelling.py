"""The engine's ``serve`` flags are spelled as the pin's: a flag both servers take is accepted in
every form the pin accepts (``--no-X`` for the pin's boolean flags) with the same default, so a
command line written for ``vllm serve`` starts the engine unchanged. Read from both argument
parsers, not from a list kept by hand."""

from __future__ import annotations

import argparse

import pytest

from engine.entrypoints.cli_args import add_serve_args

# Engine flags the pin does not have (each documented in engine/entrypoints/cli_args.py).
ENGINE_ONLY = {"--max-request-body-bytes", "--divergence", "--enable-debug-endpoint"}


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: a for a in parser._actions for option in a.option_strings}


@pytest.fixture(scope="module")
def pin_actions() -> dict[str, argparse.Action]:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return _actions(make_arg_parser(FlexibleArgumentParser()))


def engine_actions() -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    add_serve_args(parser)
    return _actions(parser)


def test_every_engine_flag_is_the_pins_or_a_known_extension(
    pin_actions: dict[str, argparse.Action],
) -> None:
    unknown = {
        action.option_strings[0]
        for action in engine_actions().values()
        if not set(action.option_strings) & set(pin_actions)
    } - ENGINE_ONLY
    assert not unknown, f"engine flags the pin does not have: {sorted(unknown)}"


def test_shared_flags_take_the_same_forms(pin_actions: dict[str, argparse.Action]) -> None:
    mismatched = []
    for option, action in engine_actions().items():
        pin = pin_actions.get(option)
        if pin is None:
            continue
        if set(action.option_strings) != set(pin.option_strings):
            mismatched.append((option, action.option_strings, pin.option_strings))
        if isinstance(pin, argparse.BooleanOptionalAction) != isinstance(
            action, argparse.BooleanOptionalAction
        ):
            mismatched.append((option, type(action).__name__, type(pin).__name__))
    assert not mismatched


@pytest.mark.parametrize(
    "flag",
    ["--no-enforce-eager", "--no-enable-log-requests", "--trust-request-chat-template",
     "--no-trust-request-mm-kwargs", "--no-allow-credentials"],
)  # fmt: skip
def test_the_pins_negations_and_trust_flags_parse(flag: str) -> None:
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    parser.parse_args([flag])


def test_boolean_defaults_match_the_pin(pin_actions: dict[str, argparse.Action]) -> None:
    # The engine's None defaults mean "unset: the pin's default applies" (resolved later).
    for option, action in engine_actions().items():
        pin = pin_actions.get(option)
        if isinstance(pin, argparse.BooleanOptionalAction) and action.default is not None:
            assert action.default == pin.default, option
