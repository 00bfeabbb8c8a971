"""Typed errors for the Tollgate client.

Every error the service answers has one shape, ``{"error": {"code", "message", "request_id", ...}}``;
:func:`error_from_response` turns it into the :class:`TollgateError` subclass its status (and code) names.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "TollgateError",
    "InvalidInputError",
    "AuthenticationError",
    "PaymentRequiredError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "JobCancelledError",
    "UnprocessableError",
    "RateLimitedError",
    "ServerError",
    "ServiceUnavailableError",
    "TollgateConnectionError",
    "TollgateTimeoutError",
    "WebhookVerificationError",
    "error_from_response",
]


class TollgateError(Exception):
    """An error answered by Tollgate (or, for the subclasses without a status, met on the way to it).

    Attributes:
        status: the HTTP status (``None`` when no answer arrived).
        code: the service's error code (``insufficient_credits``, ``rate_limited``...).
        message: the service's message.
        request_id: the ``X-Request-Id`` of the failed request, to quote to support.
        retry_after: seconds to wait before retrying (``Retry-After``), when the service said.
        details: every other member of the error envelope (``required_cents``, ``issues``, ``job_id``...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
        details: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after
        self.details: Dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        head = " ".join(str(p) for p in (self.status, self.code) if p is not None)
        tail = f" (request {self.request_id})" if self.request_id else ""
        return f"{head}: {self.message}{tail}" if head else f"{self.message}{tail}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r}, request_id={self.request_id!r})"


class InvalidInputError(TollgateError):
    """400: the body or parameters failed validation (``issues`` in :attr:`details`)."""


class AuthenticationError(TollgateError):
    """401: no key, a malformed key, or a key that does not exist or was revoked."""


class PaymentRequiredError(TollgateError):
    """402: too few credits (``insufficient_credits``), a sub-key's monthly limit, or a call to pay per call."""


class PermissionDeniedError(TollgateError):
    """403: the plan is below the tool's tier, the key may not do this, or the edge token was rejected."""


class NotFoundError(TollgateError):
    """404: unknown tool, job (or another key's job), route or sub-key."""


class ConflictError(TollgateError):
    """409: an Idempotency-Key still in progress, a finished job that cannot be cancelled, a cancelled job..."""


class JobCancelledError(ConflictError):
    """409 ``cancelled``: the job was cancelled before it finished (not charged)."""


class UnprocessableError(TollgateError):
    """422: the tool ran and failed (``tool_failed``, ``limit_exceeded``) or an Idempotency-Key was reused with another body."""


class RateLimitedError(TollgateError):
    """429: too many requests (``rate_limited``) or too many jobs in flight (``concurrency_limited``); see :attr:`retry_after`."""


class ServerError(TollgateError):
    """5xx: the service or a tool's upstream failed; nothing was charged."""


class ServiceUnavailableError(ServerError):
    """503: Redis or Postgres unreachable, or a tool's upstream is down; see :attr:`retry_after`."""


class TollgateConnectionError(TollgateError):
    """No answer: the connection failed (after the client's retries)."""


class TollgateTimeoutError(TollgateError):
    """The client's own deadline passed (for example :meth:`Tollgate.wait` on a job still running)."""


class WebhookVerificationError(TollgateError):
    """A webhook delivery whose signature, timestamp or headers do not verify."""


_BY_STATUS: Dict[int, Type[TollgateError]] = {
    400: InvalidInputError,
    401: AuthenticationError,
    402: PaymentRequiredError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
}

_BY_CODE: Dict[str, Type[TollgateError]] = {
    "invalid_input": InvalidInputError,
    "unauthorized": AuthenticationError,
    "invalid_api_key": AuthenticationError,
    "key_not_found": AuthenticationError,
    "payment_required": PaymentRequiredError,
    "insufficient_credits": PaymentRequiredError,
    "monthly_limit_exceeded": PaymentRequiredError,
    "rate_limited": RateLimitedError,
    "concurrency_limited": RateLimitedError,
    "not_found": NotFoundError,
    "tool_not_found": NotFoundError,
    "cancelled": JobCancelledError,
    "service_unavailable": ServiceUnavailableError,
    "tool_unavailable": ServiceUnavailableError,
}


def _retry_after(headers: Any, details: Mapping[str, Any]) -> Optional[float]:
    raw: Any = None
    if headers is not None:
        raw = headers.get("Retry-After") or headers.get("retry-after")
    if raw is None:
        raw = details.get("retry_after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except (TypeError, ValueError):
        return None  # an HTTP date: rare here, and the client's own backoff covers it


def error_from_response(status: Optional[int], body: Any, headers: Any = None) -> TollgateError:
    """The typed error for an error answer: its status, parsed JSON body (or text), and headers (any object with ``get``)."""
    code: Optional[str] = None
    message = ""
    request_id: Optional[str] = None
    details: Dict[str, Any] = {}
    envelope = body.get("error") if isinstance(body, dict) else None
    if isinstance(envelope, dict):
        details = {k: v for k, v in envelope.items() if k not in ("code", "message", "request_id")}
        code = envelope.get("code") if isinstance(envelope.get("code"), str) else None
        message = str(envelope.get("message") or "")
        request_id = envelope.get("request_id") if isinstance(envelope.get("request_id"), str) else None
    elif isinstance(body, dict) and isinstance(envelope, str):
        # The pay-per-call (x402) 402: {"x402Version", "error": "<message>", "code", "request_id", "accepts"...}
        details = {k: v for k, v in body.items() if k not in ("error", "code", "request_id")}
        code = body.get("code") if isinstance(body.get("code"), str) else None
        message = envelope
        request_id = body.get("request_id") if isinstance(body.get("request_id"), str) else None
    elif isinstance(body, str) and body:
        message = body[:500]
    if request_id is None and headers is not None:
        request_id = headers.get("X-Request-Id") or headers.get("x-request-id")
    if not message:
        message = f"HTTP {status}" if status is not None else "request failed"
    cls: Type[TollgateError] = TollgateError
    if code is not None and code in _BY_CODE:
        cls = _BY_CODE[code]
    elif status is not None and status in _BY_STATUS:
        cls = _BY_STATUS[status]
    elif status is not None and status >= 500:
        cls = ServerError
    return cls(
        message,
        status=status,
        code=code,
        request_id=request_id,
        retry_after=_retry_after(headers, details),
        details=details,
    )
