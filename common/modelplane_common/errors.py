"""Domain errors and the one table that maps them to HTTP status codes.

Worker and router raise these; one FastAPI handler turns each into a JSON
body ``{"detail": message, "error": message}`` (``http.error_body``: FastAPI's
shape, which seed clients read, and Triton's) with the right status, so no
endpoint picks its own code for the same failure.
"""
from __future__ import annotations


class ModelplaneError(Exception):
    status_code = 500
    headers: dict[str, str] = {}

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotFound(ModelplaneError):
    status_code = 404


class BadInput(ModelplaneError):
    status_code = 400


class InvalidRequest(ModelplaneError):
    """The body is not valid JSON or misses a required field."""
    status_code = 422


class Conflict(ModelplaneError):
    """The request contradicts the model's configuration (e.g. unloading a pinned model)."""
    status_code = 409


class PayloadTooLarge(ModelplaneError):
    status_code = 413


class ModelLoadFailed(ModelplaneError):
    """The model's files are missing or corrupt, or its framework refused them."""
    status_code = 500


class WarmupFailed(ModelLoadFailed):
    """The model loaded, but one of its spec's warm-up inputs failed: the copy never became ready."""


class ModelTooLarge(ModelplaneError):
    """The model cannot fit even in an empty cache."""
    status_code = 507


class NoCapacity(ModelplaneError):
    status_code = 503

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}


class BackendUnavailable(ModelplaneError):
    """A backend the model needs (the Triton sidecar, a worker) is down."""
    status_code = 503

    def __init__(self, message: str, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}


class UpstreamTimeout(ModelplaneError):
    status_code = 504


class Unauthorized(ModelplaneError):
    status_code = 401

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = {"WWW-Authenticate": "Bearer"}


class Forbidden(ModelplaneError):
    """Refused by policy: a disabled endpoint, a model source outside the declared roots,
    a Triton backend not on the allowlist."""
    status_code = 403


class TooManyRequests(ModelplaneError):
    """One model has more requests waiting than its queue holds (``spec.maxConcurrency``)."""
    status_code = 429

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after_s)}
