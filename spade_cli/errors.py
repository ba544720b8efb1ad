"""Exit codes and the one place exceptions become them.

In: an exception escaping a command. Out: one line on stderr (`spade <cmd>: error: ...`) and
the documented exit code. Guarantees: a bug (1) prints its traceback; everything else prints one
line. Codes: 0 ok, 1 bug, 2 usage, 65 bad input data, 66 missing input, 69 unavailable resource,
73 cannot create output, 74 output I/O error (disk full), 75 partial, 77 no permission (a
folder another user owns or can write, a write that would follow a link out of the run
directory: stages/trust.py), 130 interrupted.
"""

from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager
from typing import Iterator

OK, BUG, USAGE, DATA, NO_INPUT, UNAVAILABLE, PARTIAL, INTERRUPTED = 0, 1, 2, 65, 66, 69, 75, 130
BUSY = 73  # sysexits' EX_CANTCREAT: the output (a run directory) is another process's now
NO_PERMISSION = 77  # sysexits' EX_NOPERM: a folder or destination another user could have planted


class UsageError(Exception):
    """Options that do not make sense together (exit 2)."""


class Busy(Exception):
    """An output another process holds now, such as a run directory's lock (exit 73)."""


def exit_code_for(exc: BaseException) -> int:
    from sandbox.jail import SandboxUnavailable
    from stages.backends import BackendUnavailable
    from stages.records import RecordError
    from stages.shards import InputMissing, OutputError
    from stages.train import Diverged
    from stages.trust import Untrusted

    if isinstance(exc, (RecordError, Diverged)):  # Diverged: the samples made the loss non-finite
        return DATA
    if isinstance(exc, InputMissing):
        return NO_INPUT
    if isinstance(exc, OutputError):  # 73 cannot create the output, 74 disk full / I/O error
        return exc.code
    if isinstance(exc, (SandboxUnavailable, BackendUnavailable)):
        return UNAVAILABLE
    if isinstance(exc, UsageError):
        return USAGE
    if isinstance(exc, Busy):
        return BUSY
    if isinstance(exc, Untrusted):
        return NO_PERMISSION
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        return OK  # `spade ... | head` is a normal way to stop reading
    return BUG


@contextmanager
def errors_to_exit(command: str) -> Iterator[None]:
    try:
        yield
    except SystemExit:
        raise
    except BaseException as exc:
        code = exit_code_for(exc)
        if isinstance(exc, BrokenPipeError):  # keep Python's exit-time flush quiet too
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if code == BUG:
            traceback.print_exc()
        elif code == INTERRUPTED:
            print(f"spade {command}: interrupted", file=sys.stderr)
        elif code != OK:
            from spade_cli.terminal import terminal_safe

            print(f"spade {command}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        raise SystemExit(code) from None
