"""``cpu_budget``: the ingest thread's CPU time for decoding one request, enforced.

OTLP/JSON goes through protobuf's JSON mapping in Python at about 7 µs a value, so a
request within every cap (a million values) could hold the one ingest thread for seconds:
a 2.8 KB gzip body (one attribute of 900,000 empty array values) took 7.0 s of CPU, and
four connections posting such bodies made every other sender's export time out. Under
``cpu_budget`` the thread's profile hook looks at its CPU time every 1,024 calls and
stops the decode once the budget is spent (413 ``decode_budget``), or once the handler
has given the request up, so that the thread moves on at once.

The hook costs about as much again as the mapping it watches, so it is only set where
the budget could be spent: an OTLP/JSON body whose objects and arrays (``{`` and ``[``
in its bytes, an over-count) and other values (about one ``,`` each, an over-count too)
would take over a quarter of the budget. Counting containers alone let a small gzip body
of a million numbers, no container among them, decode unwatched. Protobuf is one
C call (0.5 s for the largest body, ``docs/reliability.md``) that no hook could stop.
"""

from __future__ import annotations

import inspect
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Final

from gpuscope.exporter.ingest import otlp

# ``gpuscope_otlp_requests_rejected_total{reason}``: over ``--max-decode-cpu-s`` (413).
DECODE_BUDGET: Final = "decode_budget"

# protobuf's JSON mapping, a value (``docs/reliability.md``)
JSON_VALUE_CPU_S: Final = 7e-6
# A number or string on its own: parsed (a float through a Python hook) and checked; an
# upper estimate (a million numbers decoded in 0.47-0.71 s of CPU here) that only decides
# the watching.
JSON_SCALAR_CPU_S: Final = 1e-6
_CHECK_EVERY: Final = 1024


class GivenUp(BaseException):
    """The handler gave the request up while it was decoded (not an ``Exception``, so
    that no ``except`` of the decoder takes it for a decoding error)."""


class _Spent(BaseException):
    pass


def needs_watching(data: bytes, media: str, budget_s: float) -> bool:
    """Whether decoding ``data`` could take over a quarter of ``budget_s``."""
    if media != otlp.JSON:
        return False
    containers = data.count(b"{") + data.count(b"[")
    separated = data.count(b",")  # one before each value but a container's first
    return containers * JSON_VALUE_CPU_S + separated * JSON_SCALAR_CPU_S > budget_s / 4


@contextmanager
def cpu_budget(budget_s: float, given_up: Callable[[], bool]) -> Iterator[None]:
    """Run the block in at most ``budget_s`` of this thread's CPU time (413
    ``OtlpError`` past it), and stop it (``GivenUp``) once ``given_up()``."""
    limit = time.thread_time() + budget_s
    calls = 0
    spent = False

    def check(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls, spent
        calls += 1
        if not spent and calls % _CHECK_EVERY == 0:
            spent = time.thread_time() > limit or given_up()
        if spent and not _in_finalizer(frame):
            raise _Spent

    sys.setprofile(check)
    try:
        yield
        # A decode that ran past the budget is refused even when it got to its end: the
        # hook is gone once an exception escapes it (CPython unsets a profile function
        # that raises), so one swallowed ``_Spent`` must not let the rest run free.
        if spent or time.thread_time() > limit:
            raise _Spent
    except _Spent:
        if given_up():
            raise GivenUp from None
        raise otlp.OtlpError(
            413,
            DECODE_BUDGET,
            f"decoding this request took more than {budget_s:g} s of CPU "
            "(--max-decode-cpu-s); send fewer values per request",
        ) from None
    finally:
        sys.setprofile(None)


# The standard library's weak-reference callbacks (a WeakValueDictionary's or WeakSet's
# removal, weakref.finalize): CPython runs them when an object dies, on whichever thread
# dropped it, right after its __del__.
_WEAKREF_FILES: Final = frozenset((weakref.__file__, inspect.getfile(weakref.WeakSet)))


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` or a standard weak-reference callback:
    the garbage collector runs other threads' finalizers on whichever thread allocates,
    and an exception raised there is swallowed (printed as unraisable), not delivered to
    the decode; and CPython unsets a profile function that raises, so the budget would
    not stop the rest of the decode."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename in _WEAKREF_FILES:
            return True
        frame = frame.f_back
    return False
