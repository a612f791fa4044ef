"""Real servers on 127.0.0.1 port 0 for tests: uvicorn in a background thread."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def run_uvicorn(app: Any, **config: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields ``http://127.0.0.1:PORT``.

    The socket is bound here (port 0) and handed to uvicorn, so the port is known
    before the server starts and no other process can take it in between.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {"log_level": "warning", "lifespan": "auto"} | config
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = 200
        while not server.started and thread.is_alive() and deadline:
            threading.Event().wait(0.025)
            deadline -= 1
        if not server.started:
            raise RuntimeError("uvicorn did not start within 5 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
