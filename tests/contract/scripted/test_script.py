"""The pure-Python script (contract/scripted/script.py) against docs/scripted-model.md's tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.scripted import script, vocab
from contract.scripted.script import ScriptError, ScriptState, expected, next_token, ranked
from contract.scripted.vocab import (
    ASSISTANT,
    BOS,
    END_THINK,
    EOS,
    LOOP,
    THINK,
    TICK,
    TOCK,
    UM,
    USER,
    UTF8,
    answer_selector,
    letter,
    number,
    think_selector,
)

pytestmark = pytest.mark.timeout(60)


def words(*items: str) -> list[int]:
    """Token ids of space-separated words (" 3", " x", " um") and added tokens by content."""
    out = []
    for item in items:
        out.append(vocab.ADDED[item] if item.startswith("<") else vocab.word(" " + item))
    return out


def chat(*user: int) -> list[int]:
    return [BOS, USER, *user, EOS, ASSISTANT]


def test_count_down_ends_in_eos() -> None:
    assert expected([number(5)], 50) == [*words("4", "3", "2", "1", "0"), EOS]
    assert expected([number(0)], 50) == [EOS]


def test_max_new_tokens_caps_the_output() -> None:
    assert expected([number(99)], 3) == words("98", "97", "96")
    assert expected([number(99)], 0) == []
    assert len(expected([number(99)], 200)) == 100  # " 98" .. " 0" and </s>


def test_letters_run_to_end_of_thinking() -> None:
    assert expected([letter("w")], 6)[:4] == [*words("x", "y", "z"), END_THINK]


def test_tick_tock_never_ends() -> None:
    assert expected([LOOP], 6) == [TICK, TOCK, TICK, TOCK, TICK, TOCK]


def test_um_and_eos() -> None:
    assert next_token([UM]) == EOS
    assert next_token([EOS]) == EOS


def test_other_tokens_say_their_last_digit() -> None:
    assert next_token([ord("o")]) == number(ord("o") % 10)
    assert next_token([vocab.PAD]) == number(vocab.PAD % 10)
    assert next_token([vocab.RESERVED_BASE + 3]) == number((vocab.RESERVED_BASE + 3) % 10)


def test_utf8_spells_its_bytes_then_stops() -> None:
    out = expected([UTF8], 20)
    assert out[-1] == EOS
    assert bytes(out[:-1]).decode("utf-8") == "🙂中文"


@pytest.mark.parametrize("k", [0, 1, 3, 26])
def test_think_selector_chooses_thinking_length(k: int) -> None:
    out = expected([think_selector(k)], 100)
    assert out[0] == THINK
    end = out.index(END_THINK)
    assert out[1:end] == [letter(chr(ord("z") - k + 1 + i)) for i in range(k)]
    assert out[end + 1 :] == [*words("4", "3", "2", "1", "0"), EOS]  # default answer " 4"


@pytest.mark.parametrize("m", [0, 1, 2, 63])
def test_answer_selector_chooses_answer_length(m: int) -> None:
    assert expected([answer_selector(m)], 100) == [*(number(n) for n in reversed(range(m))), EOS]


def test_chat_thinks_then_answers() -> None:
    prompt = chat(think_selector(3), answer_selector(2))
    assert expected(prompt, 50) == [THINK, *words("x", "y", "z"), END_THINK, *words("1", "0"), EOS]


def test_chat_with_thinking_disabled_answers_after_end_think() -> None:
    prompt = [*chat(think_selector(3), answer_selector(2)), THINK, END_THINK]
    assert expected(prompt, 50) == [*words("1", "0"), EOS]


def test_chat_defaults() -> None:
    assert expected(chat(), 50) == [*words("4", "3", "2", "1", "0"), EOS]
    assert expected(chat(answer_selector(0)), 50) == [EOS]
    assert expected(chat(LOOP), 3) == [TICK, TOCK, TICK]
    assert expected(chat(think_selector(0)), 50)[:2] == [THINK, END_THINK]


def test_selector_anywhere_earlier_in_the_sequence() -> None:
    prompt = [answer_selector(3), *([ord("q")] * 500), ASSISTANT]
    assert expected(prompt, 10) == [*words("2", "1", "0"), EOS]


def test_min_tokens_masks_eos_and_um_is_the_runner_up() -> None:
    out = expected([number(2)], 50, min_tokens=6)
    assert out == [*words("1", "0", "um", "um", "um", "um"), EOS]


def test_min_tokens_masks_eos_even_with_ignore_eos() -> None:
    out = expected([number(1)], 4, min_tokens=3, ignore_eos=True)
    assert out == [number(0), UM, UM, EOS]


def test_min_tokens_masks_stop_token_ids() -> None:
    out = expected([number(3)], 10, min_tokens=2, stop_token_ids=[number(2)])
    # " 2" is masked at step 1: the runner-up " um" comes, then " um" -> </s>.
    assert out == [UM, UM, EOS]


def test_stop_token_ids_stop_and_are_included() -> None:
    assert expected([number(9)], 50, stop_token_ids=[number(5)]) == words("8", "7", "6", "5")


def test_ignore_eos_keeps_going() -> None:
    assert expected([number(1)], 5, ignore_eos=True) == [number(0), EOS, EOS, EOS, EOS]


def test_bad_requests_are_script_errors() -> None:
    with pytest.raises(ScriptError, match="two distinct think selectors"):
        expected([think_selector(1), think_selector(2)], 5)
    with pytest.raises(ScriptError, match="two distinct answer selectors"):
        expected([answer_selector(1), LOOP], 5)
    with pytest.raises(ScriptError, match="empty"):
        expected([], 5)
    with pytest.raises(ScriptError, match="out of range"):
        expected([512], 5)
    with pytest.raises(ScriptError, match="min_tokens"):
        expected([number(3)], 2, min_tokens=3)
    with pytest.raises(ScriptError, match="masks all"):
        expected([number(3)], 2, min_tokens=1, stop_token_ids=ranked([number(3)]))


def test_repeated_selector_is_allowed() -> None:
    assert expected([answer_selector(2), answer_selector(2), ASSISTANT], 5) == [
        *words("1", "0"),
        EOS,
    ]


@pytest.mark.parametrize("token_id", range(vocab.VOCAB_SIZE))
def test_single_token_ranks_are_tie_free_with_um_runner_up(token_id: int) -> None:
    order = ranked([BOS, token_id])
    scores = script.scores([BOS, token_id])
    assert len(order) >= 22
    assert len({scores[t] for t in order}) == len(order)
    assert order[0] == next_token([BOS, token_id])
    if order[0] != UM:
        assert order[1] == UM
    # The ladder 'A' > 'B' > ... > 'T' closes the tie-free ranks.
    assert order[-20:] == list(range(ord("A"), ord("T") + 1))
    assert scores[order[0]] - scores[order[1]] >= 16


def test_selector_votes_override_context_defaults() -> None:
    think, answer = think_selector(4), answer_selector(7)
    order = ranked([think, answer, ASSISTANT])
    assert order[:3] == [THINK, number(6), UM]  # without <think> it would answer " 6"
    assert ranked([think, THINK])[:2] == [letter("w"), UM]
    assert ranked([answer, END_THINK])[:2] == [number(6), UM]


def test_only_selectors_in_context_fire_the_heads() -> None:
    # A head's attention has nowhere else to go: modelled, so ranks still match the weights.
    assert ranked([think_selector(3)])[:3] == [THINK, letter("x"), UM]
    assert ranked([answer_selector(5)])[:2] == [number(4), UM]


def test_logits_are_dense_and_agree_with_ranked() -> None:
    context = [BOS, USER, think_selector(2), EOS, ASSISTANT]
    dense = script.logits(context)
    assert len(dense) == vocab.VOCAB_SIZE
    order = ranked(context)
    assert sorted(range(vocab.VOCAB_SIZE), key=lambda t: -dense[t])[: len(order)] == order
    assert all(dense[t] <= 0 for t in range(vocab.VOCAB_SIZE) if t not in order)


_SAFE = [t for t in range(vocab.VOCAB_SIZE) if not vocab.is_selector(t)]


@st.composite
def prompts(draw: st.DrawFn) -> list[int]:
    body = draw(st.lists(st.sampled_from(_SAFE), min_size=1, max_size=40))
    for family_ids in (range(397, 424), range(424, 490)):
        if draw(st.booleans()):
            at = draw(st.integers(0, len(body)))
            body.insert(at, draw(st.sampled_from(list(family_ids))))
    return body


@settings(max_examples=200, deadline=None)
@given(prompts(), st.integers(0, 40), st.integers(0, 40))
def test_expected_is_greedy_and_prefix_consistent(prompt: list[int], n: int, extra: int) -> None:
    out = expected(prompt, n)
    longer = expected(prompt, n + extra)
    assert longer[: len(out)] == out
    state = ScriptState()
    for token_id in prompt:
        state.push(token_id)
    for i, token_id in enumerate(out):
        assert next_token(prompt + out[:i]) == token_id
        assert state.next_token() == token_id and state.ranked() == ranked(prompt + out[:i])
        state.push(token_id)
    assert len(out) == n or out[-1] == EOS


def _reference_ranked(context: list[int]) -> list[int]:
    """``ranked`` recomputed from ``scores`` (never memoised)."""
    scores = script.scores(context)
    return sorted((t for t, s in scores.items() if s > 0), key=lambda t: (-scores[t], t))


@st.composite
def contexts(draw: st.DrawFn) -> list[int]:
    """Contexts dense in selectors (one of each family at most) and the tokens they key on."""
    think = draw(st.sampled_from(range(397, 424)))
    answer = draw(st.sampled_from(range(424, 490)))
    special = [ASSISTANT, THINK, END_THINK, think, answer]
    token = st.one_of(st.sampled_from(_SAFE), st.sampled_from(special))
    return draw(st.lists(token, min_size=1, max_size=60))


@settings(max_examples=300, deadline=None)
@given(contexts(), st.data())
def test_script_state_agrees_with_whole_context_functions(
    context: list[int], data: st.DataObject
) -> None:
    state = ScriptState()
    snapshots: list[tuple[int, ScriptState]] = []
    for i, token_id in enumerate(context):
        state.push(token_id)
        prefix = context[: i + 1]
        want = _reference_ranked(prefix)
        assert state.num_tokens == i + 1
        assert state.ranked() == want == ranked(prefix)
        assert state.next_token() == want[0] == next_token(prefix)
        if data.draw(st.booleans()):
            snapshots.append((i + 1, state.copy()))
    again = ScriptState.from_tokens(context)
    assert again.key() == state.key() and again.ranked() == state.ranked()
    for length, snapshot in snapshots:  # copies are independent of later pushes
        assert snapshot.num_tokens == length
        assert snapshot.ranked() == _reference_ranked(context[:length])


def test_script_state_ranking_is_shared_but_ranked_is_a_fresh_list() -> None:
    state = ScriptState.from_tokens([BOS, number(3)])
    order = state.ranked()
    order.clear()
    assert state.ranked() == _reference_ranked([BOS, number(3)])
    assert ScriptState.from_tokens([USER, number(3)]).key() == state.key()
    with pytest.raises(ScriptError, match="non-empty"):
        ScriptState().next_token()


def test_new_state_uses_the_script_state_or_asks_with_the_whole_context() -> None:
    assert isinstance(script.new_state(script), ScriptState)
    assert isinstance(script.new_state(), ScriptState)
    asked: list[list[int]] = []

    class WholeContext:
        def next_token(self, context: list[int]) -> int:
            asked.append(list(context))
            return next_token(context)

        def ranked(self, context: list[int]) -> list[int]:
            return ranked(context)

    state = script.new_state(WholeContext())
    assert isinstance(state, script.ContextState)
    state.extend([BOS, number(2)])
    state.push(number(1))
    assert state.num_tokens == 3
    assert state.next_token() == number(0) and state.ranked() == ranked([BOS, number(2), number(1)])
    assert asked == [[BOS, number(2), number(1)]]
