"""What ``gpuscope worker`` says when it cannot start: one line, no traceback."""

from __future__ import annotations

import socket

import pytest

from gpuscope.cli import main


def test_a_port_in_use_is_one_line_before_anything_is_built(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["worker", "--host", "127.0.0.1", "--port", str(port), "--no-tracing"]) == 1
    captured = capsys.readouterr()
    assert (
        captured.err
        == f"gpuscope worker: cannot serve on 127.0.0.1:{port}: Address already in use\n"
    )
    assert captured.out == ""


def test_a_host_that_does_not_resolve_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--host", "no-such-host.invalid", "--port", "8000"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpuscope worker: cannot serve on no-such-host.invalid:8000: ")
    assert "Unknown error" not in err
    assert err.count("\n") == 1
