"""Hostile values of ``gpuscope loadgen``'s flags: each is one line on stderr naming the
flag and exit status 2, before any load (before, several were tracebacks, hangs or a
7.7 GB read of ``/dev/zero``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.loadgen import cli
from gpuscope.loadgen.workload import MAX_LENGTH, Lengths, read_request_file


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--prompt-words", "normal:nan:1"], "--prompt-words"),
        (["--output-tokens", "normal:5:inf"], "--output-tokens"),
        (["--prompt-words", "exp:1e9"], "--prompt-words"),  # hung building the first prompt
        (["--prompt-words", "uniform:1:1e300"], "--prompt-words"),
        (["--mix", "chat=nan"], "--mix"),
        (["--mix", "chat=inf"], "--mix"),
        (["--url", "http://[::1"], "--url"),
        (["--url", "http://127.0.0.1:99999/v1"], "--url"),
        (["--exporter-url", "http://[::1"], "--exporter-url"),
        (["--requests-file", "/dev/zero"], "--requests-file"),
        (["--duration-s", "inf"], "--duration-s"),
        (["--timeout-s", "nan"], "--timeout-s"),
        (["--late-ms", "nan"], "--late-ms"),
        (["--warmup-s", "nan"], "--warmup-s"),
        (["--rate", "nan"], "--rate"),
        (["--rate", "inf"], "--rate"),  # every gap 0: the arrival loop never yielded
        (["--concurrency", "1000000000"], "--concurrency"),
    ],
)
def test_a_hostile_flag_is_one_line_naming_it_and_exit_2(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"gpuscope loadgen: {flag}: "), err


def test_lengths_are_bounded_however_they_are_drawn() -> None:
    import random

    rng = random.Random(0)
    for text in ("normal:100000:100000", "exp:100000"):  # tails far past the bound
        draws = [Lengths.parse("--prompt-words", text).draw(rng) for _ in range(2000)]
        assert min(draws) >= 1 and max(draws) == MAX_LENGTH


def test_a_request_file_of_many_lines_is_kept_as_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    lines = [
        f'{{"endpoint": "completions", "prompt": "p{i}", "max_tokens": {i + 1}}}'
        for i in range(5000)
    ]
    path.write_text("\n".join(lines) + "\n\n")
    requests = read_request_file(path)
    assert len(requests) == 5000
    assert requests[4999].body == {"prompt": "p4999", "max_tokens": 5000}
    assert [r.body["prompt"] for r in requests[:2]] == ["p0", "p1"]
    assert requests[-1] == requests[4999]
