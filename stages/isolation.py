"""Per-record isolation: one env's bad data costs that env's own record, never the stage.

In: the work that turns one env's data into its record (a callable), a label naming that env,
and how to build the env's failure record from a `Failure`.
Out: the record, checked writeable (`records.dumps` accepts it: no lone surrogates, no ints past
64 bits, no NaN), or else the failure record.
Guarantees: an exception met while processing one env becomes that env's failure,
`Failure(type="internal.<ExceptionName>", msg=<one line>)`, with outcome INTERNAL: one warning
line names the env, the traceback goes to the debug log, and stages count the record under
INTERNAL in their summary line. What is no single env's fault passes through and stops the
stage as documented: no jail (SandboxUnavailable, exit 69), no backend (BackendUnavailable,
exit 69), and KeyboardInterrupt (not an Exception).

This is the last resort behind the checks at the jail boundary (sandbox/replies.py), which give
stages well-typed replies: reaching it means spade met a case it does not handle yet.
"""

from __future__ import annotations

import logging
import re
from typing import Callable, TypeVar

from sandbox.jail import SandboxUnavailable
from stages.backends import BackendUnavailable
from stages.records import Failure, dumps

log = logging.getLogger("spade.isolation")

INTERNAL = "internal_error"
PASS_THROUGH = (SandboxUnavailable, BackendUnavailable)
MAX_MSG = 300
SURROGATE = re.compile("[\ud800-\udfff]")

R = TypeVar("R")


def one_line(exc: BaseException) -> str:
    """The exception's message as one line of valid text, at most MAX_MSG characters."""
    try:
        text = str(exc)
    except Exception:  # an exception carrying env data may fail to print itself
        text = ""
    text = " ".join(valid_text(text).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= MAX_MSG else text[:MAX_MSG - 3] + "..."


def valid_text(text: str) -> str:
    """`text` with every lone surrogate (which no shard can hold) replaced by U+FFFD."""
    return SURROGATE.sub("\ufffd", text)


def failure(exc: Exception, label: str) -> Failure:
    """Log an unexpected exception met while processing one env; the Failure for its record."""
    msg = one_line(exc)
    log.warning("%s: internal error, recorded as this record's failure: %s", label, msg)
    log.debug("%s: traceback", label, exc_info=exc)
    return Failure(type=f"internal.{type(exc).__name__}", msg=msg)


def isolated(label: str, build: Callable[[], R], failed: Callable[[Failure], R]) -> R:
    """`build()`, checked writeable; on an unexpected exception, `failed(failure)` instead.

    The failure record must itself be writeable: if it is not, that is a bug and it raises.
    """
    try:
        record = build()
        dumps(record)
        return record
    except PASS_THROUGH:
        raise
    except Exception as exc:
        record = failed(failure(exc, label))
        dumps(record)
        return record
