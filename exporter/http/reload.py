"""Re-reading the web config and bearer token files while serving.

Both files are read again on SIGHUP and when one of them changes (its size, time or
inode, checked every ``CHECK_INTERVAL_S``; a Kubernetes secret swapped under a symlink
counts), so a revoked user, a rotated password or token, or a renewed certificate takes
effect within a second, without a restart. Before, the files were read at start only,
and SIGHUP killed the exporter without a word. exporter-toolkit reads its file on every
request; a check a second costs one ``stat`` per file instead.

What is swapped: the users and the token (the cache of verified passwords goes with the
old ones) and the TLS certificate, key and settings, which apply from the next
connection on. A new file that does not load (bad YAML, a malformed hash, unreadable
certificates), or that would turn TLS on or off (the listener's scheme is fixed at
start), is not applied: the old configuration stays, and one log line says why.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Final

from gpuscope.exporter.config import ConfigError
from gpuscope.exporter.http.security import (
    Authenticator,
    WebConfig,
    load_web_config,
    read_bearer_token,
)
from gpuscope.exporter.state import ExporterState

log = logging.getLogger(__name__)

CHECK_INTERVAL_S: Final = 1.0

_Signature = tuple[int, int, int] | None


class CredentialFiles:
    """The ``--web-config-file`` and ``--bearer-token-file`` of one exporter, watched."""

    def __init__(self, state: ExporterState) -> None:
        self.state = state
        self.paths = tuple(
            path
            for path in (state.config.web_config_file, state.config.bearer_token_file)
            if path is not None
        )
        self._seen = self._signatures()
        self._lock = asyncio.Lock()  # one reload at a time, SIGHUP or change
        self.reloads = self.refusals = 0  # applied and not, for tests and operators

    def _signatures(self) -> tuple[_Signature, ...]:
        return tuple(_signature(path) for path in self.paths)

    async def watch(self) -> None:
        """Reload whenever a file changes; runs until cancelled."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            if self._signatures() != self._seen:
                await self.reload("changed")

    async def reload(self, why: str) -> bool:
        """Read both files again and apply them if they load; True if applied."""
        async with self._lock:
            self._seen = self._signatures()
            if not self.paths:
                log.info("%s: no --web-config-file or --bearer-token-file to read again", why)
                return False
            state = self.state
            config, current = state.config, state.authenticator
            try:
                web_config = (
                    await asyncio.to_thread(load_web_config, config.web_config_file)
                    if config.web_config_file is not None
                    else None
                )
                token = (
                    await asyncio.to_thread(read_bearer_token, config.bearer_token_file)
                    if config.bearer_token_file is not None
                    else current.bearer_token
                )
                if web_config is not None:
                    self._check_tls(web_config)
            except ConfigError as exc:
                log.error("%s: not applied, keeping the previous configuration: %s", why, exc)
                self.refusals += 1
                return False
            # What has no file keeps what it was given at start.
            users = current.users if web_config is None else web_config.basic_auth_users
            state.authenticator = Authenticator(users, token)
            if web_config is not None and web_config.tls is not None:
                state.guard.tls = web_config.tls
            self.reloads += 1
            log.info(
                "%s: read %s again (%d basic auth users, bearer token %s, TLS %s)",
                why,
                " and ".join(map(str, self.paths)),
                len(users),
                "set" if token is not None else "unset",
                "on" if state.guard.tls is not None else "off",
            )
            return True

    def _check_tls(self, web_config: WebConfig) -> None:
        serving_tls = self.state.guard.tls is not None
        if (web_config.tls is not None) != serving_tls:
            now, then = ("on", "off") if serving_tls else ("off", "on")
            raise ConfigError(
                f"--web-config-file: TLS is {now} and would be {then}; that takes a restart"
            )


def _signature(path: Path) -> _Signature:
    try:
        stat = os.stat(path)
    except OSError:
        return None  # gone for now (being replaced): a change like any other
    return stat.st_mtime_ns, stat.st_size, stat.st_ino
