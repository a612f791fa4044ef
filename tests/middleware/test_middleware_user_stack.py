"""The middleware in an app that already has its own stack (``support/user_stack_app``):
its own global provider and sampler, a root path, a 204, a stream, a background
task and a websocket, in a process of its own and over real sockets."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from support import user_stack_app

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

SAMPLED = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
NOT_SAMPLED = {"traceparent": "00-" + "3" * 32 + "-" + "4" * 16 + "-00"}


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(Path(user_stack_app.__file__))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = process.stdout.readline().strip()
        assert port.isdigit(), f"the app did not start (exit {process.poll()})"
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


async def _recorded(client: httpx.AsyncClient) -> dict[str, Any]:
    answer = await client.get("/_spans")
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()
    return result


async def _wait_until_ready(client: httpx.AsyncClient) -> None:
    for _ in range(200):
        try:
            await client.get("/_spans")
            return
        except httpx.TransportError:
            await asyncio.sleep(0.05)  # uvicorn binds before it accepts


async def test_the_apps_own_sampler_decides_and_the_rest_is_counted(app_url: str) -> None:
    async with httpx.AsyncClient(base_url=app_url, timeout=30) as client:
        await _wait_until_ready(client)
        before = await _recorded(client)
        answers = [await client.get(f"/items/{i}") for i in range(40)]
        after = await _recorded(client)
    assert all(a.status_code == 200 for a in answers)
    new = [s for s in after["spans"] if s not in before["spans"]]
    sampled_out = after["sampled_out"] - before["sampled_out"]
    assert len(new) + sampled_out == 40  # every request either traced or counted
    assert 0 < len(new) < 40  # the ratio sampler, not gpuscope, decided (odds 2^-39)
    assert {s["route"] for s in new} == {"/items/{item_id}"}
    assert {s["path"] for s in new} <= {f"/api/items/{i}" for i in range(40)}


async def test_root_path_no_body_stream_and_background_task(app_url: str) -> None:
    async with httpx.AsyncClient(base_url=app_url, timeout=30) as client:
        await _wait_until_ready(client)
        empty = await client.get("/empty", headers=SAMPLED)
        streamed = await client.get("/stream", headers=SAMPLED)
        queued = await client.get("/background", headers=SAMPLED)
        skipped = await client.get("/items/8", headers=NOT_SAMPLED)
        for _ in range(200):
            recorded = await _recorded(client)
            if recorded["background_done"]:
                break
            await asyncio.sleep(0.05)
    assert (empty.status_code, empty.content) == (204, b"")
    assert streamed.text == "0\n1\n2\n"
    assert queued.status_code == skipped.status_code == 200
    assert recorded["background_done"] == 1
    spans = {s["path"]: s for s in recorded["spans"] if s["trace_id"] == "1" * 32}
    assert spans["/api/empty"]["status"] == 204
    assert spans["/api/empty"]["name"] == "GET /empty"
    assert spans["/api/stream"]["route"] == "/stream"
    # The span ended with the response, not with the background task after it.
    assert spans["/api/background"]["duration_s"] < user_stack_app.BACKGROUND_S
    assert not any(s["trace_id"] == "3" * 32 for s in recorded["spans"])  # parent said no


async def test_websocket_next_to_http_is_served_and_untraced(app_url: str) -> None:
    async with httpx.AsyncClient(base_url=app_url, timeout=30) as client:
        await _wait_until_ready(client)
        before = await _recorded(client)
        async with websockets.connect(app_url.replace("http://", "ws://") + "/ws") as socket:
            await socket.send("hello")
            during = await client.get("/items/1", headers=SAMPLED)
            echoed = await socket.recv()
        after = await _recorded(client)
    assert echoed == "HELLO"
    assert during.status_code == 200
    new = [s for s in after["spans"] if s not in before["spans"]]
    assert [s["path"] for s in new] == ["/api/items/1"]  # the websocket made no span
