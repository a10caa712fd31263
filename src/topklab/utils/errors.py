"""Errors that mean "the user asked for something wrong": reported as one line, exit code 2
(:func:`fail`)."""

import sys


class TopklabError(Exception):
    """Bad input or missing data; the message says what is wrong and how to fix it."""


class DataUnavailableError(TopklabError):
    """A dataset's files or package are not installed here."""


class NonFiniteLossError(TopklabError):
    """Training produced a NaN/inf loss; ``last_good_state`` holds the state before that step."""

    def __init__(self, message: str, last_good_state: dict | None = None):
        super().__init__(message)
        self.last_good_state = last_good_state


class Interrupted(TopklabError):
    """SIGTERM or Ctrl-C stopped a run at a safe point (after its checkpoint was written); exits with
    the shell's code for the signal, 128 + its number, as schedulers expect."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.exit_code = 128 + signal_number


def first_line(error: BaseException) -> str:
    """An exception's first line, at most 200 characters (its type's name when it has no message): what a
    one-line error or warning quotes of a failure.

    Examples
    --------
    >>> first_line(RuntimeError(chr(10).join(["CppCompileError: gcc not found", "more detail"])))
    'CppCompileError: gcc not found'
    """
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def fail(err: Exception | str) -> None:
    """Print ``error: <err>`` on stderr and exit with code 2 (an interrupted run: 128 + the signal).
    Any other exception than a :class:`TopklabError` is a bug, not a fault: it is raised again with its
    traceback instead of being hidden behind one line."""
    if isinstance(err, BaseException) and not isinstance(err, TopklabError):
        raise err
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(getattr(err, "exit_code", 2))
