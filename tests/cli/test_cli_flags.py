"""gpuscope.flags: flags, environment twins and conversion."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuscope import flags
from gpuscope.flags import ConfigError


@dataclass(frozen=True)
class Settings:
    port: int = 8000
    delay: float = 0.5
    name: str = "w"
    token: str | None = None
    scenario: Path | None = None
    serve: tuple[str, ...] = ("a", "b")
    quiet: bool = False

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
}


def parse(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    parser = flags.build_parser(Settings, prog="t", description="test", help=HELP)
    return flags.parse_config(Settings, parser, argv, environ or {})


def test_defaults_then_twins_then_flags() -> None:
    assert parse([]) == Settings()
    environ = {"GPUSCOPE_PORT": "9000", "GPUSCOPE_NAME": "env", "GPUSCOPE_QUIET": "yes"}
    assert parse([], environ) == Settings(port=9000, name="env", quiet=True)
    assert parse(["--port", "7000", "--quiet"], {"GPUSCOPE_PORT": "9000"}).port == 7000


def test_every_supported_type_converts() -> None:
    settings = parse(
        ["--delay", "2.5", "--token", "", "--scenario", "s.yaml", "--serve", " x, y ,,z"]
    )
    assert settings.delay == 2.5
    assert settings.token is None  # empty text means unset
    assert settings.scenario == Path("s.yaml")
    assert settings.serve == ("x", "y", "z")
    assert parse([], {"GPUSCOPE_QUIET": "off"}).quiet is False


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--port", "eighty"], {}, "--port: cannot read 'eighty' as int"),
        ([], {"GPUSCOPE_DELAY": "soon"}, "--delay: cannot read 'soon' as float"),
        ([], {"GPUSCOPE_QUIET": "maybe"}, "--quiet: cannot read 'maybe' as bool"),
        (["--port", "70000"], {}, "--port: must be between 0 and 65535, got 70000"),
    ],
)
def test_errors_name_the_flag(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse(argv, environ)
    assert str(raised.value) == message


def test_help_names_twins_and_defaults() -> None:
    text = flags.build_parser(Settings, prog="t", description="d", help=HELP).format_help()
    assert "[GPUSCOPE_PORT] (default 8000)" in text
    assert "(default a,b)" in text
    assert "[GPUSCOPE_QUIET]" in text


def test_an_unsupported_field_type_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class Odd:
        ratio: complex = 1j

    parser = flags.build_parser(Odd, prog="t", description="d", help={"ratio": "r"})
    with pytest.raises(TypeError, match="no flag reader"):
        flags.parse_config(Odd, parser, ["--ratio", "2"], {})
