"""SIGTERM (what SLURM and most schedulers send before a kill) and Ctrl-C during training: the signal
is noted, the engine writes its checkpoint at the end of the current step and stops with one line;
rerunning the same command resumes exactly. A second Ctrl-C stops at once."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

HANDLED = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []


def pending_signal() -> int | None:
    """The first signal received inside :func:`deferred_signals`, or None."""
    return _received[0] if _received else None


def _note(number: int, frame) -> None:
    if number == signal.SIGINT and signal.SIGINT in _received:
        raise KeyboardInterrupt
    _received.append(number)


@contextmanager
def deferred_signals():
    """Within the block, SIGTERM and SIGINT are noted for :func:`pending_signal` instead of ending the
    process; the previous handlers come back after it. Outside the main thread (where Python cannot
    install handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = {number: signal.signal(number, _note) for number in HANDLED}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _received.clear()
