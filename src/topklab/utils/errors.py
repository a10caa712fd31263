"""Errors that mean "the user asked for something wrong": reported as one line, exit code 2."""


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
