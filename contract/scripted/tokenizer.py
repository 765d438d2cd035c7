"""Tokenizer files of the scripted test model (docs/scripted-model.md, "Tokenizer").

Upstream: none; the files follow the Hugging Face layout that transformers' ``AutoTokenizer``
(``TokenizersBackend``, alias ``PreTrainedTokenizerFast``) and vLLM load: ``tokenizer.json``
(a ``tokenizers`` byte-level BPE, no unknown token), ``tokenizer_config.json``,
``special_tokens_map.json`` and ``generation_config.json``.

BOS is added by the ``TemplateProcessing`` post-processor of ``tokenizer.json``
(``<s> $A``); ``add_bos_token: true`` in ``tokenizer_config.json`` makes transformers rebuild the
same processor. Chat prompts are tokenized without special tokens (the template starts with
``<s>`` itself).
"""

from __future__ import annotations

import json
from typing import Any

from contract.scripted import vocab

MODEL_MAX_LENGTH = 8192

# Zephyr-like, without newlines: <s><|system|>...</s><|user|>...</s><|assistant|>.
# enable_thinking=False pre-fills an empty thinking block after <|assistant|>.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{- '<|system|>' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '<|user|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- '<|assistant|>' -}}"
    "{%- else -%}{{- raise_exception('unsupported chat role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- message['content'] + eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think></think>' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

_BOS_TEXT = vocab.text_of(vocab.BOS)
_EOS_TEXT = vocab.text_of(vocab.EOS)
_PAD_TEXT = vocab.text_of(vocab.PAD)


def _added_token(content: str, special: bool) -> dict[str, Any]:
    return {
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _byte_level(add_prefix_space: bool) -> dict[str, Any]:
    return {
        "type": "ByteLevel",
        "add_prefix_space": add_prefix_space,
        "trim_offsets": True,
        "use_regex": True,
    }


def _bos_post_processor() -> dict[str, Any]:
    bos = {"SpecialToken": {"id": _BOS_TEXT, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            bos,
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": _BOS_TEXT, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {_BOS_TEXT: {"id": _BOS_TEXT, "ids": [vocab.BOS], "tokens": [_BOS_TEXT]}},
    }


def tokenizer_json() -> dict[str, Any]:
    """The ``tokenizers`` serialisation: byte-level BPE over ids 0-388, added tokens 389-511."""
    added = [
        {"id": token_id, **_added_token(content, special)}
        for token_id, content, special in vocab.ADDED_TOKENS
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": _byte_level(add_prefix_space=False),
        "post_processor": _bos_post_processor(),
        "decoder": _byte_level(add_prefix_space=True),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab.bpe_vocab(),
            "merges": [list(pair) for pair in vocab.bpe_merges()],
        },
    }


def tokenizer_config() -> dict[str, Any]:
    """``tokenizer_config.json``: class, special tokens, chat template, length."""
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(token_id): _added_token(content, special)
            for token_id, content, special in vocab.ADDED_TOKENS
        },
        "bos_token": _BOS_TEXT,
        "eos_token": _EOS_TEXT,
        "pad_token": _PAD_TEXT,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def special_tokens_map() -> dict[str, Any]:
    return {"bos_token": _BOS_TEXT, "eos_token": _EOS_TEXT, "pad_token": _PAD_TEXT}


def generation_config() -> dict[str, Any]:
    return {"bos_token_id": vocab.BOS, "eos_token_id": vocab.EOS, "pad_token_id": vocab.PAD}


def tokenizer_files() -> dict[str, bytes]:
    """Every tokenizer-side file of a model folder, as deterministic bytes."""
    documents = {
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config(),
        "special_tokens_map.json": special_tokens_map(),
        "generation_config.json": generation_config(),
    }
    return {name: dump_json(doc) for name, doc in documents.items()}


def dump_json(document: Any) -> bytes:
    """Stable JSON bytes (insertion order, 2-space indent, UTF-8, trailing newline)."""
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
