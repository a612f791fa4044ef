"""A tiny real server for ``gpuscope tune --command`` tests: the standard library's HTTP
server answering OpenAI embeddings after a set delay, with start-up behaviours to test
the tuner's process handling against.

    python tests/support/command_server.py --port P [--delay-ms MS] [--config FILE]
        [--state FILE] [--model NAME] [--behave normal|exit|never-ready|ignore-sigterm|
                                         grandchild|no-models|dies]

``--config FILE`` reads ``{"delay_ms": ..., "port": ...}`` (a rendered
``--config-template``); ``--state FILE`` gets a JSON object with its pid, the delay,
its OTLP environment and, with ``grandchild``, the pid of a ``sleep`` it started in its
own process group. ``--model NAME`` is the one model it lists (default ``tiny``); a
request naming another is answered 404. ``no-models`` lists no model; ``dies`` exits
with status 5 at its twentieth request. Imports nothing of gpuscope.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--state", type=Path)
    parser.add_argument("--otlp", default="")
    parser.add_argument("--behave", default="normal")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    delay_ms, port = args.delay_ms, args.port
    if args.config is not None:
        config = json.loads(args.config.read_text())
        delay_ms, port = float(config["delay_ms"]), int(config["port"])
    if args.behave == "exit":
        print("loading the model", flush=True)
        print("error: no such model 'missing'", file=sys.stderr, flush=True)
        return 3
    if args.behave == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    state: dict[str, Any] = {
        "pid": os.getpid(),
        "delay_ms": delay_ms,
        "model": args.model,
        "otlp_flag": args.otlp,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("OTEL_", "GPUSCOPE_"))},
    }
    if args.behave == "grandchild":
        state["grandchild"] = subprocess.Popen(["sleep", "300"]).pid
    if args.state is not None:
        args.state.write_text(json.dumps(state))
    ready = args.behave != "never-ready"
    served: list[int] = []  # requests so far (appended to by the handler's threads)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200 if ready else 503, {})
            elif self.path == "/v1/models" and args.behave != "no-models":
                self._json(200, {"data": [{"id": args.model}]})
            else:
                self._json(404, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if body.get("model") != args.model:
                self._json(404, {"error": f"no model {body.get('model')!r}"})
                return
            served.append(1)
            if args.behave == "dies" and len(served) >= 20:
                print("fatal: the engine died", flush=True)
                os._exit(5)
            time.sleep(delay_ms / 1000)  # timed: the server's answer delay
            usage = {"prompt_tokens": 1, "total_tokens": 1}
            self._json(200, {"data": [{"embedding": [0.0]}], "usage": usage})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    if args.behave != "ignore-sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
