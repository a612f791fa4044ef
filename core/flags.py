"""Command-line flags with ``GPUSCOPE_*`` environment twins, declared once per field.

Every gpuscope command describes its settings as a frozen dataclass deriving from
``Settings``, with the command's name and description as class keywords; each field is
a flag, declared with ``option`` beside everything about it::

    @dataclass(frozen=True)
    class ExporterConfig(Settings, prog="gpuscope exporter", description="..."):
        gpu_interval_s: float = option(
            1.0, help="seconds between GPU polls", check=positive, deprecated=("--gpu-interval",)
        )

Field ``gpu_interval_s`` is ``--gpu-interval-s`` with the environment twin
``GPUSCOPE_GPU_INTERVAL_S``; a flag on the command line wins over its twin, and the
twin over the default. ``help`` is the flag's text in ``--help``, which adds the twin,
the default and the old spellings. ``check`` runs whenever the dataclass is built,
from flags or in code, and raises ``ConfigError`` naming the flag; checks that involve
several fields go in the dataclass's ``check`` method. ``deprecated`` spellings (and
their twins) still work, with a one-line warning on stderr.

A quantity with a unit names the unit at the end of its field, so of its flag: ``_s``
for seconds, ``_ms`` for milliseconds, ``_bytes`` for bytes (``--gpu-interval-s
SECONDS`` in ``--help``); a timing word without one (``--x-timeout``, ``--x-interval``)
breaks that convention, which ``naming_problems`` finds (the tests run it over every
settings class of the project). Other units are declared, ``unit="tokens"``, and
shown in place of the value (``--max-context TOKENS``).

Values are converted by the field's resolved type (``typing.get_type_hints``): ``int``,
``float``, ``str``, ``Path``, ``bool`` (a switch), an ``Enum`` (by value), ``X | None``
(empty text means None) and tuples (comma-separated). A field of any other type, or
one without ``help``, is refused when the command's parser is built, so every
command's ``--help`` test catches it.

``parse`` is the one way a command reads its settings: from argv, else the twins,
else the defaults.
"""

from __future__ import annotations

import argparse
import enum
import math
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import (
    Any,
    ClassVar,
    Final,
    NoReturn,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)
from urllib.parse import urlsplit

T = TypeVar("T")
S = TypeVar("S", bound="Settings")
Reader = Callable[[str], Any]
# A check of one field's value: raises ConfigError naming ``flag``. Not run on None.
Check = Callable[[str, Any], None]

# The --log-level choices every command takes (the ``logging`` levels, lower case).
LOG_LEVELS: Final = ("critical", "error", "warning", "info", "debug")

_TRUE = frozenset(("1", "true", "yes", "on"))
_FALSE = frozenset(("0", "false", "no", "off", ""))
_DECLARED_KEY = "gpuscope.flags"

# The units a field's name ends in: its flag's suffix and what --help shows for a value.
UNIT_SUFFIXES: Final = {"-s": "SECONDS", "-ms": "MS", "-bytes": "BYTES"}
# A flag ending in one of these holds a time and must name its unit instead.
TIMING_WORDS: Final = ("timeout", "interval", "delay", "duration", "period", "seconds", "wait")


class ConfigError(ValueError):
    """A flag (or its environment twin) has a value the command cannot use."""


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _twin(flag: str, prefix: str) -> str:
    """``--gpu-interval-s`` -> ``GPUSCOPE_GPU_INTERVAL_S``."""
    return prefix + flag.removeprefix("--").replace("-", "_").upper()


# ---------------------------------------------------------------------------------------
# Checks: each ``(flag, value) -> None``, raising ConfigError that names the flag. The
# ``check_*`` functions are for ``check`` methods; the others are given to ``option``.


def _braced(choices: Sequence[str]) -> str:
    return "{" + ",".join(choices) + "}"


def check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag}: expected one of {', '.join(choices)}, got {value!r}")


def check_finite(flag: str, value: float) -> None:
    """A number, not NaN or ±inf: every comparison with NaN is false, so a range check
    alone lets it through, and an infinite time or size never ends."""
    if not math.isfinite(value):
        raise ConfigError(f"{flag}: must be a finite number, got {value}")


def check_range(flag: str, value: float, low: float, high: float | None = None) -> None:
    """``low <= value <= high`` (no upper bound when ``high`` is None), and finite."""
    check_finite(flag, value)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{flag}: must be {bound}, got {value}")


def check_positive(flag: str, value: float) -> None:
    """``value > 0``, and finite."""
    check_finite(flag, value)
    if not value > 0:
        raise ConfigError(f"{flag}: must be greater than 0, got {value}")


def check_http_url(flag: str, value: str, example: str) -> None:
    """The one rule for a URL flag: an absolute ``http://`` or ``https://`` URL with a
    host name and, if it has a port, a numeric one, such as ``example``.

    Every URL a gpuscope command takes is one it connects to (loadgen's and tune's
    targets, the worker's OTLP endpoint, the exporter's ``--forward-otlp``), so the rule
    is as strict as connecting needs and no stricter: ``http://:4318`` or
    ``http://tempo:http`` parse as URLs but name nothing to connect to, and refused
    here they fail at start-up in one line instead of at the first request, minutes
    later or, for forwarding, as spans silently dropped. Paths, queries and user info
    are the server's business and pass."""
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(f"{flag}: expected an http(s) URL such as {example}, got {value!r}")


positive: Check = check_positive


@dataclass(frozen=True)
class _Shown:
    """A check that also says what a valid value looks like, for ``--help``."""

    run: Check
    metavar: str

    def __call__(self, flag: str, value: Any) -> None:
        self.run(flag, value)


def at_least(low: float) -> Check:
    return lambda flag, value: check_range(flag, value, low)


def between(low: float, high: float) -> Check:
    return lambda flag, value: check_range(flag, value, low, high)


def one_of(choices: Sequence[str]) -> Check:
    """One of ``choices``, which ``--help`` lists in place of the value."""
    return _Shown(lambda flag, value: check_choice(flag, value, choices), _braced(choices))


def http_url(example: str) -> Check:
    """``check_http_url`` with the example its message gives; ``URL`` in ``--help``."""
    return _Shown(lambda flag, value: check_http_url(flag, value, example), "URL")


def readable_file(flag: str, path: Path) -> None:
    if not path.is_file():
        raise ConfigError(f"{flag}: {str(path)!r} is not a readable file")


def writable_file(flag: str, path: str | Path) -> None:
    """Refuse an output file that cannot be written now, before the work whose result it
    would hold is spent and lost on it (``-`` is standard output)."""
    if str(path) == "-":
        return
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise ConfigError(f"{flag}: {str(path)!r} is a folder; name a file")
    if not folder.is_dir():
        raise ConfigError(f"{flag}: the folder {str(folder)!r} does not exist")
    writable = os.access(target, os.W_OK) if target.exists() else os.access(folder, os.W_OK)
    if not writable:
        raise ConfigError(f"{flag}: cannot write {str(path)!r}")


def not_empty(flag: str, value: str) -> None:
    if not value:
        raise ConfigError(f"{flag}: must not be empty")


# ---------------------------------------------------------------------------------------
# Declaring a field.


@dataclass(frozen=True)
class _Declared:
    help: str
    deprecated: tuple[str, ...]
    unit: str | None
    checks: tuple[Check, ...]
    metavar: str | None


@overload
def option(
    default: T,
    *,
    help: str,
    check: Check | Sequence[Check] = (),
    unit: str | None = None,
    deprecated: Sequence[str] = (),
    metavar: str | None = None,
) -> T: ...


@overload
def option(
    *,
    help: str,
    check: Check | Sequence[Check] = (),
    unit: str | None = None,
    deprecated: Sequence[str] = (),
    metavar: str | None = None,
) -> Any: ...


def option(
    default: Any = MISSING,
    *,
    help: str,
    check: Check | Sequence[Check] = (),
    unit: str | None = None,
    deprecated: Sequence[str] = (),
    metavar: str | None = None,
) -> Any:
    """A field of a ``Settings`` dataclass: its flag's ``--help`` text, the checks its
    value must pass, its unit when its name does not end in one (``unit="tokens"``),
    the ``deprecated`` spellings that still work with a warning, and the ``metavar``
    that ``--help`` shows for the value when neither the unit, the type nor a check
    says it (``HOST:PORT``). No ``default``: the flag (or its twin) is required.

    The flag is always the field's name (``max_queue_delay_ms`` is
    ``--max-queue-delay-ms``): to rename a flag, rename the field and keep the old
    spelling in ``deprecated``."""
    checks = (check,) if callable(check) else tuple(check)
    declared = _Declared(help, tuple(deprecated), unit, checks, metavar)
    return field(default=default, metadata={_DECLARED_KEY: declared})


class Settings:
    """The base of every command's settings dataclass: a frozen dataclass of ``option``
    fields, whose class keywords ``prog``, ``description`` and ``env_prefix`` (default
    ``GPUSCOPE_``) say how ``parse`` presents it.

    Building one, from flags or in code, converts an enum field given as its text and
    runs every field's checks, then ``check`` for what involves several fields."""

    # prog, description, env prefix (not "command": a command may have a --command flag)
    cli_command: ClassVar[tuple[str, str, str] | None] = None

    def __init_subclass__(
        cls,
        *,
        prog: str | None = None,
        description: str = "",
        env_prefix: str = "GPUSCOPE_",
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if prog is not None:
            cls.cli_command = (prog, description, env_prefix)

    def __post_init__(self) -> None:
        for record in _flags(type(self)):
            value = getattr(self, record.field)
            if value is None:
                continue
            if record.enum is not None and not isinstance(value, record.enum):
                # given in code as its text: kept as the enum, like a parsed flag
                object.__setattr__(self, record.field, value := record.convert(str(value)))
            for check in record.checks:
                check(record.flag, value)
        self.check()

    def check(self) -> None:
        """Checks that involve several fields (or none); raise ``ConfigError``."""


# ---------------------------------------------------------------------------------------
# Readers: one per supported type, chosen once per field from its resolved type.


def _read_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(raw)


_SCALARS: dict[object, Reader] = {int: int, float: float, str: str, Path: Path, bool: _read_bool}


def _enum_reader(enum_type: type[enum.Enum]) -> Reader:
    members = {str(member.value): member for member in enum_type}

    def read(raw: str) -> enum.Enum:
        try:
            return members[raw.strip()]
        except KeyError:
            raise ValueError(raw) from None

    return read


def _split(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def _tuple_reader(items: tuple[Any, ...]) -> Reader:
    if len(items) == 2 and items[1] is Ellipsis:
        item = reader_for(items[0])
        return lambda raw: tuple(item(part) for part in _split(raw))
    readers = [reader_for(item) for item in items]

    def read_fixed(raw: str) -> tuple[Any, ...]:
        parts = _split(raw)
        if len(parts) != len(readers):
            raise ValueError(raw)
        return tuple(read(part) for read, part in zip(readers, parts, strict=True))

    return read_fixed


def _optional_reader(inner: object) -> Reader:
    if inner is bool:
        raise TypeError("bool | None: a switch is either given or not; use bool")
    read = reader_for(inner)
    return lambda raw: read(raw) if raw.strip() else None


def reader_for(kind: object) -> Reader:
    """The function that turns a flag's text into ``kind``; ``TypeError`` when none can."""
    if kind in _SCALARS:
        return _SCALARS[kind]
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _enum_reader(kind)
    origin, args = get_origin(kind), get_args(kind)
    if origin is tuple and args:
        return _tuple_reader(args)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return _optional_reader(next(arg for arg in args if arg is not type(None)))
    raise TypeError(f"no flag reader for type {type_name(kind)}")


def type_name(kind: object) -> str:
    """How an error message names what was expected."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in kind)
    if isinstance(kind, type):
        return kind.__name__
    return str(kind).replace("pathlib.", "").replace("typing.", "")


def _shown(value: object) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(_shown(item) for item in value)
    return str(value)


# ---------------------------------------------------------------------------------------
# One record per field: its spellings, twins, reader and checks.


@dataclass(frozen=True)
class _Flag:
    field: str
    kind: object
    read: Reader
    flag: str
    env: str
    old_flags: tuple[str, ...]
    old_envs: tuple[str, ...]
    default: object
    required: bool
    help: str
    unit: str | None  # the metavar a unit gives, e.g. SECONDS or TOKENS
    checks: tuple[Check, ...]
    metavar: str | None

    @property
    def enum(self) -> type[enum.Enum] | None:
        kind = self.kind
        return kind if isinstance(kind, type) and issubclass(kind, enum.Enum) else None

    def old_dest(self, index: int) -> str:
        return f"{self.field}__deprecated_{index}"

    def convert(self, raw: str) -> Any:
        try:
            return self.read(raw)
        except ValueError:
            raise ConfigError(
                f"{self.flag}: cannot read {raw!r} as {type_name(self.kind)}"
            ) from None


def implied_unit(flag: str) -> str | None:
    """The metavar a flag's suffix implies (``--x-s``: SECONDS), if any."""
    return next((word for suffix, word in UNIT_SUFFIXES.items() if flag.endswith(suffix)), None)


def naming_problems(config_type: type[Any]) -> list[str]:
    """What the naming convention finds wrong with ``config_type``'s flags: a timing word
    without its unit, a unit both declared and implied by the name. A lint for the
    project's own settings (its test runs it over every ``Settings`` class), not a check
    that a command pays for at each start."""
    problems = []
    for record in _flags(config_type):
        where = f"{config_type.__qualname__}.{record.field}"
        declared = _declared(config_type, record.field).unit
        if implied_unit(record.flag) is not None and declared is not None:
            problems.append(f"{where}: unit {declared!r} declared and implied by the name")
        if implied_unit(record.flag) is None and record.flag.endswith(TIMING_WORDS):
            problems.append(f"{where}: {record.flag} holds a time; name its unit (_s or _ms)")
    return problems


def _declared(config_type: type[Any], name: str) -> _Declared:
    item = next(item for item in fields(config_type) if item.name == name)
    declared: _Declared = item.metadata[_DECLARED_KEY]
    return declared


def _unit(flag: str, declared: str | None) -> str | None:
    """The metavar of the field's unit: from its flag's suffix, else as declared."""
    return implied_unit(flag) or (declared.upper() if declared else None)


# Each settings class's flags, worked out once: every built instance checks its fields.
_RECORDS: dict[type[Any], tuple[_Flag, ...]] = {}


def _flags(config_type: type[Any]) -> tuple[_Flag, ...]:
    """The flags of ``config_type``; ``TypeError`` for a field no flag can set."""
    records = _RECORDS.get(config_type)
    if records is None:
        records = _RECORDS[config_type] = _new_flags(config_type)
    return records


def _new_flags(config_type: type[Any]) -> tuple[_Flag, ...]:
    command = getattr(config_type, "cli_command", None)
    env_prefix = command[2] if command else "GPUSCOPE_"
    try:
        hints = get_type_hints(config_type)
    except NameError as exc:
        raise TypeError(f"{config_type.__qualname__}: cannot resolve annotations: {exc}") from None
    return tuple(
        _record(config_type, item, hints[item.name], env_prefix) for item in fields(config_type)
    )


def _record(config_type: type[Any], item: Field[Any], kind: object, env_prefix: str) -> _Flag:
    where = f"{config_type.__qualname__}.{item.name}"
    declared = item.metadata.get(_DECLARED_KEY)
    if declared is None:
        raise TypeError(f"{where}: declare it with flags.option(..., help=...)")
    flag = flag_name(item.name)
    for spelled in declared.deprecated:
        if not spelled.startswith("--"):
            raise TypeError(f"{where}: flag {spelled!r}")
    try:
        read = reader_for(kind)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from None
    return _Flag(
        field=item.name,
        kind=kind,
        read=read,
        flag=flag,
        env=_twin(flag, env_prefix),
        old_flags=declared.deprecated,
        old_envs=tuple(_twin(old, env_prefix) for old in declared.deprecated),
        default=item.default,
        required=item.default is MISSING and item.default_factory is MISSING,
        help=declared.help,
        unit=_unit(flag, declared.unit),
        checks=declared.checks,
        metavar=declared.metavar,
    )


def _help_text(record: _Flag) -> str:
    text = f"{record.help} [{record.env}]"
    if record.required:
        text += " (required)"
    elif record.kind is not bool and record.default not in _UNSET:
        text += f" (default {_shown_default(record)})"
    if record.old_flags:
        text += f" (formerly {', '.join(record.old_flags)})"
    return text


_UNIT_WORDS: Final = {"SECONDS": "s", "MS": "ms"}


def _shown_default(record: _Flag) -> str:
    """The default with its unit: ``10.0 s``, ``5.0 ms``, ``8388608 = 8 MiB``."""
    shown = _shown(record.default)
    if record.unit in _UNIT_WORDS:
        return f"{shown} {_UNIT_WORDS[record.unit]}"
    if record.unit == "BYTES" and isinstance(record.default, int) and record.default >= 1024:
        for size, word in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if record.default % size == 0:
                return f"{shown} = {record.default // size} {word}"
    return shown


# Defaults that mean "not set": saying "(default )" or "(default None)" tells nothing.
_UNSET: tuple[object, ...] = ("", None, ())


def _metavar(record: _Flag) -> str:
    """What the value looks like: the enum's choices, the unit, or a word from the type."""
    kind = record.kind
    if record.metavar is not None:
        return record.metavar
    if record.enum is not None:
        return _braced([str(member.value) for member in record.enum])
    if record.unit is not None:
        return record.unit
    shown = [check.metavar for check in record.checks if isinstance(check, _Shown)]
    if shown:
        return shown[0]
    if kind is int:
        return "N"
    if kind is Path or kind == Path | None:
        return "PATH"
    return "VALUE"


class _OneLineErrors(argparse.ArgumentParser):
    """argparse, except that a bad flag is a ``ConfigError`` (one line naming the flag)
    instead of argparse's exit, which prints the whole usage first: a dozen lines for
    a command with many flags, in which the one line that matters is easy to miss."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _command(config_type: type[Settings]) -> tuple[str, str, str]:
    command = getattr(config_type, "cli_command", None)
    if command is None:
        raise TypeError(f"{config_type.__qualname__}: a Settings subclass without prog=...")
    prog, description, env_prefix = command
    return prog, description, env_prefix


def build_parser(config_type: type[Settings], *, add_help: bool = True) -> argparse.ArgumentParser:
    """One flag per field of ``config_type``; every value is read as text, converted later.

    Raises ``TypeError`` for a field that no flag can set or that lacks its help."""
    prog, description, env_prefix = _command(config_type)
    description += f" Every flag has a {env_prefix}* environment twin."
    parser = _OneLineErrors(prog=prog, description=description, add_help=add_help)
    for record in _flags(config_type):
        if record.kind is bool:
            options: dict[str, Any] = {"action": "store_const", "const": "true"}
        else:
            options = {"metavar": _metavar(record)}
        parser.add_argument(record.flag, dest=record.field, help=_help_text(record), **options)
        for index, old in enumerate(record.old_flags):
            parser.add_argument(old, dest=record.old_dest(index), help=argparse.SUPPRESS, **options)
    return parser


def _raw_value(
    record: _Flag, namespace: argparse.Namespace, environ: Mapping[str, str], prog: str
) -> str | None:
    """The first given of: the flag, an old flag, the twin, an old twin; old ones warn."""
    spellings = [
        (record.flag, None, getattr(namespace, record.field)),
        *(
            (old, record.flag, getattr(namespace, record.old_dest(index)))
            for index, old in enumerate(record.old_flags)
        ),
        (record.env, None, environ.get(record.env)),
        *((old, record.env, environ.get(old)) for old in record.old_envs),
    ]
    given = [(name, new, raw) for name, new, raw in spellings if raw is not None]
    for name, new, _ in given:
        if new is not None:
            print(f"{prog}: {name} is deprecated, use {new}", file=sys.stderr)
    return given[0][2] if given else None


def parse(
    config_type: type[S],
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    exit_on_error: bool = True,
) -> S:
    """The settings of one command: flags from ``argv``, else their twins in ``environ``
    (``os.environ`` when None), else the defaults; then the fields' checks.

    A command's ``main`` keeps ``exit_on_error``: a bad flag or value ends the program
    with one line, ``<prog>: <flag>: <what is wrong> (see '<prog> --help')``, and exit
    status 2; ``--help`` prints the help and exits 0. Code that parses on behalf of
    someone else (the tuner checking a worker's flags, tests) passes
    ``exit_on_error=False``: every error is then a ``ConfigError``, and ``--help`` is
    an unknown flag like any other, so nothing it parses can end the process."""
    prog = _command(config_type)[0]
    parser = build_parser(config_type, add_help=exit_on_error)
    try:
        return _parse(config_type, parser, argv, os.environ if environ is None else environ)
    except ConfigError as exc:
        if not exit_on_error:
            raise
        parser.exit(2, f"{prog}: {exc} (see '{prog} --help')\n")


def _parse(
    config_type: type[S],
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str],
) -> S:
    namespace = parser.parse_args(list(argv))
    values: dict[str, Any] = {}
    for record in _flags(config_type):
        raw = _raw_value(record, namespace, environ, parser.prog)
        if raw is not None:
            values[record.field] = record.convert(raw)
        elif record.required:
            raise ConfigError(f"{record.flag}: required (or set {record.env})")
    return config_type(**values)


def spelling(config_type: type[Settings], field_name: str) -> str:
    """The flag that sets ``field_name`` of ``config_type``, as declared."""
    for record in _flags(config_type):
        if record.field == field_name:
            return record.flag
    raise KeyError(f"{config_type.__qualname__} has no field {field_name!r}")


def environment_twin(config_type: type[Settings], field_name: str) -> str:
    """The ``GPUSCOPE_*`` variable that sets ``field_name`` of ``config_type``."""
    for record in _flags(config_type):
        if record.field == field_name:
            return record.env
    raise KeyError(f"{config_type.__qualname__} has no field {field_name!r}")


def field_of(config_type: type[Settings], flag: str) -> str | None:
    """The field a flag (or one of its old spellings) sets, or None when none does."""
    for record in _flags(config_type):
        if flag == record.flag or flag in record.old_flags:
            return record.field
    return None


def to_argv(config_type: type[Settings], **values: Any) -> list[str]:
    """The flags that give ``values`` (by field name) to a child process running the
    command of ``config_type``, each in its current spelling: a switch alone when true, a
    tuple comma-joined, an enum by value. The values are checked as the child would check
    them (``config_type(**values)``), so a bad one fails here, in the parent."""
    settings = config_type(**values)
    argv: list[str] = []
    for record in _flags(config_type):
        if record.field not in values:
            continue
        value = getattr(settings, record.field)
        if record.kind is bool:
            argv += [record.flag] if value else []
        else:
            argv += [record.flag, "" if value is None else _shown(value)]
    return argv
