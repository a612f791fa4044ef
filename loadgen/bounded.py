"""Reading what a server sends within bounds: a whole body, or its lines one at a time.

The load generator points at servers it does not control. Read whole, a 1 GiB answer
took it to 5 GB and a 1 GiB ``/metrics`` to 6 GB; read with aiohttp's line reader, a
long line raised out of the run. Here every read stops at a bound and says so with
``TooLarge``, which the caller counts as an error of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import aiohttp

MIB: Final = 1024 * 1024
KIB: Final = 1024


class TooLarge(Exception):
    """A body or a line went past its bound."""


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB and limit % MIB == 0 else f"{limit} bytes"


def check_declared(response: aiohttp.ClientResponse, limit: int) -> None:
    """``TooLarge`` at once when the body's declared length is past ``limit``."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise TooLarge(f"the body declares {declared} bytes, more than {_size(limit)}")


async def read_body(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, or ``TooLarge`` once it passes ``limit`` bytes (at once when its
    declared length does)."""
    check_declared(response, limit)
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise TooLarge(f"the body is larger than {_size(limit)}")
    return bytes(body)


async def skim(response: aiohttp.ClientResponse, limit: int) -> None:
    """Read and drop up to ``limit`` bytes of a body nobody needs: a short one is read to
    its end, so that its connection can be reused; a longer one is left, and aiohttp
    closes its connection instead."""
    read = 0
    async for chunk in response.content.iter_any():
        read += len(chunk)
        if read >= limit:
            return


async def lines(
    content: aiohttp.StreamReader, line_limit: int, total_limit: int | None = None
) -> AsyncIterator[bytes]:
    """The body's lines without their ``\\n``, each at most ``line_limit`` bytes, all of
    them at most ``total_limit``; ``TooLarge`` past either."""
    buffer = bytearray()
    total = 0
    async for chunk in content.iter_any():
        total += len(chunk)
        if total_limit is not None and total > total_limit:
            raise TooLarge(f"the body is larger than {_size(total_limit)}")
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end - start > line_limit:
                break  # reported below, as a line still unfinished would be
            yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if len(buffer) > line_limit:
            raise TooLarge(f"a line is longer than {_size(line_limit)}")
    if buffer:
        yield bytes(buffer)
