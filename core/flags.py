"""Command-line flags with ``GPUSCOPE_*`` environment twins, parsed once into a frozen dataclass.

Every gpuscope command describes its settings as a frozen dataclass whose fields are
the flags: field ``max_batch_size`` is ``--max-batch-size`` with the environment twin
``GPUSCOPE_MAX_BATCH_SIZE``; a flag on the command line wins over its twin, and the
twin over the field's default. Values are converted by the field's annotation; the
dataclass's ``__post_init__`` validates and raises ``ConfigError`` naming the flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_TRUE = frozenset(("1", "true", "yes", "on"))
_FALSE = frozenset(("0", "false", "no", "off", ""))


class ConfigError(ValueError):
    """A flag (or its environment twin) has a value the command cannot use."""


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str, prefix: str = "GPUSCOPE_") -> str:
    return prefix + field_name.upper()


def check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{flag}: expected one of {', '.join(choices)}, got {value!r}")


def check_range(flag: str, value: float, low: float, high: float | None = None) -> None:
    """``low <= value <= high`` (no upper bound when ``high`` is None)."""
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{flag}: must be {bound}, got {value}")


def check_positive(flag: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{flag}: must be greater than 0, got {value}")


def _read_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(raw)


# field annotation (a string under ``from __future__ import annotations``) -> reader
_READERS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "bool": _read_bool,
    "str": str,
    "str | None": lambda raw: raw or None,
    "Path": Path,
    "Path | None": lambda raw: Path(raw) if raw else None,
    "tuple[str, ...]": lambda raw: tuple(part.strip() for part in raw.split(",") if part.strip()),
}


def convert(field_name: str, annotation: object, raw: str) -> Any:
    """A flag's text as its field's type; a ``ConfigError`` naming the flag otherwise."""
    reader = _READERS.get(str(annotation))
    if reader is None:
        raise TypeError(f"field {field_name!r}: no flag reader for type {annotation!r}")
    try:
        return reader(raw)
    except ValueError:
        raise ConfigError(f"{flag_name(field_name)}: cannot read {raw!r} as {annotation}") from None


def build_parser(
    config_type: type[Any],
    *,
    prog: str,
    description: str,
    help: Mapping[str, str],
    env_prefix: str = "GPUSCOPE_",
) -> argparse.ArgumentParser:
    """One flag per field of ``config_type``; every value is read as text, converted later."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for field in fields(config_type):
        flag = flag_name(field.name)
        text = f"{help[field.name]} [{env_name(field.name, env_prefix)}]"
        if str(field.type) == "bool":
            parser.add_argument(flag, action="store_const", const="true", help=text)
            continue
        default = field.default
        if default is MISSING:
            shown = "required"
        elif isinstance(default, tuple):
            shown = "default " + ",".join(map(str, default))
        else:
            shown = f"default {default}"
        parser.add_argument(flag, metavar="VALUE", help=f"{text} ({shown})")
    return parser


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
    for field in fields(config_type):  # type: ignore[arg-type]
        raw = getattr(namespace, field.name)
        if raw is None:
            raw = environ.get(env_name(field.name, env_prefix))
        if raw is not None:
            values[field.name] = convert(field.name, field.type, raw)
        elif field.default is MISSING and field.default_factory is MISSING:
            twin = env_name(field.name, env_prefix)
            raise ConfigError(f"{flag_name(field.name)}: required (or set {twin})")
    return config_type(**values)


def parse_or_exit(
    config_type: type[T],
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    env_prefix: str = "GPUSCOPE_",
) -> T:
    """``parse_config``, but a ``ConfigError`` ends the program with argparse's usage
    message and exit status 2, like any other bad flag."""
    try:
        return parse_config(config_type, parser, argv, environ, env_prefix)
    except ConfigError as exc:
        parser.error(str(exc))
