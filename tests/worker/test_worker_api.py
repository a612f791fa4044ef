"""The OpenAI API surface of the worker, through the official ``openai`` client (sync and
async) against a real server: chat completions, several prompts, stop strings, model
cards and the operational endpoints."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from gpuscope import __version__
from support.span_recorder import SpanRecorder
from support.worker_servers import SMALL, attrs, serve_worker

MODEL = SMALL.model_name
MODES = ["none", "static", "dynamic", "continuous"]
PROMPT = "hello world"  # its greedy continuation varies enough to pick stop strings from


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("mode", MODES)
async def test_worker_chat_completions_whole_and_streamed(
    mode: str, span_recorder: SpanRecorder
) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "!"}],
        },
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again?"},
    ]
    with serve_worker(span_recorder, batching=mode, max_batch_size=4) as url:
        client = _async_client(url)
        whole = await client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=9, seed=3, top_p=0.5
        )
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=9,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        roles, deltas, reasons, usages = [], [], [], []
        async for chunk in stream:
            for choice in chunk.choices:
                roles.append(choice.delta.role)
                deltas.append(choice.delta.content or "")
                reasons.append(choice.finish_reason)
            usages.append(chunk.usage)
        await client.close()
    answer = whole.choices[0]
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert answer.message.role == "assistant" and answer.finish_reason == "length"
    assert len(answer.message.content or "") == 9
    prompt = "<|system|>\nBe brief.\n<|user|>\nHi !\n<|assistant|>\nHello.\n<|user|>\nAgain?\n"
    prompt_tokens = len(prompt + "<|assistant|>\n")
    assert whole.usage is not None and whole.usage.prompt_tokens == prompt_tokens
    assert whole.usage.completion_tokens == 9
    assert "".join(deltas) == answer.message.content  # greedy: the same text both ways
    assert roles[0] == "assistant" and reasons[-1] == "length" and set(reasons[:-1]) == {None}
    assert usages[:-1] == [None] * (len(usages) - 1)  # "usage": null on content chunks
    assert usages[-1] is not None and usages[-1].completion_tokens == 9
    span_recorder.wait_for(lambda s: len(s.server_spans("/v1/chat/completions")) == 2)
    for span in span_recorder.server_spans("/v1/chat/completions"):
        found = attrs(span)
        assert found["gen_ai.operation.name"] == "chat"
        assert found["gen_ai.usage.input_tokens"] == prompt_tokens
        assert found["gen_ai.usage.output_tokens"] == 9
        assert "gpuscope.compute.duration" in found


def test_worker_chat_with_the_sync_client() -> None:
    with serve_worker(batching="continuous") as url:
        client = _client(url)
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
            )
        )
        several = client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2
            )
        client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer.choices[0].message.content and len(text) == 5
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage field at all
    assert refused.value.status_code == 400 and "n=1" in str(refused.value)
    assert [len(choice.text) for choice in several.choices] == [3, 3]


async def _reference(client: openai.AsyncOpenAI, max_tokens: int) -> str:
    done = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=max_tokens)
    return done.choices[0].text


@pytest.mark.parametrize("mode", MODES)
async def test_worker_stop_strings_end_generation_exactly_there(
    mode: str, span_recorder: SpanRecorder
) -> None:
    with serve_worker(span_recorder, batching=mode, max_batch_size=4) as url:
        client = _async_client(url)
        full = await _reference(client, 40)
        stops = [full[25:28], full[12:15]]  # the earlier one must win
        cut = min(full.find(stop) for stop in stops)
        whole = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=40, stop=stops
        )
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, stop="zzzz"
        )
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=40, stop=stops[1], stream=True
        )
        pieces, reasons = [], []
        async for chunk in stream:
            pieces += [c.text for c in chunk.choices]
            reasons += [c.finish_reason for c in chunk.choices]
        await client.close()
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            health = (await http.get("/healthz")).json()
    assert whole.choices[0].text == full[:cut]
    assert whole.choices[0].finish_reason == "stop"
    # Every token is one character: generation ended with the stop string's last token.
    assert whole.usage is not None and whole.usage.completion_tokens == cut + 3
    assert "".join(pieces) == full[: full.find(stops[1])] and reasons[-1] == "stop"
    assert chat.choices[0].finish_reason == "length"  # a stop string that never comes
    assert health["completions"]["completed"] == 4 and health["completions"]["cancelled"] == 0
    span_recorder.wait_for(lambda s: len(s.server_spans("/v1/completions")) == 3)
    stopped = [
        attrs(s)
        for s in span_recorder.server_spans("/v1/completions")
        if attrs(s)["gen_ai.usage.output_tokens"] < 40
    ]
    assert len(stopped) == 2
    assert all("gpuscope.compute.duration" in found for found in stopped)


@pytest.mark.parametrize("mode", MODES)
async def test_worker_several_prompts_are_choices_batched_together(
    mode: str, span_recorder: SpanRecorder
) -> None:
    prompts = [PROMPT, "hi", "another prompt"]
    with serve_worker(span_recorder, batching=mode, max_batch_size=4, max_queue_delay_ms=50) as url:
        client = _async_client(url)
        alone = [
            await client.completions.create(model=MODEL, prompt=p, max_tokens=6) for p in prompts
        ]
        together = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=6)
        stream = await client.completions.create(
            model=MODEL,
            prompt=prompts,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        streamed: dict[int, str] = {}
        usages = []
        async for chunk in stream:
            for choice in chunk.choices:
                streamed[choice.index] = streamed.get(choice.index, "") + choice.text
            usages.append(chunk.usage)
        await client.close()
    expected = [answer.choices[0].text for answer in alone]
    assert [c.index for c in together.choices] == [0, 1, 2]
    assert [c.text for c in together.choices] == expected
    assert [streamed[i] for i in range(3)] == expected
    prompt_tokens = sum(len(p) for p in prompts)
    assert together.usage is not None and together.usage.prompt_tokens == prompt_tokens
    assert together.usage.completion_tokens == 18
    assert usages[-1] is not None and usages[-1].completion_tokens == 18
    assert all(u is None for u in usages[:-1])
    span_recorder.wait_for(lambda s: len(s.server_spans("/v1/completions")) == 5)
    sizes = {attrs(s)["gpuscope.batch.size"] for s in span_recorder.batches()}
    if mode == "none":
        assert sizes == {1}
    else:
        assert max(sizes) >= 2  # the prompts of one request shared a batch


async def test_worker_models_health_version_and_unknown_paths() -> None:
    with serve_worker() as url:
        client = _async_client(url)
        card = await client.models.retrieve(MODEL)
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve("no-such-model")
        await client.close()
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            raw_card = (await http.get(f"/v1/models/{MODEL}")).json()
            listed = (await http.get("/v1/models")).json()
            health = await http.get("/health")
            version = await http.get("/version")
            unknown = await http.get("/v1/nothing")
            wrong = await http.put("/v1/chat/completions", json={})
    assert card.id == MODEL and missing.value.status_code == 404
    assert raw_card["max_model_len"] == SMALL.max_context
    assert listed["data"] == [raw_card]
    assert health.status_code == 200
    assert version.json() == {"version": __version__}
    for answer, status in ((unknown, 404), (wrong, 405)):
        assert answer.status_code == status
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
    assert wrong.headers["allow"] == "POST"


async def test_worker_completion_chunks_without_include_usage_have_no_usage() -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True}
    with serve_worker() as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=30) as http,
            http.stream("POST", "/v1/completions", json=body) as response,
        ):
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert lines[-1] == "data: [DONE]" and len(chunks) == 3
    assert all("usage" not in chunk for chunk in chunks)


async def test_worker_concurrent_chat_and_completions_share_the_scheduler() -> None:
    with serve_worker(batching="continuous", max_batch_size=8) as url:
        client = _async_client(url)
        chats = [
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4
            )
            for i in range(4)
        ]
        completions = [
            client.completions.create(model=MODEL, prompt=f"p{i}", max_tokens=4) for i in range(4)
        ]
        chat_answers, completion_answers = await asyncio.gather(
            asyncio.gather(*chats), asyncio.gather(*completions)
        )
        await client.close()
    usages = [a.usage for a in chat_answers] + [a.usage for a in completion_answers]
    assert all(u is not None and u.completion_tokens == 4 for u in usages)


def test_what_the_openai_client_sends_for_none_and_what_openai_defaults_to() -> None:
    """The client sends ``null`` for ``stream=None`` and ``echo=None`` (its types allow
    them; the API's default applies): both were a 400. Chat has no small default for
    ``max_tokens`` in OpenAI's API: it answered 16 tokens and ``length``, on which the
    client's ``parse()`` raises. A prompt over the context carries OpenAI's code."""
    with serve_worker(max_new_tokens=40) as url:
        client = _client(url)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
        for extra in ({"stream": None}, {"echo": None}, {"stream_options": None}):
            answer = httpx.post(f"{url}/v1/completions", json={**body, **extra})
            assert answer.status_code == 200, (extra, answer.text)
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=None
        )
        assert chat.usage is not None and chat.usage.completion_tokens > 16
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt="x " * 2000, max_tokens=1)
        assert refused.value.code == "context_length_exceeded"
