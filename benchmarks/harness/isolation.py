"""Run a benchmark's worker in a fresh Python process, so that its time and peak memory are its own.

:func:`run_isolated` calls ``module:function(*args, **kwargs)`` (JSON-ready arguments) in a child
``python -m benchmarks.harness.isolation`` and returns what the function returned, sent back as the last
line of the child's stdout. A failing child is a :class:`WorkerFailed` with one line: the child's last
line on stderr (a :class:`~topklab.utils.errors.TopklabError` as ``error: <message>``, else the
exception's line of the traceback).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from topklab.utils.errors import TopklabError


class WorkerFailed(TopklabError):
    """A worker process exited with an error; ``str()`` is one line, ``returncode`` the child's exit status."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def project_root() -> Path:
    """``$TOPKLAB_ROOT``, else the checkout this package lies in."""
    return Path(os.environ.get("TOPKLAB_ROOT") or Path(__file__).resolve().parents[2])


def failure_line(stderr: str, returncode: int) -> str:
    """The one line that says why a child failed: its last non-empty stderr line without an ``error: ``
    prefix, or its exit status (a negative one: killed by a signal, often for memory)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if lines:
        return lines[-1].strip().removeprefix("error: ")
    return f"exit {returncode}" + (" (killed: out of memory?)" if returncode < 0 else "")


def run_isolated(target: str, *args, env: dict | None = None, **kwargs):
    """``module:function(*args, **kwargs)`` in a fresh process; its JSON-decoded return value.

    ``env``: extra environment variables of the child (``TOPKLAB_ROOT`` is always passed on, and the
    checkout of :mod:`benchmarks` leads its ``PYTHONPATH``).
    Raises :class:`WorkerFailed` with a one-line message when the child fails.
    """
    call = json.dumps({"target": target, "args": list(args), "kwargs": kwargs})
    environment = {**os.environ, "TOPKLAB_ROOT": str(project_root()), **(env or {})}
    checkout = str(Path(__file__).resolve().parents[2])  # where the child imports ``benchmarks`` from
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout, environment.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.harness.isolation", call], capture_output=True, text=True, env=environment
    )
    if done.returncode != 0:
        raise WorkerFailed(failure_line(done.stderr, done.returncode), done.returncode)
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise WorkerFailed(f"{target} printed no result", 1)
    return json.loads(lines[-1])


def resolve(target: str):
    """``"package.module:function"`` -> the function."""
    module, _, name = target.partition(":")
    if not name:
        raise TopklabError(f"a worker target is module:function, got {target!r}")
    return getattr(importlib.import_module(module), name)


def child(argv: list[str]) -> int:
    """The child's side of :func:`run_isolated`: call the target, print its result as one JSON line."""
    call = json.loads(argv[0])
    try:
        result = resolve(call["target"])(*call["args"], **call["kwargs"])
    except TopklabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
