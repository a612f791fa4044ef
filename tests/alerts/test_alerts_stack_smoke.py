"""Smoke: the pack stack comes up and Prometheus sees GPU and request series."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from support.pack_stack import run_pack_stack
from support.prometheus_server import instant_query


async def test_stack_serves(tmp_path: Path) -> None:
    async with run_pack_stack(tmp_path) as stack, aiohttp.ClientSession() as session:
        for query in ("gpuscope_gpu_up", "gpuscope_request_phase_seconds_count", "up"):
            result = await instant_query(session, stack.prometheus_url, query)
            print(query, len(result))
            assert result
        async with session.get(stack.exporter_url + "/metrics") as r:
            text = await r.text()
        assert "gpuscope_gpu_up" in text
