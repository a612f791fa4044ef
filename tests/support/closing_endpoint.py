"""An OTLP endpoint that is down but countable: it accepts each connection and closes it
unanswered, so every export fails (a retryable error, as a refused connection is) and a
test can wait for the attempts instead of guessing when the exporter is retrying."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ClosingEndpoint:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.attempts = 0  # connections accepted (and closed) so far
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces"

    def serve(self) -> None:
        while True:
            try:
                connection, _ = self._sock.accept()
            except OSError:  # closed: the test is over
                return
            connection.close()
            self.attempts += 1


@contextmanager
def closing_endpoint() -> Iterator[ClosingEndpoint]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        endpoint = ClosingEndpoint(sock)
        thread = threading.Thread(target=endpoint.serve, daemon=True)
        thread.start()
        try:
            yield endpoint
        finally:
            sock.shutdown(socket.SHUT_RDWR)
    thread.join(timeout=5)
