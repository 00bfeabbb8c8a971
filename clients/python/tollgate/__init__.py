"""Tollgate: a small, dependency-free Python client for the Tollgate tool service."""

from .client import VERSION, CallResult, Event, EventStream, Job, Tollgate
from .errors import (
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    JobCancelledError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    ServiceUnavailableError,
    TollgateConnectionError,
    TollgateError,
    TollgateTimeoutError,
    UnprocessableError,
    WebhookVerificationError,
)
from .webhooks import sign_webhook, verify_webhook

__version__ = VERSION

__all__ = [
    "Tollgate",
    "CallResult",
    "Job",
    "Event",
    "EventStream",
    "verify_webhook",
    "sign_webhook",
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
    "__version__",
]
