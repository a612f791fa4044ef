"""Pure pieces of the text endpoints: stop strings, the chat template, JSON bodies."""

from __future__ import annotations

import json

import pytest

from gpuscope.worker import chat
from gpuscope.worker.model_api import ByteTokenizer
from gpuscope.worker.protocol import InvalidRequest, Limits
from gpuscope.worker.request_body import parse_json
from gpuscope.worker.stopping import StopMatcher

LIMITS = Limits("m", vocab_size=512, max_context=64, max_new_tokens=32, dimensions=8)


def _shown(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    shown = []
    for piece in pieces:
        shown.append(matcher.feed(piece))
        if matcher.stopped:
            return shown, True
    shown.append(matcher.flush())
    return shown, False


@pytest.mark.parametrize(
    ("stops", "text", "expected", "stopped"),
    [
        (["cd"], "abcdef", "ab", True),
        (["xyz"], "abcdef", "abcdef", False),
        (["ef", "bc"], "abcdef", "a", True),  # the earliest stop wins, whatever its order
        (["aab"], "aaab", "a", True),  # a held prefix that fails, then matches one later
        (["ab"], "ab", "", True),
        (["a"], "ba", "b", True),
        (["de"], "abcd", "abcd", False),  # a prefix held at the end is shown at the end
    ],
)
def test_worker_stop_matcher_cuts_at_the_first_stop_string(
    stops: list[str], text: str, expected: str, stopped: bool
) -> None:
    shown, matched = _shown(stops, list(text))
    assert "".join(shown) == expected and matched == stopped
    # Never shows what may still become a stop string: each piece is final.
    for at in range(len(shown)):
        assert expected.startswith("".join(shown[: at + 1]))


def test_worker_stop_matcher_holds_back_a_possible_stop_string() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("abcE") == "abc"
    assert matcher.feed("N") == ""
    assert matcher.feed("D tail") == "" and matcher.stopped


def test_worker_chat_template_renders_roles_and_text_parts() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "Rules."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "max_completion_tokens": 5,
        "max_tokens": 9,  # the newer name wins
        "stop": ["\n"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    parsed = chat.parse_chat(body, LIMITS, ByteTokenizer().encode)
    text = "<|system|>\nRules.\n<|user|>\nab\n<|assistant|>\n"
    assert bytes(parsed.prompt).decode() == text
    assert parsed.options.max_tokens == 5 and parsed.options.stop == ("\n",)
    assert parsed.options.stream and parsed.options.include_usage


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": [{"role": "user", "content": "x" * 80}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"temperature": 1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 40}, "max_tokens"),  # prompt + 40 > the context of 64
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without streaming
    ],
)
def test_worker_chat_refuses_what_it_cannot_honour(change: dict[str, object], param: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} | change
    with pytest.raises(InvalidRequest) as refused:
        chat.parse_chat(body, LIMITS, ByteTokenizer().encode)
    assert refused.value.param == param and refused.value.status == 400


@pytest.mark.parametrize(
    "raw",
    [
        b"1" * 5000,  # past Python's 4,300-digit limit for int()
        b"[" * 100_000 + b"]" * 100_000,  # past the recursion limit
        b'{"a": "\xff"}',
        b"",
    ],
)
def test_worker_json_the_parser_cannot_take_is_a_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_json(raw)
    assert refused.value.status == 400 and "not valid JSON" in str(refused.value)


def test_worker_json_within_limits_parses() -> None:
    assert parse_json(json.dumps({"n": 10**4000}).encode()) == {"n": 10**4000}
