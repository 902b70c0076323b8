"""The transfer's error type, the one way its errors are worded, and the
one check of its arguments."""
from __future__ import annotations

from typing import Any, Type, TypeVar

PREFIX = "allocconf.transfer: "

E = TypeVar("E", bound=BaseException)


class TransferError(RuntimeError):
    """A sync could not complete: a peer that stayed silent past the
    timeout (dead, or stuck), a receiver that could not take a bucket, a
    message out of order.  Both sides stay usable: the sender after
    :meth:`Sender.abort`, the receiver after a sync that completes."""


def error(kind: Type[E], text: str) -> E:
    """Return an exception of `kind` whose message says it is the
    transfer's (raise it where it is made, so that the raise is seen)."""
    return kind(PREFIX + text)


def _shown(value: Any, kind: Type[BaseException]) -> str:
    if kind is TypeError:  # the value itself may be large (a state dict)
        return type(value).__name__
    try:
        return repr(value)
    except Exception:  # a repr that raises still gets its argument named
        return f"a {type(value).__name__}"


def check(name: str, value: Any, what: str, ok: bool,
          kind: Type[Exception] = ValueError) -> None:
    """Raise `kind` ("`name` must be `what`, got ...") unless `ok`: the
    caller's test of argument `name`.  A TypeError names the value's
    type, a ValueError the value."""
    if not ok:
        raise error(kind, f"{name} must be {what}, got "
                          f"{_shown(value, kind)}")


def is_number(value: Any) -> bool:
    """An int or a float, never a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def seconds(name: str, value: Any) -> float:
    """`value` checked as a wait in seconds (a number > 0), as a float."""
    check(name, value, "a number of seconds > 0",
          is_number(value) and value > 0)
    return float(value)
