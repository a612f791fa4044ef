"""Command-line flags with ``GPUSCOPE_*`` environment twins, parsed once into a frozen dataclass.

Every gpuscope command describes its settings as a frozen dataclass whose fields are
the flags: field ``max_batch_size`` is ``--max-batch-size`` with the environment twin
``GPUSCOPE_MAX_BATCH_SIZE``; a flag on the command line wins over its twin, and the
twin over the field's default. The dataclass's ``__post_init__`` validates and raises
``ConfigError`` naming the flag.

Values are converted by the field's resolved type (``typing.get_type_hints``): ``int``,
``float``, ``str``, ``Path``, ``bool`` (a switch), an ``Enum`` (by value), ``X | None``
(empty text means None) and tuples (comma-separated). A field of any other type is
refused when the command's parser is built, not when someone first sets the flag.

A quantity with a unit names the unit at the end of its flag: ``-s`` for seconds,
``-ms`` for milliseconds, ``-bytes`` for bytes. A field may spell its flag
differently from its name, and keep old spellings that still work with a warning::

    gpu_interval: float = option(1.0, flag="--gpu-interval-s", deprecated=("--gpu-interval",))
"""

from __future__ import annotations

import argparse
import enum
import math
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

T = TypeVar("T")
Reader = Callable[[str], Any]

# The --log-level choices every command takes (the ``logging`` levels, lower case).
LOG_LEVELS: Final = ("critical", "error", "warning", "info", "debug")

_TRUE = frozenset(("1", "true", "yes", "on"))
_FALSE = frozenset(("0", "false", "no", "off", ""))
_SPELLING_KEY = "gpuscope.flags"


class ConfigError(ValueError):
    """A flag (or its environment twin) has a value the command cannot use."""


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _twin(flag: str, prefix: str) -> str:
    """``--gpu-interval-s`` -> ``GPUSCOPE_GPU_INTERVAL_S``."""
    return prefix + flag.removeprefix("--").replace("-", "_").upper()


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
    """An absolute ``http://`` or ``https://`` URL with a host, such as ``example``."""
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(f"{flag}: expected an http(s) URL such as {example}, got {value!r}")


@dataclass(frozen=True)
class _Spelling:
    flag: str | None
    deprecated: tuple[str, ...]


def option(default: T, *, flag: str | None = None, deprecated: Sequence[str] = ()) -> T:
    """A field whose flag is spelled ``flag`` instead of after the field's name, and
    whose ``deprecated`` spellings (and their environment twins) still work, with a
    one-line warning on stderr."""
    spelling = _Spelling(flag, tuple(deprecated))
    return field(default=default, metadata={_SPELLING_KEY: spelling})


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
# One record per field: its spellings, twins and reader.


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

    def old_dest(self, index: int) -> str:
        return f"{self.field}__deprecated_{index}"

    def convert(self, raw: str) -> Any:
        try:
            return self.read(raw)
        except ValueError:
            raise ConfigError(
                f"{self.flag}: cannot read {raw!r} as {type_name(self.kind)}"
            ) from None


def _flags(config_type: type[Any], env_prefix: str) -> list[_Flag]:
    """The flags of ``config_type``; ``TypeError`` for a field no flag can set."""
    try:
        hints = get_type_hints(config_type)
    except NameError as exc:
        raise TypeError(f"{config_type.__qualname__}: cannot resolve annotations: {exc}") from None
    records = []
    for item in fields(config_type):
        spelling = item.metadata.get(_SPELLING_KEY, _Spelling(None, ()))
        flag = spelling.flag or flag_name(item.name)
        for spelled in (flag, *spelling.deprecated):
            if not spelled.startswith("--"):
                raise TypeError(f"{config_type.__qualname__}.{item.name}: flag {spelled!r}")
        try:
            read = reader_for(hints[item.name])
        except TypeError as exc:
            raise TypeError(f"{config_type.__qualname__}.{item.name}: {exc}") from None
        records.append(
            _Flag(
                field=item.name,
                kind=hints[item.name],
                read=read,
                flag=flag,
                env=_twin(flag, env_prefix),
                old_flags=spelling.deprecated,
                old_envs=tuple(_twin(old, env_prefix) for old in spelling.deprecated),
                default=item.default,
                required=item.default is MISSING and item.default_factory is MISSING,
            )
        )
    return records


def _help_text(record: _Flag, text: str) -> str:
    text = f"{text} [{record.env}]"
    if record.required:
        text += " (required)"
    elif record.kind is not bool and "(default" not in text and record.default not in _UNSET:
        text += f" (default {_shown(record.default)})"
    if record.old_flags:
        text += f" (formerly {', '.join(record.old_flags)})"
    return text


# Defaults that mean "not set": saying "(default )" or "(default None)" tells nothing.
_UNSET: tuple[object, ...] = ("", None, ())


def _metavar(kind: object, flag: str) -> str:
    """What the value looks like: the enum's choices, or a word from the type and unit."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "{" + ",".join(str(member.value) for member in kind) + "}"
    for suffix, word in (("-ms", "MS"), ("-s", "SECONDS"), ("-bytes", "BYTES"), ("url", "URL")):
        if flag.endswith(suffix):
            return word
    if kind is int:
        return "N"
    if kind is Path or kind == Path | None:
        return "PATH"
    return "VALUE"


class _OneLineErrors(argparse.ArgumentParser):
    """argparse, except that a bad flag is one line naming the flag and ``--help``.

    argparse's own error prints the whole usage first, a dozen lines for a command
    with many flags, in which the one line that matters is easy to miss."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def build_parser(
    config_type: type[Any],
    *,
    prog: str,
    description: str,
    help: Mapping[str, str],
    env_prefix: str = "GPUSCOPE_",
) -> argparse.ArgumentParser:
    """One flag per field of ``config_type``; every value is read as text, converted later.

    Raises ``TypeError`` for a field whose type no flag can set."""
    parser = _OneLineErrors(prog=prog, description=description)
    for record in _flags(config_type, env_prefix):
        text = _help_text(record, help[record.field])
        if record.kind is bool:
            options: dict[str, Any] = {"action": "store_const", "const": "true"}
        else:
            options = {"metavar": _metavar(record.kind, record.flag)}
        parser.add_argument(record.flag, dest=record.field, help=text, **options)
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


def parse_config(
    config_type: type[T],
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    env_prefix: str = "GPUSCOPE_",
) -> T:
    """Flags from ``argv``, else their twins in ``environ``, else the defaults."""
    environ = os.environ if environ is None else environ
    namespace = parser.parse_args(list(argv))
    values: dict[str, Any] = {}
    for record in _flags(config_type, env_prefix):
        raw = _raw_value(record, namespace, environ, parser.prog)
        if raw is not None:
            values[record.field] = record.convert(raw)
        elif record.required:
            raise ConfigError(f"{record.flag}: required (or set {record.env})")
    return config_type(**values)


def parse_or_exit(
    config_type: type[T],
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    env_prefix: str = "GPUSCOPE_",
) -> T:
    """``parse_config``, but a ``ConfigError`` ends the program with a one-line message
    and exit status 2, like any other bad flag."""
    try:
        return parse_config(config_type, parser, argv, environ, env_prefix)
    except ConfigError as exc:
        parser.error(str(exc))
