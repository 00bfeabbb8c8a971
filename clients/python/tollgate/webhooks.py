"""Standard Webhooks verification for Tollgate's deliveries.

A delivery carries ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and ``webhook-signature``
(``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<raw body>">``, several separated by spaces while a
secret is being rolled), keyed with the bytes that the secret (``whsec_<base64>``) encodes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Any, Dict, Mapping, Optional, Union

from .errors import WebhookVerificationError

__all__ = ["verify_webhook", "sign_webhook"]

_PREFIX = "whsec_"


def _secret_bytes(secret: Union[str, bytes]) -> bytes:
    if isinstance(secret, bytes):
        return secret
    s = secret.strip()
    if s.startswith(_PREFIX):
        s = s[len(_PREFIX) :]
    # Older secrets were base64url; the service shows them in standard base64, and either decodes here.
    s = s.replace("-", "+").replace("_", "/")
    s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as e:
        raise WebhookVerificationError("The webhook secret is not whsec_ followed by base64", code="invalid_secret") from e


def _body_bytes(body: Union[str, bytes, bytearray]) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def _signature(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, msg_id.encode("utf-8") + b"." + timestamp.encode("utf-8") + b"." + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode("ascii")


def _header(headers: Mapping[str, Any], name: str) -> Optional[str]:
    for k, v in headers.items():
        if str(k).lower() == name:
            if isinstance(v, (list, tuple)):
                v = v[0] if v else None
            if isinstance(v, bytes):
                v = v.decode("latin-1")
            return None if v is None else str(v)
    return None


def sign_webhook(secret: Union[str, bytes], msg_id: str, timestamp: int, body: Union[str, bytes, bytearray]) -> str:
    """The ``webhook-signature`` value Tollgate sends for this id, timestamp and body (``v1,<base64>``)."""
    return "v1," + _signature(_secret_bytes(secret), msg_id, str(int(timestamp)), _body_bytes(body))


def verify_webhook(
    secret: Union[str, bytes],
    headers: Mapping[str, Any],
    body: Union[str, bytes, bytearray],
    tolerance_seconds: int = 300,
) -> Dict[str, Any]:
    """Verifies a delivery on its raw body, exactly as received, and returns the parsed JSON payload.

    ``headers`` is any mapping (names are matched case-insensitively). Raises
    :class:`~tollgate.errors.WebhookVerificationError` when a header is missing, the timestamp is more
    than ``tolerance_seconds`` away from now, or no ``v1`` signature matches (compared in constant time).
    """
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not msg_id or not timestamp or not signatures:
        raise WebhookVerificationError("Missing webhook-id, webhook-timestamp or webhook-signature header", code="missing_headers")
    try:
        ts = int(timestamp.strip())
    except ValueError as e:
        raise WebhookVerificationError("webhook-timestamp is not a Unix time in seconds", code="invalid_timestamp") from e
    now = int(time.time())
    if ts < now - tolerance_seconds:
        raise WebhookVerificationError("Message timestamp too old", code="timestamp_too_old")
    if ts > now + tolerance_seconds:
        raise WebhookVerificationError("Message timestamp too new", code="timestamp_too_new")
    raw = _body_bytes(body)
    expected = _signature(_secret_bytes(secret), msg_id, timestamp.strip(), raw).encode("ascii")
    matched = False
    for part in signatures.split():
        version, _, value = part.partition(",")
        # Compare every candidate (no early exit) so timing says nothing about which one matched.
        if version == "v1" and hmac.compare_digest(value.encode("ascii", "replace"), expected):
            matched = True
    if not matched:
        raise WebhookVerificationError("No matching signature found", code="invalid_signature")
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise WebhookVerificationError("The signed body is not JSON", code="invalid_body") from e
    if not isinstance(payload, dict):
        raise WebhookVerificationError("The signed body is not a JSON object", code="invalid_body")
    return payload
