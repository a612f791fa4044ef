"""gpuscope.flags: flags, environment twins, conversion by resolved type, renamed flags."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuscope import flags
from gpuscope.cli import SUBCOMMANDS, main
from gpuscope.exporter.config import parse_config as parse_exporter
from gpuscope.flags import ConfigError
from gpuscope.worker.config import parse_config as parse_worker
from scripts.gpu_validation import parse_args as parse_gpu_check


class Mode(enum.StrEnum):
    FAST = "fast"
    SAFE = "safe"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Settings:
    port: int = 8000
    delay: float = 0.5
    name: str = "w"
    token: str | None = None
    scenario: Path | None = None
    serve: tuple[str, ...] = ("a", "b")
    quiet: bool = False
    workers: int | None = None
    ratio: float | None = None
    mode: Mode = Mode.FAST
    level: Level = Level.LOW
    sizes: tuple[int, ...] = (1, 2)
    pair: tuple[str, float] = ("x", 1.0)
    wait: float = flags.option(3.0, flag="--wait-s", deprecated=("--wait", "--pause"))

    def __post_init__(self) -> None:
        flags.check_range("--port", self.port, 0, 65535)


HELP = {
    "port": "port",
    "delay": "delay",
    "name": "name",
    "token": "token",
    "scenario": "scenario",
    "serve": "what to serve",
    "quiet": "say less",
    "workers": "workers",
    "ratio": "ratio",
    "mode": "mode",
    "level": "level",
    "sizes": "sizes",
    "pair": "pair",
    "wait": "how long to wait",
}


def parser() -> Any:
    return flags.build_parser(Settings, prog="t", description="test", help=HELP)


def parse(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    return flags.parse_config(Settings, parser(), argv, environ or {})


def test_defaults_then_twins_then_flags() -> None:
    assert parse([]) == Settings()
    environ = {"GPUSCOPE_PORT": "9000", "GPUSCOPE_NAME": "env", "GPUSCOPE_QUIET": "yes"}
    assert parse([], environ) == Settings(port=9000, name="env", quiet=True)
    assert parse(["--port", "7000", "--quiet"], {"GPUSCOPE_PORT": "9000"}).port == 7000


def test_every_supported_type_converts() -> None:
    argv = ["--delay", "2.5", "--token", "", "--scenario", "s.yaml", "--serve", " x, y ,,z"]
    argv += ["--workers", "4", "--ratio", "0.25", "--mode", "safe", "--level", "2"]
    argv += ["--sizes", "3,5", "--pair", "y, 2.5"]
    settings = parse(argv)
    assert settings.delay == 2.5
    assert settings.token is None  # empty text means unset
    assert settings.scenario == Path("s.yaml")
    assert settings.serve == ("x", "y", "z")
    assert (settings.workers, settings.ratio) == (4, 0.25)
    assert settings.mode is Mode.SAFE
    assert settings.level is Level.HIGH
    assert settings.sizes == (3, 5)
    assert settings.pair == ("y", 2.5)
    assert parse([], {"GPUSCOPE_QUIET": "off"}).quiet is False
    assert parse(["--workers", ""]).workers is None


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--port", "eighty"], {}, "--port: cannot read 'eighty' as int"),
        ([], {"GPUSCOPE_DELAY": "soon"}, "--delay: cannot read 'soon' as float"),
        ([], {"GPUSCOPE_QUIET": "maybe"}, "--quiet: cannot read 'maybe' as bool"),
        (["--port", "70000"], {}, "--port: must be between 0 and 65535, got 70000"),
        (["--workers", "many"], {}, "--workers: cannot read 'many' as int | None"),
        (["--ratio", "half"], {}, "--ratio: cannot read 'half' as float | None"),
        (["--mode", "quick"], {}, "--mode: cannot read 'quick' as one of fast, safe"),
        (["--sizes", "1,two"], {}, "--sizes: cannot read '1,two' as tuple[int, ...]"),
        (["--pair", "a"], {}, "--pair: cannot read 'a' as tuple[str, float]"),
        ([], {"GPUSCOPE_WAIT_S": "later"}, "--wait-s: cannot read 'later' as float"),
    ],
)
def test_errors_name_the_flag(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse(argv, environ)
    assert str(raised.value) == message


def test_help_names_twins_defaults_choices_and_old_spellings() -> None:
    text = " ".join(parser().format_help().split())  # argparse wraps lines
    assert "[GPUSCOPE_PORT] (default 8000)" in text
    assert "(default a,b)" in text
    assert "[GPUSCOPE_QUIET]" in text
    assert "--mode {fast,safe}" in text
    assert "(default fast)" in text
    assert "--wait-s SECONDS how long to wait [GPUSCOPE_WAIT_S] (default 3.0)" in text
    assert "--port N" in text and "--scenario PATH" in text  # metavars say what to give
    assert "(formerly --wait, --pause)" in text
    assert "--pause SECONDS" not in text  # old spellings work but are not advertised
    assert "(default )" not in text and "(default None)" not in text


@dataclass(frozen=True)
class Complex:
    value: complex = 1j


@dataclass(frozen=True)
class Listed:
    value: list[str] | None = None


@dataclass(frozen=True)
class MaybeSwitch:
    value: bool | None = None


@dataclass(frozen=True)
class Either:
    value: int | str = 0


@dataclass(frozen=True)
class Unresolvable:
    value: NotDefinedAnywhere = 0  # type: ignore[name-defined]  # noqa: F821


@dataclass(frozen=True)
class BadSpelling:
    value: int = flags.option(0, flag="value-s")


@pytest.mark.parametrize(
    ("config_type", "message"),
    [
        (Complex, "Complex.value: no flag reader for type complex"),
        (Listed, "Listed.value: no flag reader for type list"),
        (MaybeSwitch, "MaybeSwitch.value: bool | None"),
        (Either, "Either.value: no flag reader for type int | str"),
        (Unresolvable, "Unresolvable: cannot resolve annotations"),
        (BadSpelling, "BadSpelling.value: flag 'value-s'"),
    ],
)
def test_a_field_no_flag_can_set_fails_when_the_parser_is_built(
    config_type: type[Any], message: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        flags.build_parser(config_type, prog="t", description="d", help={"value": "v"})


def test_a_renamed_flag_keeps_its_old_spellings_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse(["--wait-s", "1"]).wait == 1.0
    assert parse([], {"GPUSCOPE_WAIT_S": "2"}).wait == 2.0
    assert capsys.readouterr().err == ""  # the new spellings are silent
    assert parse(["--wait", "4"]).wait == 4.0
    assert capsys.readouterr().err == "t: --wait is deprecated, use --wait-s\n"
    assert parse(["--pause", "5"]).wait == 5.0
    assert capsys.readouterr().err == "t: --pause is deprecated, use --wait-s\n"
    assert parse([], {"GPUSCOPE_WAIT": "6"}).wait == 6.0
    assert capsys.readouterr().err == "t: GPUSCOPE_WAIT is deprecated, use GPUSCOPE_WAIT_S\n"


def test_new_spellings_win_over_old_ones_and_flags_over_twins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse(["--wait", "4", "--wait-s", "7"]).wait == 7.0
    assert parse(["--wait", "4"], {"GPUSCOPE_WAIT_S": "8"}).wait == 4.0
    assert parse([], {"GPUSCOPE_WAIT": "6", "GPUSCOPE_WAIT_S": "9"}).wait == 9.0
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        "t: --wait is deprecated, use --wait-s",
        "t: --wait is deprecated, use --wait-s",
        "t: GPUSCOPE_WAIT is deprecated, use GPUSCOPE_WAIT_S",
    ]


@pytest.mark.parametrize(
    ("new", "old", "field"),
    [
        ("--gpu-interval-s", "--gpu-interval", "gpu_interval"),
        ("--shutdown-timeout-s", "--shutdown-timeout", "shutdown_timeout"),
        ("--forward-timeout-s", "--forward-timeout", "forward_timeout"),
    ],
)
def test_the_exporter_takes_both_spellings_of_its_renamed_flags(
    new: str, old: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert getattr(parse_exporter([new, "0.5"], {}), field) == 0.5
    assert capsys.readouterr().err == ""
    assert getattr(parse_exporter([old, "0.25"], {}), field) == 0.25
    assert f"{old} is deprecated, use {new}" in capsys.readouterr().err
    new_twin = "GPUSCOPE_" + new[2:].replace("-", "_").upper()
    old_twin = "GPUSCOPE_" + old[2:].replace("-", "_").upper()
    assert getattr(parse_exporter([], {new_twin: "3"}), field) == 3.0
    assert capsys.readouterr().err == ""
    assert getattr(parse_exporter([], {old_twin: "4"}), field) == 4.0
    assert f"{old_twin} is deprecated, use {new_twin}" in capsys.readouterr().err


def test_gpu_check_takes_both_spellings_of_its_renamed_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["--output", "o.json"]
    assert parse_gpu_check([*base, "--load-duration-s", "3", "--gpu-interval-s", "0.2"], {})
    assert capsys.readouterr().err == ""
    old = parse_gpu_check([*base, "--load-seconds", "4", "--gpu-interval", "0.3"], {})
    assert (old.load_seconds, old.gpu_interval) == (4.0, 0.3)
    warnings = capsys.readouterr().err
    assert "--load-seconds is deprecated, use --load-duration-s" in warnings
    assert "--gpu-interval is deprecated, use --gpu-interval-s" in warnings


def test_the_worker_already_spells_its_units() -> None:
    config = parse_worker(["--shutdown-timeout-s", "3", "--request-timeout-s", "4"], {})
    assert (config.shutdown_timeout_s, config.request_timeout_s) == (3.0, 4.0)


# A flag that holds a duration says its unit: --x-s, --x-ms (not --x, --x-seconds).
_TIMING_WORDS = ("timeout", "interval", "delay", "duration", "period", "seconds", "wait")


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_command_builds_its_flags_and_spells_their_units(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])  # builds the parser: every field's type has a reader
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: gpuscope {command}" in text
    current = re.sub(r"\(formerly [^)]*\)", "", " ".join(text.split()))
    for flag in set(re.findall(r"(--[a-z][a-z0-9-]+)", current)):
        assert not flag.endswith(_TIMING_WORDS), f"gpuscope {command} {flag}: name its unit"


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_an_unknown_flag_is_one_line_that_points_to_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--no-such-flag"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"gpuscope {command}: unrecognized arguments: --no-such-flag"
        f" (see 'gpuscope {command} --help')\n"
    )


def test_a_value_that_cannot_be_read_is_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["loadgen", "--concurrency", "many"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "gpuscope loadgen: --concurrency: cannot read 'many' as a number"
        " (see 'gpuscope loadgen --help')\n"
    )
