"""The built tokenizer files, loaded by transformers and by ``tokenizers`` directly (offline)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from contract.scripted import vocab
from contract.scripted.script import UTF8_BYTES
from contract.scripted.vocab import ASSISTANT, BOS, END_THINK, EOS, THINK, USER

pytestmark = pytest.mark.timeout(120)

NOT_SPECIAL = {THINK, END_THINK, *vocab.SELECTORS}


def test_tokenizer_class_and_special_ids(hf_tokenizer) -> None:
    assert type(hf_tokenizer).__name__ in {"TokenizersBackend", "PreTrainedTokenizerFast"}
    assert len(hf_tokenizer) == vocab.VOCAB_SIZE
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id) == (BOS, EOS)
    assert hf_tokenizer.pad_token_id == vocab.PAD
    assert hf_tokenizer.model_max_length == 8192
    assert hf_tokenizer.unk_token is None


@pytest.mark.parametrize("text", sorted(vocab.WORDS))
def test_every_word_is_one_token_and_round_trips(hf_tokenizer, text: str) -> None:
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert ids == [vocab.word(text)]
    assert hf_tokenizer.decode(ids) == text
    assert hf_tokenizer.convert_ids_to_tokens(ids) == [text.replace(" ", "Ġ")]


def test_every_added_token_is_one_id_with_its_special_flag(hf_tokenizer) -> None:
    for token_id, content, special in vocab.ADDED_TOKENS:
        assert hf_tokenizer.encode(content, add_special_tokens=False) == [token_id], content
        assert hf_tokenizer.decode([token_id]) == content
        kept = hf_tokenizer.decode([token_id], skip_special_tokens=True)
        assert kept == ("" if special else content), content
        assert special == (token_id not in NOT_SPECIAL)


def test_byte_tokens_round_trip_and_numbers_split(hf_tokenizer) -> None:
    assert hf_tokenizer.encode("A", add_special_tokens=False) == [ord("A")]
    assert hf_tokenizer.decode(list(UTF8_BYTES)) == "🙂中文"
    assert hf_tokenizer.encode(" 100", add_special_tokens=False) == [vocab.number(10), ord("0")]
    text = " 3 2 1 0 tick tock um x"
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert ids == [vocab.word(w) for w in (" 3", " 2", " 1", " 0", " tick", " tock", " um", " x")]


def test_bos_is_added_automatically(hf_tokenizer, scripted_model_dir: Path) -> None:
    assert hf_tokenizer("7").input_ids == [BOS, ord("7")]
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(scripted_model_dir / "tokenizer.json"))
    assert raw.encode("<|think:3|> 5").ids == [BOS, vocab.think_selector(3), vocab.number(5)]
    assert raw.get_vocab_size() == vocab.VOCAB_SIZE


def test_chat_template(hf_tokenizer, chat_ids: Callable[..., list[int]]) -> None:
    messages = [{"role": "user", "content": "<|think:3|><|answer:2|>"}]
    text = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<s><|user|><|think:3|><|answer:2|></s><|assistant|>"
    user = [vocab.think_selector(3), vocab.answer_selector(2)]
    assert chat_ids("<|think:3|><|answer:2|>") == [BOS, USER, *user, EOS, ASSISTANT]
    no_think = chat_ids("<|think:3|><|answer:2|>", enable_thinking=False)
    assert no_think == [BOS, USER, *user, EOS, ASSISTANT, THINK, END_THINK]
    assert chat_ids("hi", enable_thinking=True) == chat_ids("hi")


def test_chat_template_system_and_history(hf_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": " 1 0"},
        {"role": "user", "content": "V"},
    ]
    text = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<s><|system|>S</s><|user|>U</s><|assistant|> 1 0</s><|user|>V</s><|assistant|>"
    assert not hf_tokenizer.apply_chat_template(messages, tokenize=False).endswith("<|assistant|>")
