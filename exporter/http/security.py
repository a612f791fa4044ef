"""TLS and authentication: Prometheus exporter-toolkit ``web-config.yml`` and a bearer token.

The web config file has the exporter-toolkit shape, so the file users already have
for node_exporter works here::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash

Keys this exporter does not implement are refused by name rather than ignored, so a
config that asks for more protection than it gets fails at start.

Both files are read by ``read_bounded``: opened without blocking, refused unless they
are regular files (a FIFO, a directory, ``/dev/zero`` behind a symlink), at most
``MAX_FILE_BYTES`` and within ``READ_DEADLINE_S``. Whatever the YAML parser or the
checks raise (``RecursionError`` from deep nesting included) becomes a ``ConfigError``
naming the flag, so a bad file stops the exporter at start with one line and is never
applied on a reload.

Basic auth, when configured, guards every endpoint. ``/v1/traces`` takes the bearer
token instead when one is configured (OTLP SDKs send headers, not passwords).
bcrypt is slow on purpose (tens of ms); a verified ``(user, password digest)`` pair is
cached so a scrape every few seconds does not pay it again. A user name that is not
configured is checked against a dummy hash of the configured users' cost, as
exporter-toolkit does, so that the time of a refusal does not say which users exist
(before: 169 ms for a known user with a wrong password, 2 ms for an unknown one).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import ssl
import stat
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import bcrypt
import yaml

from gpuscope.exporter.config import ConfigError
from gpuscope.exporter.http.placeholders import refuse_placeholder_token, refuse_placeholder_users

_FLAG = "--web-config-file"
# A web config with a few hundred users is tens of KiB; a token file a few hundred bytes.
MAX_FILE_BYTES: Final = 1024 * 1024
READ_DEADLINE_S: Final = 2.0
_READ_CHUNK = 64 * 1024
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_auth_type",
    "min_version",
    "max_version",
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERIFIED_CACHE_LIMIT = 1024
# bcrypt reads at most 72 bytes of a password (Go's and bcrypt < 5 truncate silently;
# bcrypt >= 5 raises): a longer password is checked by its first 72 bytes, as it was hashed.
BCRYPT_MAX_PASSWORD_BYTES = 72
# $2a$/$2b$/$2y$, a two-digit cost, then 22 characters of salt and 31 of hash.
_BCRYPT_HASH = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
# exporter-toolkit's dummy (the hash of "fakepassword"), its cost put in front: checking
# a password against it costs what checking against a user's hash of that cost does.
_DUMMY_SALT_AND_HASH = "QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


@dataclass(frozen=True)
class WebConfig:
    tls: ssl.SSLContext | None = None
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict)


def read_bounded(path: Path, flag: str) -> bytes:
    """The bytes of the regular file ``path``, read without ever blocking on what the
    path names: ``ConfigError`` (naming ``flag``) for anything else, for a file over
    ``MAX_FILE_BYTES`` and for one not read within ``READ_DEADLINE_S``."""
    where = f"{flag}: cannot read {str(path)!r}"
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: {_one_line(exc)}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{where}: not a regular file ({_file_kind(mode)})")
        data, deadline = bytearray(), time.monotonic() + READ_DEADLINE_S
        while chunk := os.read(fd, _READ_CHUNK):
            data += chunk
            if len(data) > MAX_FILE_BYTES:
                raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
            if time.monotonic() > deadline:
                raise ConfigError(f"{where}: not read within {READ_DEADLINE_S:g} s")
        return bytes(data)
    except OSError as exc:
        raise ConfigError(f"{where}: {_one_line(exc)}") from exc
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"))
    return next((name for test, name in kinds if test(mode)), "not a plain file")


def load_web_config(path: Path) -> WebConfig:
    """Parse an exporter-toolkit web config; errors name the flag and the key. Any
    failure at all is a ``ConfigError``: a reload must never die of a file."""
    raw = read_bounded(path, _FLAG)
    try:
        return _web_config(raw, path)
    except ConfigError:
        raise
    except Exception as exc:  # RecursionError, MemoryError, odd types: never let one out
        raise ConfigError(
            f"{_FLAG}: cannot read {str(path)!r}: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc


def _web_config(raw: bytes, path: Path) -> WebConfig:
    try:
        document = yaml.safe_load(raw.decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{_FLAG}: cannot read {str(path)!r}: {_one_line(exc)}") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"{_FLAG}: {str(path)!r} must hold a mapping")
    unknown = set(document) - {"tls_server_config", "basic_auth_users"}
    if unknown:
        raise ConfigError(f"{_FLAG}: unsupported keys {sorted(map(str, unknown))}")
    tls_section = document.get("tls_server_config")
    tls = _tls_context(tls_section, path.parent) if tls_section else None
    return WebConfig(tls, _basic_auth_users(document.get("basic_auth_users") or {}))


def _basic_auth_users(users: Any) -> dict[str, bytes]:
    """User -> bcrypt hash; every hash is checked here, so a bad one fails at start."""
    if not isinstance(users, dict) or not all(
        isinstance(u, str) and isinstance(h, str) for u, h in users.items()
    ):
        raise ConfigError(f"{_FLAG}: basic_auth_users must map user names to bcrypt hashes")
    for user, hashed in users.items():
        match = _BCRYPT_HASH.fullmatch(hashed)
        if match is None or not 4 <= int(match.group(1)) <= 31:
            raise ConfigError(
                f"{_FLAG}: basic_auth_users.{user} is not a bcrypt hash "
                "($2a$, $2b$ or $2y$, cost 04-31, 53 characters of salt and hash)"
            )
    refuse_placeholder_users(users, _FLAG)
    return {user: hashed.encode() for user, hashed in users.items()}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _tls_context(section: Any, base: Path) -> ssl.SSLContext:
    if not isinstance(section, dict):
        raise ConfigError(f"{_FLAG}: tls_server_config must be a mapping")
    unknown = set(section) - _TLS_KEYS
    if unknown:
        raise ConfigError(
            f"{_FLAG}: unsupported tls_server_config keys {sorted(map(str, unknown))}"
        )
    for key, value in section.items():
        if value is not None and not isinstance(value, str):
            raise ConfigError(
                f"{_FLAG}: tls_server_config.{key} must be a string, "
                f"got {type(value).__name__} {value!r}"
            )
    if not section.get("cert_file") or not section.get("key_file"):
        raise ConfigError(f"{_FLAG}: tls_server_config needs both cert_file and key_file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    for key in ("cert_file", "key_file", "client_ca_file"):
        if section.get(key):
            _check_regular(base / section[key], f"tls_server_config.{key}")
    try:
        context.load_cert_chain(base / section["cert_file"], base / section["key_file"])
        if section.get("client_ca_file"):
            context.load_verify_locations(base / section["client_ca_file"])
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{_FLAG}: tls_server_config: {_one_line(exc)}") from exc
    auth_type = section.get("client_auth_type") or "NoClientCert"
    if auth_type not in _CLIENT_AUTH:
        raise ConfigError(
            f"{_FLAG}: tls_server_config.client_auth_type {auth_type!r} is not supported"
        )
    if auth_type != "NoClientCert" and not section.get("client_ca_file"):
        raise ConfigError(f"{_FLAG}: client_auth_type {auth_type} needs client_ca_file")
    context.verify_mode = _CLIENT_AUTH[auth_type]
    for key, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if section.get(key) is not None:
            version = _TLS_VERSIONS.get(section[key])
            if version is None:
                raise ConfigError(
                    f"{_FLAG}: tls_server_config.{key} must be TLS12 or TLS13, got {section[key]!r}"
                )
            setattr(context, attribute, version)
    return context


def _check_regular(path: Path, key: str) -> None:
    """OpenSSL opens certificate files itself and would wait forever on a FIFO."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return  # OpenSSL's own error says what is missing
    if not stat.S_ISREG(mode):
        kind = _file_kind(mode)
        raise ConfigError(f"{_FLAG}: {key} {str(path)!r} is not a regular file ({kind})")


def read_bearer_token(path: Path) -> str:
    raw = read_bounded(path, "--bearer-token-file")
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--bearer-token-file: cannot read {str(path)!r}: {_one_line(exc)}"
        ) from exc
    if not token:
        raise ConfigError(f"--bearer-token-file: {str(path)!r} is empty")
    refuse_placeholder_token(token, "--bearer-token-file")
    return token


class Authenticator:
    """Checks ``Authorization`` headers against the configured users and token."""

    def __init__(self, users: Mapping[str, bytes], bearer_token: str | None) -> None:
        self.users = dict(users)
        self.bearer_token = bearer_token
        self._verified: set[tuple[str, bytes]] = set()
        self._dummy = dummy_hash(self.users.values())

    def bearer_ok(self, header: str | None) -> bool:
        """Any header that is not exactly ``Bearer <token>`` is refused, never an error."""
        if self.bearer_token is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        # aiohttp keeps undecodable header bytes as surrogates: encode them back.
        presented = token.strip().encode("utf-8", "surrogateescape")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            presented, self.bearer_token.encode()
        )

    def basic_credentials(self, header: str | None) -> tuple[str, bytes] | None:
        """``(user, password)`` from a Basic header, or None if it is not a valid one."""
        scheme, _, encoded = (header or "").partition(" ")
        if scheme.lower() != "basic" or not encoded.isascii():
            return None
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).partition(b":")
            return (user.decode(), password) if sep else None
        except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
            return None

    def cached(self, user: str, password: bytes) -> bool:
        return (user, hashlib.sha256(password).digest()) in self._verified

    def verify(self, user: str, password: bytes) -> bool:
        """bcrypt check (slow: run it off the event loop); remembers successes. An
        unknown user costs one check against the dummy hash, then is refused."""
        hashed = self.users.get(user)
        try:
            ok = bcrypt.checkpw(password[:BCRYPT_MAX_PASSWORD_BYTES], hashed or self._dummy)
        except ValueError:  # a hash that passed the load-time check but bcrypt refuses
            return False
        if not ok or hashed is None:
            return False
        if len(self._verified) >= _VERIFIED_CACHE_LIMIT:
            self._verified.clear()
        self._verified.add((user, hashlib.sha256(password).digest()))
        return True


def dummy_hash(hashes: Iterable[bytes]) -> bytes:
    """A bcrypt hash that no password matches (in practice), of the cost most of
    ``hashes`` have (the highest among equals; 10, exporter-toolkit's, if none)."""
    costs = Counter(int(hashed[4:6]) for hashed in hashes)
    cost = max(costs, key=lambda c: (costs[c], c)) if costs else 10
    return f"$2b${cost:02d}${_DUMMY_SALT_AND_HASH}".encode()
