"""Re-reading the web config and bearer token files while serving.

Both files are read again on SIGHUP and when one of them changes (its size, time or
inode, checked every ``CHECK_INTERVAL_S``; a Kubernetes secret swapped under a symlink
counts), so a revoked user, a rotated password or token, or a renewed certificate takes
effect within a second, without a restart. Before, the files were read at start only,
and SIGHUP killed the exporter without a word. exporter-toolkit reads its file on every
request; a check a second costs one ``stat`` per file instead.

What is swapped: the users and the token (the cache of verified passwords goes with the
old ones) and the TLS certificate, key and settings, which apply from the next
connection on. A reload only ever replaces the configuration with a complete, valid
one. Not applied, the old configuration staying, logged (once per distinct problem
when the watcher finds it, every time on SIGHUP) and counted in
``gpuscope_web_config_reloads_total{result="refused"}``:

- a file that does not load: bad YAML, a malformed hash, unreadable certificates, a
  path that is not a regular file (``security.read_bounded``: a FIFO, a directory, a
  device), one over 1 MiB, and whatever else the parser raises (``RecursionError``);
- a file that would turn TLS on or off (the listener's scheme is fixed at start);
- a file that would turn basic auth off, i.e. leave no users where there were some.
  That is what a file caught half-written looks like (truncated to nothing by ``cat
  new > web.yml``, cut after ``basic_auth_users:``, or before that key), and it would
  open ``/metrics`` to anyone; removing the last user takes a restart, as TLS does.

And the watcher waits for a file to settle: a change is read once the file's size,
time and inode have stayed the same for ``SETTLE_S``, so an editor or agent writing in
place is read when done, not midway (where it would at best lock users out for a
second). The watcher and the SIGHUP task survive every exception.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Final

from gpuscope.exporter.config import ConfigError
from gpuscope.exporter.http.auth import AuthState
from gpuscope.exporter.http.security import (
    Authenticator,
    WebConfig,
    load_web_config,
    read_bearer_token,
)
from gpuscope.exporter.self_metrics import RELOAD_APPLIED as APPLIED
from gpuscope.exporter.self_metrics import RELOAD_REFUSED as REFUSED
from gpuscope.exporter.state import ExporterState

log = logging.getLogger(__name__)

CHECK_INTERVAL_S: Final = 1.0
# How long a changed file must stay unchanged before the watcher reads it.
SETTLE_S: Final = 0.2

_Signature = tuple[int, int, int] | None


class CredentialFiles:
    """The ``--web-config-file`` and ``--bearer-token-file`` of one exporter, watched."""

    def __init__(self, state: ExporterState, auth: AuthState) -> None:
        self.state = state
        self.auth = auth
        self.paths = tuple(
            path
            for path in (state.config.web_config_file, state.config.bearer_token_file)
            if path is not None
        )
        self._seen = self._signatures()
        self._lock = asyncio.Lock()  # one reload at a time, SIGHUP or change
        self.reloads = self.refusals = 0  # applied and not, for tests and operators
        self._last_problem: str | None = None  # logged already; not again by the watcher

    def _signatures(self) -> tuple[_Signature, ...]:
        return tuple(_signature(path) for path in self.paths)

    async def watch(self) -> None:
        """Reload whenever a file changes and has settled; runs until cancelled, whatever
        a reload meets."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                changed = self._signatures()
                if changed == self._seen:
                    continue
                await asyncio.sleep(SETTLE_S)
                if self._signatures() == changed:  # else still being written: next check
                    await self.reload("changed")
            except Exception:  # a reload never raises; this is the last line of defence
                log.exception("checking --web-config-file and --bearer-token-file failed")

    async def reload(self, why: str) -> bool:
        """Read both files again and apply them if they load; True if applied. Never
        raises (but ``CancelledError``)."""
        async with self._lock:
            self._seen = self._signatures()
            if not self.paths:
                log.info("%s: no --web-config-file or --bearer-token-file to read again", why)
                return False
            try:
                return await self._reload(why)
            except Exception as exc:  # never seen; kept so no file can end the reloads
                return self._refused(why, f"{type(exc).__name__}: {exc}")

    async def _reload(self, why: str) -> bool:
        state = self.state
        config, current = state.config, self.auth.authenticator
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
                self._check_users(web_config, current)
        except ConfigError as exc:
            return self._refused(why, str(exc))
        # What has no file keeps what it was given at start.
        users = current.users if web_config is None else web_config.basic_auth_users
        self.auth.authenticator = Authenticator(users, token)
        if web_config is not None and web_config.tls is not None:
            state.guard.tls = web_config.tls
        self.reloads += 1
        state.metrics.web_config_reloads[APPLIED] += 1
        self._last_problem = None
        log.info(
            "%s: read %s again (%d basic auth users, bearer token %s, TLS %s)",
            why,
            " and ".join(map(str, self.paths)),
            len(users),
            "set" if token is not None else "unset",
            "on" if state.guard.tls is not None else "off",
        )
        return True

    def _refused(self, why: str, problem: str) -> bool:
        self.refusals += 1
        self.state.metrics.web_config_reloads[REFUSED] += 1
        # The watcher says a problem once; SIGHUP, which someone asked for, every time.
        if why != "changed" or problem != self._last_problem:
            problem_line = " ".join(problem.split())
            log.error("%s: not applied, keeping the previous configuration: %s", why, problem_line)
        self._last_problem = problem
        return False

    @staticmethod
    def _check_users(web_config: WebConfig, current: Authenticator) -> None:
        if current.users and not web_config.basic_auth_users:
            raise ConfigError(
                f"--web-config-file: basic auth would be turned off ({len(current.users)} users "
                "now, none in the file: a file being written looks so); that takes a restart"
            )

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
