"""gpuscope.flags: flags, environment twins, conversion by resolved type, renamed flags."""

from __future__ import annotations

import enum
import importlib
import pkgutil
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuscope import flags
from gpuscope.cli import SUBCOMMANDS, main
from gpuscope.exporter.config import ExporterConfig
from gpuscope.flags import ConfigError, option
from gpuscope.worker.config import WorkerConfig
from scripts.gpu_validation import GpuCheckConfig


class Mode(enum.StrEnum):
    FAST = "fast"
    SAFE = "safe"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Settings(flags.Settings, prog="t", description="test"):
    port: int = option(8000, help="port", check=flags.between(0, 65535))
    scale: float = option(0.5, help="scale")
    name: str = option("w", help="name")
    token: str | None = option(None, help="token")
    scenario: Path | None = option(None, help="scenario")
    serve: tuple[str, ...] = option(("a", "b"), help="what to serve")
    quiet: bool = option(False, help="say less")
    workers: int | None = option(None, help="workers")
    ratio: float | None = option(None, help="ratio")
    mode: Mode = option(Mode.FAST, help="mode")
    level: Level = option(Level.LOW, help="level")
    sizes: tuple[int, ...] = option((1, 2), help="sizes")
    pair: tuple[str, float] = option(("x", 1.0), help="pair")
    wait_s: float = option(3.0, help="how long to wait", deprecated=("--wait", "--pause"))
    color: str = option("red", help="color", check=flags.one_of(("red", "blue")))
    max_size_bytes: int = option(2 * 2**20, help="size")
    max_context: int = option(8, help="context", unit="tokens")


def parser() -> Any:
    return flags.build_parser(Settings)


def parse(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    return flags.parse(Settings, argv, environ or {}, exit_on_error=False)


def parse_exporter(argv: list[str], environ: dict[str, str]) -> ExporterConfig:
    return flags.parse(ExporterConfig, argv, environ, exit_on_error=False)


def test_defaults_then_twins_then_flags() -> None:
    assert parse([]) == Settings()
    environ = {"GPUSCOPE_PORT": "9000", "GPUSCOPE_NAME": "env", "GPUSCOPE_QUIET": "yes"}
    assert parse([], environ) == Settings(port=9000, name="env", quiet=True)
    assert parse(["--port", "7000", "--quiet"], {"GPUSCOPE_PORT": "9000"}).port == 7000


def test_every_supported_type_converts() -> None:
    argv = ["--scale", "2.5", "--token", "", "--scenario", "s.yaml", "--serve", " x, y ,,z"]
    argv += ["--workers", "4", "--ratio", "0.25", "--mode", "safe", "--level", "2"]
    argv += ["--sizes", "3,5", "--pair", "y, 2.5"]
    settings = parse(argv)
    assert settings.scale == 2.5
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
        ([], {"GPUSCOPE_SCALE": "soon"}, "--scale: cannot read 'soon' as float"),
        ([], {"GPUSCOPE_QUIET": "maybe"}, "--quiet: cannot read 'maybe' as bool"),
        (["--port", "70000"], {}, "--port: must be between 0 and 65535, got 70000"),
        (["--workers", "many"], {}, "--workers: cannot read 'many' as int | None"),
        (["--ratio", "half"], {}, "--ratio: cannot read 'half' as float | None"),
        (["--mode", "quick"], {}, "--mode: cannot read 'quick' as one of fast, safe"),
        (["--sizes", "1,two"], {}, "--sizes: cannot read '1,two' as tuple[int, ...]"),
        (["--pair", "a"], {}, "--pair: cannot read 'a' as tuple[str, float]"),
        ([], {"GPUSCOPE_WAIT_S": "later"}, "--wait-s: cannot read 'later' as float"),
        (["--color", "green"], {}, "--color: expected one of red, blue, got 'green'"),
        (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        (["--help"], {}, "unrecognized arguments: --help"),  # never an exit for a caller
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
    assert "--wait-s SECONDS how long to wait [GPUSCOPE_WAIT_S] (default 3.0 s)" in text
    assert "--port N" in text and "--scenario PATH" in text  # metavars say what to give
    assert "(formerly --wait, --pause)" in text
    assert "--pause SECONDS" not in text  # old spellings work but are not advertised
    assert "(default )" not in text and "(default None)" not in text
    assert "--max-size-bytes BYTES size [GPUSCOPE_MAX_SIZE_BYTES] (default 2097152 = 2 MiB)" in text
    assert "--max-context TOKENS" in text  # a declared unit stands for the value
    assert "--color {red,blue}" in text  # so do a check's choices


def test_checks_run_when_the_settings_are_built_in_code_too() -> None:
    with pytest.raises(ConfigError, match=r"^--port: must be between 0 and 65535, got -1$"):
        Settings(port=-1)
    assert Settings(mode="safe").mode is Mode.SAFE  # type: ignore[arg-type]  # text kept as the enum
    with pytest.raises(ConfigError, match=r"^--mode: cannot read 'slow' as one of fast, safe$"):
        Settings(mode="slow")  # type: ignore[arg-type]


def test_a_bad_flag_ends_a_command_with_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        flags.parse(Settings, ["--port", "70000"], {})
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "t: --port: must be between 0 and 65535, got 70000 (see 't --help')\n"
    )


def test_to_argv_spells_the_given_fields_as_their_flags_and_parses_back() -> None:
    argv = flags.to_argv(
        Settings, wait_s=1.5, quiet=True, serve=("x", "y"), mode=Mode.SAFE, token=None, port=8000
    )
    assert argv == [
        "--port", "8000", "--token", "", "--serve", "x,y", "--quiet", "--mode", "safe",
        "--wait-s", "1.5",
    ]  # fmt: skip
    assert parse(argv) == Settings(wait_s=1.5, quiet=True, serve=("x", "y"), mode=Mode.SAFE)
    assert flags.to_argv(Settings, quiet=False) == []  # a switch off is no flag
    with pytest.raises(ConfigError, match=r"^--port: "):
        flags.to_argv(Settings, port=-1)  # refused in the parent, not by the child


def test_spelling_and_field_of_read_the_declarations() -> None:
    assert flags.spelling(Settings, "wait_s") == "--wait-s"
    assert flags.field_of(Settings, "--wait-s") == "wait_s"
    assert flags.field_of(Settings, "--pause") == "wait_s"  # an old spelling too
    assert flags.field_of(Settings, "--nothing") is None


@dataclass(frozen=True)
class Complex(flags.Settings, prog="t"):
    value: complex = option(1j, help="v")


@dataclass(frozen=True)
class Listed(flags.Settings, prog="t"):
    value: list[str] | None = option(None, help="v")


@dataclass(frozen=True)
class MaybeSwitch(flags.Settings, prog="t"):
    value: bool | None = option(None, help="v")


@dataclass(frozen=True)
class Either(flags.Settings, prog="t"):
    value: int | str = option(0, help="v")


@dataclass(frozen=True)
class Unresolvable(flags.Settings, prog="t"):
    value: NotDefinedAnywhere = option(0, help="v")  # type: ignore[name-defined]  # noqa: F821


@dataclass(frozen=True)
class BadSpelling(flags.Settings, prog="t"):
    value: int = option(0, help="v", deprecated=("value-s",))


@dataclass(frozen=True)
class Undeclared(flags.Settings, prog="t"):
    value: int = 0


@dataclass(frozen=True)
class BareTimeout(flags.Settings, prog="t"):
    read_timeout: float = option(1.0, help="v")


@dataclass(frozen=True)
class TwoUnits(flags.Settings, prog="t"):
    wait_s: float = option(1.0, help="v", unit="minutes")


@pytest.mark.parametrize(
    ("config_type", "message"),
    [
        (Complex, "Complex.value: no flag reader for type complex"),
        (Listed, "Listed.value: no flag reader for type list"),
        (MaybeSwitch, "MaybeSwitch.value: bool | None"),
        (Either, "Either.value: no flag reader for type int | str"),
        (Unresolvable, "Unresolvable: cannot resolve annotations"),
        (BadSpelling, "BadSpelling.value: flag 'value-s'"),
        (Undeclared, "Undeclared.value: declare it with flags.option(..., help=...)"),
    ],
)
def test_a_field_no_flag_can_set_fails_when_the_parser_is_built(
    config_type: type[Any], message: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        flags.build_parser(config_type)


def test_the_naming_lint_finds_a_bare_timing_word_and_a_unit_given_twice() -> None:
    assert flags.naming_problems(BareTimeout) == [
        "BareTimeout.read_timeout: --read-timeout holds a time; name its unit (_s or _ms)"
    ]
    assert flags.naming_problems(TwoUnits) == [
        "TwoUnits.wait_s: unit 'minutes' declared and implied by the name"
    ]


OPTIONAL_LIBRARIES = frozenset({"torch"})
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _every_settings_class() -> list[type[flags.Settings]]:
    """Every ``Settings`` subclass of the package (each module of each package that
    pyproject.toml lists imported: under the editable install the folders are mapped,
    so walking ``gpuscope.__path__`` alone would not reach them)."""
    packages = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"][
        "packages"
    ]
    for package in packages:
        for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
            name = f"{package}.{module.name}"
            if module.name == "__main__":
                continue
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:
                # an optional backend's own library (torch): it declares no settings
                if exc.name not in OPTIONAL_LIBRARIES:
                    raise
    found: list[type[flags.Settings]] = []
    todo = list(flags.Settings.__subclasses__())
    while todo:
        kind = todo.pop()
        todo.extend(kind.__subclasses__())
        if kind.__module__.startswith("gpuscope."):
            found.append(kind)
    return found


def test_every_settings_class_of_the_project_names_its_units() -> None:
    classes = [*_every_settings_class(), GpuCheckConfig]  # and scripts/gpu-check's
    assert len(classes) >= 5, classes  # the exporter's, the worker's, loadgen's, ...
    problems = [problem for kind in classes for problem in flags.naming_problems(kind)]
    assert problems == []


def test_a_renamed_flag_keeps_its_old_spellings_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse(["--wait-s", "1"]).wait_s == 1.0
    assert parse([], {"GPUSCOPE_WAIT_S": "2"}).wait_s == 2.0
    assert capsys.readouterr().err == ""  # the new spellings are silent
    assert parse(["--wait", "4"]).wait_s == 4.0
    assert capsys.readouterr().err == "t: --wait is deprecated, use --wait-s\n"
    assert parse(["--pause", "5"]).wait_s == 5.0
    assert capsys.readouterr().err == "t: --pause is deprecated, use --wait-s\n"
    assert parse([], {"GPUSCOPE_WAIT": "6"}).wait_s == 6.0
    assert capsys.readouterr().err == "t: GPUSCOPE_WAIT is deprecated, use GPUSCOPE_WAIT_S\n"


def test_new_spellings_win_over_old_ones_and_flags_over_twins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse(["--wait", "4", "--wait-s", "7"]).wait_s == 7.0
    assert parse(["--wait", "4"], {"GPUSCOPE_WAIT_S": "8"}).wait_s == 4.0
    assert parse([], {"GPUSCOPE_WAIT": "6", "GPUSCOPE_WAIT_S": "9"}).wait_s == 9.0
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        "t: --wait is deprecated, use --wait-s",
        "t: --wait is deprecated, use --wait-s",
        "t: GPUSCOPE_WAIT is deprecated, use GPUSCOPE_WAIT_S",
    ]


@pytest.mark.parametrize(
    ("new", "old", "field"),
    [
        ("--gpu-interval-s", "--gpu-interval", "gpu_interval_s"),
        ("--shutdown-timeout-s", "--shutdown-timeout", "shutdown_timeout_s"),
        ("--forward-timeout-s", "--forward-timeout", "forward_timeout_s"),
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
    def parse_gpu_check(argv: list[str], environ: dict[str, str]) -> GpuCheckConfig:
        return flags.parse(GpuCheckConfig, argv, environ, exit_on_error=False)

    base = ["--output", "o.json"]
    assert parse_gpu_check([*base, "--load-duration-s", "3", "--gpu-interval-s", "0.2"], {})
    assert capsys.readouterr().err == ""
    old = parse_gpu_check([*base, "--load-seconds", "4", "--gpu-interval", "0.3"], {})
    assert (old.load_duration_s, old.gpu_interval_s) == (4.0, 0.3)
    warnings = capsys.readouterr().err
    assert "--load-seconds is deprecated, use --load-duration-s" in warnings
    assert "--gpu-interval is deprecated, use --gpu-interval-s" in warnings


def test_the_worker_already_spells_its_units() -> None:
    argv = ["--shutdown-timeout-s", "3", "--request-timeout-s", "4"]
    config = flags.parse(WorkerConfig, argv, {}, exit_on_error=False)
    assert (config.shutdown_timeout_s, config.request_timeout_s) == (3.0, 4.0)


# A flag that holds a duration says its unit: --x-s, --x-ms (not --x, --x-seconds).
# flags refuses such a field when the parser is built; this checks what --help shows.
_TIMING_WORDS = flags.TIMING_WORDS


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


# Each URL flag connects to what it names, so one rule holds for all: these parse as
# URLs but name no host to connect to, or a port that is not a number.
_URL_FLAGS = [
    ("exporter", "--forward-otlp"),
    ("worker", "--otlp-endpoint"),
    ("loadgen", "--url"),
    ("loadgen", "--exporter-url"),
    ("tune", "--exporter-url"),
]


@pytest.mark.parametrize(("command", "flag"), _URL_FLAGS)
@pytest.mark.parametrize(
    "url", ["tempo:4318", "ftp://tempo/v1", "http://:4318/v1", "http://tempo:http/v1"]
)
def test_every_url_flag_follows_the_one_url_rule(
    command: str, flag: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, flag, url])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuscope {command}: {flag}: expected an http(s) URL such as "), err


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9420",
        "https://user@tempo.example:4318/v1/traces?tenant=a",
        "http://[::1]/v1",
    ],
)
def test_the_url_rule_leaves_paths_queries_and_user_info_to_the_server(url: str) -> None:
    flags.check_http_url("--url", url, "http://127.0.0.1:8000/v1")  # does not raise
    assert flags.parse(ExporterConfig, ["--forward-otlp", url], {}).forward_otlp == url
