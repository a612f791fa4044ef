"""Credentials that ship as examples and must never guard a real exporter.

The Kubernetes ``secure`` component carries a web config whose basic-auth hash is of
a published password and a bearer token anyone can read in the repository; applied
unchanged, they look like protection and are none. The exporter refuses to start with
them, and a reload that brings them is refused (the previous credentials stay). The
component's builder and this module take them from the contract
(``gpuscope.contract.http``), so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gpuscope.contract.http import EXAMPLE_HASH, EXAMPLE_PASSWORD, EXAMPLE_TOKEN, EXAMPLE_USER
from gpuscope.exporter.config import ConfigError

__all__ = (
    "EXAMPLE_HASH",
    "EXAMPLE_PASSWORD",
    "EXAMPLE_TOKEN",
    "EXAMPLE_USER",
    "refuse_placeholder_token",
    "refuse_placeholder_users",
)

PLACEHOLDER_HASHES: Final = frozenset((EXAMPLE_HASH,))
PLACEHOLDER_TOKENS: Final = frozenset((EXAMPLE_TOKEN,))


def refuse_placeholder_users(users: Mapping[str, str], flag: str) -> None:
    """A ``ConfigError`` naming the user whose hash is a shipped example's."""
    for user, hashed in users.items():
        if hashed in PLACEHOLDER_HASHES:
            raise ConfigError(
                f"{flag}: basic_auth_users.{user} is the example hash the Kubernetes secure "
                f"component ships (of the password {EXAMPLE_PASSWORD!r}): replace it with the "
                "bcrypt hash of a password of your own, and that password in the scrape "
                "credentials"
            )


def refuse_placeholder_token(token: str, flag: str) -> None:
    """A ``ConfigError`` when ``token`` is the example token the component ships."""
    if token in PLACEHOLDER_TOKENS:
        raise ConfigError(
            f"{flag}: the token is the example the Kubernetes secure component ships "
            f"({token!r}): replace it with a long random one (openssl rand -hex 32), in "
            "the senders' Authorization header too"
        )
