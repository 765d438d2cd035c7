"""llama.cpp's server (llama-cpp-python) on the GGUF export greedily follows the script.

The server runs from the port env ``.cache/ports/llama-cpp`` (``make port-llama-cpp``), never
the main env; without it every test here fails with a pointer to that target. One server per
module: ``python -m llama_cpp.server --model FILE --n_ctx 4096`` on a free port (llama.cpp pads
n_ctx to a multiple of 256, so 4096 keeps the Python and C sides agreeing), requests one at a
time (``--interrupt_requests False``: by default a second request ends a running stream).

It returns no token ids, so each case checks the text against the script's tokens decoded by
the HF tokenizer, the completion token count (llama.cpp counts no EOS) and, through
``logprobs``, the text of each generated token in order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from contract.scripted import gguf, script, vocab
from parity.process import ManagedProcess, StartupError, free_port

pytestmark = [pytest.mark.server, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
PORT_PYTHON = ROOT / ".cache" / "ports" / "llama-cpp" / "bin" / "python"
N_CTX = 4096
STARTUP_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not PORT_PYTHON.exists():
        pytest.fail(
            f"{PORT_PYTHON.relative_to(ROOT)} is missing: run `make port-llama-cpp` to build "
            "llama-cpp-python into the port env (the llama.cpp server tests need it)"
        )
    folder = tmp_path_factory.mktemp("llama-cpp")
    model = folder / "scripted.gguf"
    gguf.export(model)
    port = free_port()
    argv = [str(PORT_PYTHON), "-m", "llama_cpp.server", "--model", str(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(N_CTX)]
    argv += ["--interrupt_requests", "False", "--verbose", "False"]
    server = ManagedProcess(argv, log_path=folder / "server.log", cwd=folder)
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy(f"{url}/v1/models", STARTUP_TIMEOUT_S)  # it has no /health
    except StartupError as exc:
        server.stop()
        pytest.fail(f"llama_cpp.server did not start: {exc}\n{exc.log_tail}")
    try:
        yield url
    finally:
        server.stop()


def _piece(token_id: int) -> str:
    """A token's text as llama-cpp-python's logprobs show it (its bytes, partial UTF-8 dropped)."""
    raw = bytes([token_id]) if token_id < vocab.NUM_BYTES else vocab.text_of(token_id).encode()
    return raw.decode("utf-8", errors="ignore")


def _check(choice: dict, usage: dict, expected: list[int], text: str, pieces: list[str]) -> None:
    ends_in_eos = bool(expected) and expected[-1] == vocab.EOS
    generated = expected[:-1] if ends_in_eos else expected
    assert text == choice_text(choice)
    assert choice["finish_reason"] == ("stop" if ends_in_eos else "length")
    assert usage["completion_tokens"] == len(generated)
    assert pieces == [_piece(t) for t in generated]


def choice_text(choice: dict) -> str:
    return choice["text"] if "text" in choice else choice["message"]["content"]


def _long_text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice([" A", " B", " hello", " 7", "x", "\n"]) for _ in range(words))


COMPLETION_CASES = {
    "count-down": ("<|answer:9|>", 12, 0),
    "text-then-selector": ("count <|answer:4|>", 12, 0),
    "loop-length": ("<|loop|>", 12, 0),
    "letters-to-end-think": (" a", 30, 0),
    "utf8": ("<|utf8|>", 20, 0),
    "min-tokens": ("<|answer:2|>", 20, 6),
    "long-1200": ("<|think:5|>" + _long_text(random.Random(1), 700) + "<|answer:3|><|assistant|>", 20, 0),
}  # fmt: skip


@pytest.mark.parametrize("case", COMPLETION_CASES)
def test_completions_follow_the_script(llama_server: str, hf_tokenizer, case: str) -> None:
    prompt, max_tokens, min_tokens = COMPLETION_CASES[case]
    ids = hf_tokenizer(prompt)["input_ids"]
    expected = script.expected(ids, max_tokens, min_tokens=min_tokens)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}
    if min_tokens:
        body["min_tokens"] = min_tokens
    reply = httpx.post(f"{llama_server}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["usage"]["prompt_tokens"] == len(ids)
    if case == "long-1200":
        assert len(ids) > 1000
    choice = data["choices"][0]
    text = hf_tokenizer.decode(expected, skip_special_tokens=True)
    _check(choice, data["usage"], expected, text, choice["logprobs"]["tokens"])


CHAT_CASES = {
    "think-answer": (None, "<|think:3|><|answer:2|>", 20),
    "system": ("be brief", "<|answer:4|>", 12),
    "think-budget-short": (None, "<|think:20|><|answer:2|>", 8),
    "long-1100": (None, "<|think:4|>" + " b" * 1100 + "<|answer:5|>", 20),
}


@pytest.mark.parametrize("case", CHAT_CASES)
def test_chat_follows_the_script(
    llama_server: str, hf_tokenizer, chat_ids: Callable[..., list[int]], case: str
) -> None:
    system, user, max_tokens = CHAT_CASES[case]
    ids = chat_ids(user, system=system)
    expected = script.expected(ids, max_tokens)
    messages = [{"role": "user", "content": user}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    body |= {"logprobs": True, "top_logprobs": 1}
    reply = httpx.post(f"{llama_server}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["usage"]["prompt_tokens"] == len(ids)
    choice = data["choices"][0]
    pieces = [entry["token"] for entry in choice["logprobs"]["content"]]
    text = hf_tokenizer.decode(expected, skip_special_tokens=True)
    _check(choice, data["usage"], expected, text, pieces)


def _stream(url: str, body: dict) -> list[dict]:
    frames: list[dict] = []
    with httpx.stream("POST", url, json=body, timeout=REQUEST_TIMEOUT_S) as reply:
        assert reply.status_code == 200
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    frames = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    return frames


def test_streamed_completion_holds_back_partial_utf8(llama_server: str, hf_tokenizer) -> None:
    ids = hf_tokenizer("<|utf8|>")["input_ids"]
    expected = script.expected(ids, 20)
    body = {"prompt": "<|utf8|>", "max_tokens": 20, "temperature": 0, "stream": True}
    frames = _stream(f"{llama_server}/v1/completions", body)
    deltas = [frame["choices"][0]["text"] for frame in frames]
    assert "".join(deltas) == hf_tokenizer.decode(expected, skip_special_tokens=True) == "🙂中文"
    assert all("\ufffd" not in delta for delta in deltas)
    assert frames[-1]["choices"][0]["finish_reason"] == "stop"


def test_streamed_chat_reasoning_case(
    llama_server: str, hf_tokenizer, chat_ids: Callable[..., list[int]]
) -> None:
    user = "<|think:3|><|answer:2|>"
    expected = script.expected(chat_ids(user), 20)
    body = {"messages": [{"role": "user", "content": user}], "max_tokens": 20, "stream": True}
    frames = _stream(f"{llama_server}/v1/chat/completions", body | {"temperature": 0})
    deltas = [frame["choices"][0]["delta"] for frame in frames]
    assert deltas[0] == {"role": "assistant"}
    text = "".join(delta.get("content", "") for delta in deltas[1:])
    assert text == hf_tokenizer.decode(expected, skip_special_tokens=True)
    assert text == "<think> x y z</think> 1 0"
    assert frames[-1]["choices"][0]["finish_reason"] == "stop"
