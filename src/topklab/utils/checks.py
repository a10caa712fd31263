"""One check for the integer fields of configs and constructors, so that every one fails alike."""

from __future__ import annotations


def check_int(
    name: str,
    value,
    low: int = 1,
    high: int | None = None,
    allow_none: bool = False,
    error: type[Exception] = ValueError,
    why: str = "",
) -> None:
    """Raise ``error`` with one line unless ``value`` is an int (not a bool) in ``[low, high]``
    (``high`` None: no upper end), or None where ``allow_none``.

    Parameters
    ----------
    name : the field as the user writes it (``engine.batch_size``), first in the message
    low, high : the allowed range, both ends included
    why : what the field means, added in parentheses

    Examples
    --------
    >>> check_int("engine.batch_size", 16)
    >>> check_int("engine.batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: engine.batch_size=0 must be an int >= 1
    >>> check_int("k", 7, 1, 5, why="at most n")
    Traceback (most recent call last):
    ...
    ValueError: k=7 must be an int in [1, 5] (at most n)
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise error(
            f"{name}={value!r} must be an int {bounds}{' or null' if allow_none else ''}{f' ({why})' if why else ''}"
        )
