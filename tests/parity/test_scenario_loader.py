"""Scenario loading: every error is one ``file:line: message``; valid files round-trip."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from parity_helpers import SCENARIOS

from parity.errors import ScenarioError
from parity.loader import (
    collect_files,
    dump_scenario,
    load_scenario,
    load_scenarios,
    parse_scenario,
)

pytestmark = pytest.mark.timeout(30)

GOOD = """\
id: {id}
description: a small valid scenario
tier: scheduler
config:
  block_size: 16
  num_gpu_blocks_override: 4
  max_model_len: 2048
requests:
  - id: r1
    prompt_token_ids: [389, 444, 400]
    max_tokens: 56
    ignore_eos: true
limits: {{max_steps: 300, stall_steps: 50}}
expect:
  outcome: {{r1: wedged}}
  steps:
    47: {{num_scheduled_tokens: {{}}}}
"""


def problems(path: Path) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return [str(p) for p in info.value.problems]


def test_valid_file_loads_with_locations(write_yaml: Callable[[str, str], Path]) -> None:
    path = write_yaml("good", GOOD.format(id="good"))
    scenario = load_scenario(path)
    assert scenario.id == "good" and scenario.file == str(path)
    assert scenario.requests[0].max_tokens == 56
    assert scenario.location() == f"{path}:1"
    assert scenario.request_location("r1") == f"{path}:9"
    assert scenario.request_location("r1", "max_tokens") == f"{path}:11"
    assert scenario.location(("config", "num_gpu_blocks_override")) == f"{path}:6"
    assert scenario.location(("expect", "steps", 47, "num_scheduled_tokens")) == f"{path}:17"
    assert scenario.request_location("nope") == f"{path}:1"


def test_malformed_yaml_reports_the_parser_line(write_yaml: Callable[[str, str], Path]) -> None:
    path = write_yaml("bad", "id: bad\nrequests: [\n  {id: r1\n")
    (message,) = problems(path)
    assert message.startswith(f"{path}:") and "invalid YAML" in message
    line = int(message.split(":")[1])
    assert 2 <= line <= 4


def test_wrong_types_unknown_and_missing_keys(write_yaml: Callable[[str, str], Path]) -> None:
    text = GOOD.format(id="bad").replace("block_size: 16", 'block_size: "16"')
    text = text.replace("max_model_len: 2048", "max_model_len: 0\n  bogus: 1")
    text = text.replace("    max_tokens: 56\n", "    max_tokens: lots\n    colour: red\n")
    text = text.replace("description: a small valid scenario\n", "")
    found = problems(write_yaml("bad", text))
    assert f"{found[0].split(':')[0]}:1: description: missing required key" in found
    path = found[0].split(":")[0]
    assert f"{path}:4: config.block_size: Input should be a valid integer, got '16'" in found
    assert any(m.startswith(f"{path}:6: config.max_model_len: must be a positive") for m in found)
    assert f"{path}:7: config.bogus: unknown key" in found
    assert (
        f"{path}:11: requests[0].max_tokens: Input should be a valid integer, got 'lots'" in found
    )
    assert f"{path}:12: requests[0].colour: unknown key" in found


def test_missing_key_of_a_list_item_points_at_the_item(
    write_yaml: Callable[[str, str], Path],
) -> None:
    text = GOOD.format(id="item").replace("  - id: r1\n", "  - prompt_token_ids: [1]\n    x: 1\n")
    text = text.replace("    prompt_token_ids: [389, 444, 400]\n", "")
    path = write_yaml("item", text)
    found = problems(path)
    assert f"{path}:9: requests[0].id: missing required key" in found


# (YAML spelling of the key, how an error names it): keys that would print as nothing or
# as something else are quoted with escapes; a plain key is left alone
UNPRINTABLE_KEYS = [
    ("\xa0", "'\\xa0'"),  # a no-break space, written raw (found by the hypothesis soak)
    ('"\\t"', "'\\t'"),
    ('"\\u200b"', "'\\u200b'"),  # zero-width space
    ('"\\x01"', "'\\x01'"),
    ('""', "''"),
    ('" "', "' '"),
    ('"colour "', "'colour '"),
    ("colour red", "colour red"),
]


@pytest.mark.parametrize(("key", "named"), UNPRINTABLE_KEYS)
def test_unprintable_keys_are_named_with_escapes(
    write_yaml: Callable[[str, str], Path], key: str, named: str
) -> None:
    text = GOOD.format(id="keys").replace(
        "    max_tokens: 56\n", f"    max_tokens: 56\n    {key}: 1\n"
    )
    text = text.replace("  max_model_len: 2048\n", f"  max_model_len: 2048\n  {key}: 2\n")
    path = write_yaml("keys", text)
    assert problems(path) == [
        f"{path}:8: config.{named}: unknown key",
        f"{path}:13: requests[0].{named}: unknown key",
    ]


def test_unprintable_values_and_request_ids_are_quoted(
    write_yaml: Callable[[str, str], Path],
) -> None:
    text = GOOD.format(id="values").replace("tier: scheduler", 'tier: "\\u200b"')
    path = write_yaml("values", text)
    assert problems(path) == [
        f"{path}:3: tier: Input should be 'scheduler', 'serve' or 'both', got '\\u200b'"
    ]
    text = GOOD.format(id="ids").replace("outcome: {r1: wedged}", 'outcome: {"\\t": wedged}')
    path = write_yaml("ids", text)
    assert problems(path) == [f"{path}:15: expect.outcome.'\\t': unknown request '\\t'"]


def test_long_keys_and_values_are_elided(write_yaml: Callable[[str, str], Path]) -> None:
    text = GOOD.format(id="long").replace("tier: scheduler", f"tier: {'x' * 5000}")
    text = text.replace("  max_model_len: 2048\n", f"  max_model_len: 2048\n  {'k' * 500}: 1\n")
    path = write_yaml("long", text)
    found = problems(path)
    tier, key = (f"{path}:3: tier: ", f"{path}:8: config.'{'k' * 37}...{'k' * 38}': unknown key")
    assert found[0].startswith(tier + "Input should be") and found[1] == key, found
    assert found[0].endswith(f", got '{'x' * 37}...{'x' * 38}'") and len(found[0]) < 300


def test_semantic_errors_have_lines(write_yaml: Callable[[str, str], Path]) -> None:
    text = """\
id: not-the-stem
description: d
tier: scheduler
config: {block_size: 16}
requests:
  - id: a
    prompt_token_ids: [1]
    max_tokens: 3
  - id: a
    prompt: hello
    prompt_token_ids: [2]
    max_tokens: 3
    stream: true
  - id: b
    max_tokens: 0
    prompt: text
expect:
  outcome: {zz: finished}
  steps: {9999: {num_free_blocks: 1}}
"""
    path = write_yaml("semantic", text)
    found = problems(path)
    assert found.pop(6).startswith(f"{path}:16: requests[2].prompt: unknown word 'text'")
    assert found == [
        f"{path}:1: id: 'not-the-stem' must equal the file name 'semantic'",
        f"{path}:4: config: the scheduler tier needs num_gpu_blocks_override",
        f"{path}:9: requests[1].id: duplicate request id 'a'",
        f"{path}:9: requests[1]: give exactly one of prompt_token_ids, prompt, messages",
        f"{path}:13: requests[1].stream: a serve-tier key (this scenario is tier: scheduler)",
        f"{path}:15: requests[2].max_tokens: required (>= 1) at the scheduler tier",
        f"{path}:18: expect.outcome.zz: unknown request 'zz'",
        f"{path}:19: expect.steps[9999]: step 9999 is beyond limits.max_steps",
    ]


TEXT = GOOD.replace("prompt_token_ids: [389, 444, 400]", "prompt: {prompt!r}")


def test_text_prompts_are_tokenized_at_the_scheduler_tier(
    write_yaml: Callable[[str, str], Path],
) -> None:
    path = write_yaml("text", TEXT.format(id="text", prompt="<|answer:20|><|think:3|>"))
    (request,) = load_scenario(path).requests
    assert request.prompt_token_ids == [389, 444, 400]  # BOS added, as the server does
    path = write_yaml("words", TEXT.format(id="words", prompt="<|loop|> 7 tick q</s>"))
    (request,) = load_scenario(path).requests
    assert request.prompt_token_ids == [389, 488, 263, 382, 372, 390]


@pytest.mark.parametrize(
    ("prompt", "error"),
    [
        ("<|answer:64|>", "unknown selector '<|answer:64|>' (known: <|think:0|>..<|think:26|>"),
        ("<|anwser:5|> 3", "unknown selector '<|anwser:5|>'"),
        ("<|answer:5|> tik 100", "unknown word ' tik', ' 100': not one token"),
    ],
)
def test_unknown_words_and_selectors_point_at_the_prompt(
    write_yaml: Callable[[str, str], Path], prompt: str, error: str
) -> None:
    path = write_yaml("typo", TEXT.format(id="typo", prompt=prompt))
    (message,) = problems(path)
    assert message.startswith(f"{path}:10: requests[0].prompt: {error}")


def test_a_text_prompt_dumps_as_text_until_its_ids_change(
    write_yaml: Callable[[str, str], Path],
) -> None:
    scenario = load_scenario(write_yaml("dump", TEXT.format(id="dump", prompt="<|answer:3|>")))
    text = dump_scenario(scenario)
    assert "prompt: '<|answer:3|>'" in text and "prompt_token_ids" not in text
    assert parse_scenario(text, "<dump>").model_dump() == scenario.model_dump()
    shrunk = scenario.requests[0].model_copy(update={"prompt_token_ids": [389]})
    text = dump_scenario(scenario.model_copy(update={"requests": [shrunk]}))
    assert "prompt_token_ids: [389]" in text and "prompt:" not in text


def test_duplicate_keys_and_empty_files(write_yaml: Callable[[str, str], Path]) -> None:
    path = write_yaml(
        "dup", GOOD.format(id="dup").replace("tier: scheduler", "tier: serve\ntier: x")
    )
    assert problems(path) == [f"{path}:4: duplicate key 'tier' (first at line 3)"]
    empty = write_yaml("empty", "# nothing\n")
    assert problems(empty) == [f"{empty}:1: empty scenario file"]
    listed = write_yaml("listed", "- 1\n- 2\n")
    (message,) = problems(listed)
    assert message.startswith(f"{listed}:1: scenario: Input should be a valid dictionary")


def test_serve_tier_keys_are_accepted_in_serve_scenarios(
    write_yaml: Callable[[str, str], Path],
) -> None:
    text = """\
id: serve-ok
description: d
tier: serve
config: {reasoning_parser: deepseek_r1, extra_args: [--enable-prompt-tokens-details]}
requests:
  - id: chat
    endpoint: chat
    messages: [{role: user, content: hi}]
    stream: true
    stream_options: {include_usage: true}
    at_ms: 5
    temperature: 0
    stop: [x]
limits: {startup_timeout_s: 60, stall_s: 2.5}
"""
    scenario = load_scenario(write_yaml("serve-ok", text))
    assert scenario.requests[0].messages is not None and scenario.requests[0].stream
    assert scenario.limits.stall_s == 2.5 and scenario.config.reasoning_parser == "deepseek_r1"


def test_dump_round_trips(write_yaml: Callable[[str, str], Path]) -> None:
    scenario = load_scenario(write_yaml("rt", GOOD.format(id="rt")))
    again = parse_scenario(dump_scenario(scenario), "<dump>", stem="rt")
    assert again.model_dump() == scenario.model_dump()


def test_every_committed_scenario_loads_and_round_trips() -> None:
    scenarios = load_scenarios([SCENARIOS])
    assert len(scenarios) >= 15
    for scenario in scenarios:
        assert scenario.expect is not None, scenario.id
        assert (
            parse_scenario(dump_scenario(scenario), "<dump>").model_dump() == scenario.model_dump()
        )


def test_directory_errors_are_collected_across_files(
    write_yaml: Callable[[str, str], Path], tmp_path: Path
) -> None:
    write_yaml("one", GOOD.format(id="one"))
    bad = write_yaml("two", GOOD.format(id="wrong"))
    with pytest.raises(ScenarioError) as info:
        load_scenarios([tmp_path])
    assert [str(p) for p in info.value.problems] == [
        f"{bad}:1: id: 'wrong' must equal the file name 'two'"
    ]
    assert collect_files([tmp_path]) == sorted(tmp_path.glob("*.yaml"))
    write_yaml("ledger", "entries: []\n")
    write_yaml("_draft", "not: a scenario\n")
    assert [p.name for p in collect_files([tmp_path])] == ["one.yaml", "two.yaml"]
    with pytest.raises(ScenarioError, match="no such file"):
        collect_files([tmp_path / "missing.yaml"])


def test_both_tiers_tokenize_for_the_scheduler_and_send_the_text_to_servers(
    write_yaml: Callable[[str, str], Path],
) -> None:
    from parity.serve.spec import request_from_scenario

    text = TEXT.format(id="both", prompt="<|answer:2|>").replace("tier: scheduler", "tier: both")
    (request,) = load_scenario(write_yaml("both", text)).requests
    assert request.prompt_token_ids == [389, 426]
    served = request_from_scenario(request)
    assert served.prompt == "<|answer:2|>" and served.prompt_token_ids is None
