"""Domain errors and the one table that maps them to HTTP status codes.

Worker and router raise these; one FastAPI handler turns each into a JSON
body ``{"detail": message, "error": message}`` (``http.error_body``: FastAPI's
shape, which seed clients read, and Triton's) with the right status, so no
endpoint picks its own code for the same failure.

Messages name the problem briefly: what a client sent is quoted through
``excerpt`` (at most ``EXCERPT_CHARS`` characters of it, and how many were
left out), a list of problems through ``summarize`` (the first few, and how
many more), and no message is ever longer than ``MAX_MESSAGE_CHARS`` (its
middle is cut, with a count): an unknown 1 MiB model name or 50,000 bad
tensors must not come back as a megabyte of error.
"""
from __future__ import annotations

import reprlib
from typing import Sequence

# Characters of a client's input one error message quotes.
EXCERPT_CHARS = 64
# No error message is longer than this (HotsetError cuts what is longer).
MAX_MESSAGE_CHARS = 1024
# Problems a message lists before it counts the rest.
LISTED_PROBLEMS = 5
# JSON bodies nested deeper than the parsers allow (Python's json and msgspec stop at about 1000
# levels, pydantic at a few hundred) are refused with this, not with a RecursionError (a 500).
TOO_DEEP = "the request body is nested too deeply (JSON arrays and objects go at most a few hundred levels deep)"

_bounded_repr = reprlib.Repr()
_bounded_repr.maxlevel = 3
_bounded_repr.maxstring = _bounded_repr.maxother = _bounded_repr.maxlong = EXCERPT_CHARS
_bounded_repr.maxlist = _bounded_repr.maxtuple = _bounded_repr.maxdict = _bounded_repr.maxset = 4


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`value` (a client's input) as an error message quotes it: its repr, cut after `limit`
    characters with a count of the rest (``'aaaa'... (1048572 more characters)``). Deeply nested
    or huge values are shown a few levels and items deep (reprlib), never rendered whole."""
    if isinstance(value, (str, bytes)):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value) - limit} more {unit})"
    try:
        text = _bounded_repr.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is named by its type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def summarize(problems: Sequence[str], limit: int = LISTED_PROBLEMS, total: int | None = None,
              separator: str = "; ") -> str:
    """The first `limit` problems, then how many more there are (``...; and 49995 more``); `total`:
    how many there are, when only the first ones were described."""
    shown = list(problems[:limit])
    left = (len(problems) if total is None else total) - len(shown)
    return separator.join(shown) + (f"{separator}and {left} more" if left > 0 else "")


def shorten(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message` in at most about `limit` characters: its start and its end, and how much of the
    middle was left out (the end often says what to do)."""
    if len(message) <= limit:
        return message
    head, tail = (limit * 3) // 4, limit // 4
    return f"{message[:head]}[... {len(message) - head - tail} characters left out ...]{message[-tail:]}"


class HotsetError(Exception):
    status_code = 500
    headers: dict[str, str] = {}

    def __init__(self, message: str) -> None:
        message = shorten(message)
        super().__init__(message)
        self.message = message


class NotFound(HotsetError):
    status_code = 404


class ModelNotFound(NotFound):
    pass


class BadInput(HotsetError):
    status_code = 400


class InvalidRequest(HotsetError):
    """The body is not valid JSON or misses a required field."""
    status_code = 422


class NestedTooDeeply(BadInput):
    """A JSON body (or a value in it) nested past what the parsers and models can take."""

    def __init__(self, message: str = TOO_DEEP) -> None:
        super().__init__(message)


class Conflict(HotsetError):
    """The request contradicts the model's configuration (e.g. unloading a pinned model)."""
    status_code = 409


class PayloadTooLarge(HotsetError):
    status_code = 413


class ClientClosedRequest(HotsetError):
    """The client went away before its answer was ready; the work for it was stopped. 499 is
    nginx's code for this: no client reads it, the metrics and logs do."""
    status_code = 499


class ModelLoadFailed(HotsetError):
    """The model's files are missing or corrupt, or its framework refused them."""
    status_code = 500


class WarmupFailed(ModelLoadFailed):
    """The model loaded, but one of its spec's warm-up inputs failed: the copy never became ready."""


class ModelTooLarge(HotsetError):
    """The model cannot fit even in an empty cache."""
    status_code = 507


class MemoryUnderstated(ModelTooLarge):
    """The model measured more than its spec's ``memory`` declares. Admission counts the
    declaration (a load starts before its size is known), so a copy that outgrows it could
    take its pod past the budget: it is refused, naming both figures."""


class NoCapacity(HotsetError):
    status_code = 503

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}


class BackendUnavailable(HotsetError):
    """A backend the model needs (the Triton sidecar, a worker) is down."""
    status_code = 503

    def __init__(self, message: str, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}


class EngineLost(BackendUnavailable):
    """The model's engine process died under a request that had not started its answer: the
    request may wait for a new copy (within its deadline) instead of failing with this 503."""


class UpstreamTimeout(HotsetError):
    status_code = 504


class Unauthorized(HotsetError):
    status_code = 401

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = {"WWW-Authenticate": "Bearer"}


class Forbidden(HotsetError):
    """Refused by policy: a disabled endpoint, a model source outside the declared roots,
    a Triton backend not on the allowlist."""
    status_code = 403


class TooManyRequests(HotsetError):
    """One model has more requests waiting than its queue holds (``spec.maxConcurrency``)."""
    status_code = 429

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}
