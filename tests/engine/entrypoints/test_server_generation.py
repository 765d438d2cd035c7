"""The server's generation endpoints against the scripted model: tokens equal the script.

One server per module (``scripted_server``): ``--block-size 32 --max-model-len 512
--reasoning-parser deepseek_r1``. Expected outputs come from ``contract.scripted.script``
(the script vLLM itself follows token for token, docs/oracle-on-cpu.md).
"""

from __future__ import annotations

import json

import httpx
import pytest

from contract.scripted import vocab
from contract.scripted.script import expected

pytestmark = [pytest.mark.server, pytest.mark.timeout(180)]

PROMPTS = [
    [vocab.BOS, vocab.answer_selector(2)],
    [vocab.BOS, vocab.answer_selector(12)],
    [vocab.BOS, vocab.LOOP],
    [vocab.BOS, vocab.UTF8],
    [vocab.BOS, vocab.number(7), vocab.letter("c")],
    [vocab.BOS] + [vocab.number(i % 100) for i in range(40)] + [vocab.answer_selector(5)],
]


def completion(client: httpx.Client, **body: object) -> dict:
    response = client.post("/v1/completions", json={"model": "scripted", **body})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("prompt", PROMPTS, ids=range(len(PROMPTS)))
@pytest.mark.parametrize("max_tokens", [1, 5, 30])
def test_token_prompt_matches_script(
    client: httpx.Client, prompt: list[int], max_tokens: int
) -> None:
    body = completion(client, prompt=prompt, max_tokens=max_tokens, return_token_ids=True)
    choice = body["choices"][0]
    want = expected(prompt, max_tokens)
    assert choice["token_ids"] == want
    assert choice["prompt_token_ids"] == prompt
    assert choice["finish_reason"] == ("stop" if want[-1] == vocab.EOS else "length")
    assert choice["stop_reason"] is None
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "total_tokens": len(prompt) + len(want),
        "completion_tokens": len(want),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_text_prompt_is_tokenized_with_bos(client: httpx.Client) -> None:
    body = completion(client, prompt="<|answer:3|>", max_tokens=8, return_token_ids=True)
    prompt = [vocab.BOS, vocab.answer_selector(3)]
    assert body["choices"][0]["prompt_token_ids"] == prompt
    assert body["choices"][0]["token_ids"] == expected(prompt, 8)
    assert body["choices"][0]["text"] == " 2 1 0"


def test_default_max_tokens_is_16(client: httpx.Client) -> None:
    prompt = [vocab.BOS, vocab.LOOP]
    body = completion(client, prompt=prompt, return_token_ids=True)
    assert body["choices"][0]["token_ids"] == expected(prompt, 16)
    assert body["usage"]["completion_tokens"] == 16


def test_streaming_completion_chunks_carry_the_tokens_in_order(client: httpx.Client, sse) -> None:
    prompt = [vocab.BOS, vocab.answer_selector(4)]
    want = expected(prompt, 10)
    response = client.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": 10, "stream": True, "return_token_ids": True,
              "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = sse(response.text)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    # one token a chunk, unless the writer fell behind and the collector merged some (see
    # test_chat_stream_framing): every chunk carries tokens, in order
    assert [t for c in token_chunks for t in c["choices"][0]["token_ids"]] == want
    assert all(c["choices"][0]["token_ids"] for c in token_chunks)
    assert token_chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    # Later chunks carry an explicit null (upstream sets the field on every chunk).
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in token_chunks[1:])
    finish = [c["choices"][0]["finish_reason"] for c in token_chunks]
    assert finish == [None] * (len(finish) - 1) + ["stop"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 2 + len(want),
        "completion_tokens": len(want),
    }
    assert "".join(c["choices"][0]["text"] for c in token_chunks) == " 3 2 1 0"


def test_streaming_utf8_whole_characters(client: httpx.Client, sse) -> None:
    response = client.post(
        "/v1/completions",
        json={"prompt": [vocab.BOS, vocab.UTF8], "max_tokens": 20, "stream": True},
    )
    texts = [json.loads(f)["choices"][0]["text"] for f in sse(response.text)[:-1]]
    assert "".join(texts) == "🙂中文"
    assert all("\ufffd" not in t for t in texts)  # no chunk ends inside a character


def test_logprobs_follow_the_script_ranking(client: httpx.Client) -> None:
    from contract.scripted.script import ranked

    prompt = [vocab.BOS, vocab.answer_selector(6)]
    body = completion(client, prompt=prompt, max_tokens=3, logprobs=3, return_token_ids=True)
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    context = list(prompt)
    for i, token_id in enumerate(choice["token_ids"]):
        top = list(logprobs["top_logprobs"][i])
        want = [vocab.text_of(t) for t in ranked(context)[:3]]
        assert top == want  # the sampled token is rank 1: no extra entry
        assert logprobs["tokens"][i] == vocab.text_of(token_id)
        assert logprobs["token_logprobs"][i] == pytest.approx(logprobs["top_logprobs"][i][top[0]])
        context.append(token_id)
    offsets = logprobs["text_offset"]
    assert offsets == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(offsets))]


def test_stop_string_truncates(client: httpx.Client) -> None:
    prompt = [vocab.BOS, vocab.answer_selector(12)]
    body = completion(client, prompt=prompt, max_tokens=20, stop=[" 7"])
    assert body["choices"][0]["text"] == " 11 10 9 8"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["stop_reason"] == " 7"


def test_stop_token_id_reported(client: httpx.Client) -> None:
    prompt = [vocab.BOS, vocab.answer_selector(12)]
    stop = vocab.number(7)
    body = completion(
        client, prompt=prompt, max_tokens=20, stop_token_ids=[stop], return_token_ids=True
    )
    assert body["choices"][0]["token_ids"] == expected(prompt, 20, stop_token_ids=[stop])
    assert body["choices"][0]["stop_reason"] == stop
    assert body["choices"][0]["text"] == " 11 10 9 8"


def test_batch_of_prompts(client: httpx.Client) -> None:
    prompts = PROMPTS[:3]
    body = completion(client, prompt=prompts, max_tokens=6, return_token_ids=True)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in body["choices"]] == [expected(p, 6) for p in prompts]


def test_concurrent_streams_match_script(scripted_server, sse) -> None:
    import asyncio

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> list[int]:
        body = {"prompt": prompt, "max_tokens": 24, "stream": True, "return_token_ids": True,
                "ignore_eos": True}  # fmt: skip
        response = await client.post("/v1/completions", json=body)
        frames = sse(response.text)[:-1]
        return [t for f in frames for t in json.loads(f)["choices"][0]["token_ids"]]

    async def run() -> list[list[int]]:
        async with httpx.AsyncClient(base_url=scripted_server.url, timeout=120) as c:
            return await asyncio.gather(*(one(c, PROMPTS[i % len(PROMPTS)]) for i in range(16)))

    results = asyncio.run(run())
    for i, tokens in enumerate(results):
        assert tokens == expected(PROMPTS[i % len(PROMPTS)], 24, ignore_eos=True)


CHAT = [{"role": "user", "content": "<|think:3|><|answer:2|>"}]


def chat(client: httpx.Client, **body: object) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "scripted", "messages": CHAT, **body})


def test_chat_reasoning_split(client: httpx.Client) -> None:
    body = chat(client, max_tokens=200).json()
    message = body["choices"][0]["message"]
    assert message["reasoning"] == " x y z"
    assert message["content"] == " 1 0"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == 6
    assert body["usage"]["completion_tokens"] == 8
    assert body["usage"]["total_tokens"] == 14
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


def test_chat_reasoning_budget_exhausted(client: httpx.Client) -> None:
    body = chat(client, max_tokens=3).json()
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["reasoning"] == " x y"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}


def test_chat_default_max_tokens_is_the_headroom(client: httpx.Client) -> None:
    body = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "<|loop|>"}], "return_token_ids": True},
    ).json()
    prompt_len = body["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == 512 - prompt_len
    assert body["choices"][0]["finish_reason"] == "length"


def _joined(deltas: list[dict], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas)


def test_chat_stream_framing(client: httpx.Client, sse) -> None:
    response = chat(client, max_tokens=200, stream=True, stream_options={"include_usage": True})
    frames = sse(response.text)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    # One frame per token on a quiet machine; a consumer that falls behind gets adjacent
    # outputs merged into one frame (the DELTA collector in output_processor.py, as upstream),
    # so the frames must be a coarsening of the per-token ones, in order. A ``<think>`` delta
    # merged with later tokens keeps the marker's text as reasoning, as upstream's parser does
    # (reasoning/basic_parsers.py), where the marker alone gives no frame.
    assert _joined(deltas, "reasoning") in (" x y z", "<think> x y z")
    assert _joined(deltas, "content") == " 1 0"
    kinds = [key for d in deltas for key in d if d[key]]
    assert kinds == sorted(kinds, key=["reasoning", "content"].index)
    assert 1 <= len(deltas) <= 6  # five tokens and the finish frame, at most
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 6, "total_tokens": 14, "completion_tokens": 8,
        "completion_tokens_details": {"reasoning_tokens": 3},
    }  # fmt: skip
    assert len({c["id"] for c in chunks}) == 1


def test_chat_stream_reasoning_never_ends(client: httpx.Client, sse) -> None:
    response = chat(client, max_tokens=3, stream=True)
    chunks = [json.loads(f) for f in sse(response.text)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    assert all("content" not in d for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_enable_thinking_false(client: httpx.Client, sse) -> None:
    """The prompt closes ``</think>``: streaming sees that (all content); non-streaming ignores
    the prompt and, finding no ``</think>`` in the output, calls it all reasoning (upstream)."""
    kwargs = {"enable_thinking": False}
    body = chat(client, max_tokens=50, chat_template_kwargs=kwargs).json()
    message = body["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == (" 1 0", None)
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    response = chat(client, max_tokens=50, chat_template_kwargs=kwargs, stream=True)
    deltas = [json.loads(f)["choices"][0]["delta"] for f in sse(response.text)[1:-1]]
    assert _joined(deltas, "content") == " 1 0"  # frames may merge (test_chat_stream_framing)
    assert deltas[-1].get("content") is not None
    assert all("reasoning" not in d for d in deltas)


def test_models_health_version(client: httpx.Client, scripted_server) -> None:
    models = client.get("/v1/models").json()
    card = models["data"][0]
    assert models["object"] == "list"
    assert (card["id"], card["owned_by"], card["max_model_len"]) == ("scripted", "vllm", 512)
    assert card["root"] == str(scripted_server.model_dir)
    assert client.get("/health").status_code == 200
    assert client.get("/version").json() == {"version": "0.32.0"}


def test_metrics_names(client: httpx.Client) -> None:
    completion(client, prompt=PROMPTS[0], max_tokens=4)
    text = client.get("/metrics").text
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count", "vllm:cache_config_info",
    ):  # fmt: skip
        assert f"\n{name}{{" in text, name
    assert (
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="scripted"}'
        in text
    )
    assert 'vllm:num_requests_running{engine="0",model_name="scripted"} 0.0' in text
