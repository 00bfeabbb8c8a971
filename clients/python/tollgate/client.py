"""The Tollgate HTTP client: standard library only (urllib, json, time, uuid)."""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Generator, Iterator, List, Mapping, Optional, Union

from .errors import (
    TollgateConnectionError,
    TollgateError,
    TollgateTimeoutError,
    error_from_response,
)
from .webhooks import verify_webhook as _verify_webhook

__all__ = ["Tollgate", "CallResult", "Job", "Event", "EventStream", "VERSION"]

VERSION = "0.1.0"
_USER_AGENT = f"tollgate-python/{VERSION}"
_RETRY_STATUSES = (429, 503)
_PENDING = ("queued", "running")
_TERMINAL_EVENTS = ("result", "error")

JSONObject = Dict[str, Any]


@dataclass(frozen=True)
class CallResult:
    """A finished call: the tool's ``result``, what it cost and the balance after it."""

    result: Any
    cost_cents: int
    remaining_credits: Optional[int]
    #: The job that ran (``X-Job-Id``), when the service named it.
    job_id: Optional[str] = None
    #: True when the service replayed an earlier answer for the same ``Idempotency-Key``.
    replayed: bool = False
    #: True for a sandbox (``cv_test_``) key: nothing was charged.
    sandbox: bool = False
    #: The whole JSON body, for members this class does not name.
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Job:
    """An accepted asynchronous call (``202``): poll it with :meth:`Tollgate.wait` or :meth:`Tollgate.get_job`."""

    job_id: str
    status: str
    status_url: str
    replayed: bool = False


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event: ``event`` (queued, progress, step, result, error), its ``id`` and its parsed ``data``."""

    event: str
    id: Optional[str]
    data: Any


@dataclass
class _Response:
    status: int
    headers: Any  # http.client.HTTPMessage: case-insensitive get()
    body: Any


def _parse_body(raw: bytes, headers: Any) -> Any:
    if not raw:
        return None
    text = raw.decode("utf-8", "replace")
    ctype = (headers.get("Content-Type") or "") if headers is not None else ""
    if "json" in ctype or text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _envelope(err: TollgateError) -> JSONObject:
    """The service's error envelope for an error (the data an ``error`` event carries)."""
    inner: JSONObject = {"code": err.code, "message": err.message, "request_id": err.request_id}
    inner.update(err.details)
    return {"error": inner}


class Tollgate:
    """A client for one Tollgate service and API key.

    Args:
        api_key: the key (``cv_...``), sent as ``Authorization: Bearer``.
        base_url: the service's address.
        timeout: seconds to wait on the socket for each request (connect and every read). Keep it above
            the service's sync timeout (30 s) and its event-stream heartbeat (15 s).
        max_retries: how many times a request is retried after a connection error, a 429 or a 503
            (waiting ``Retry-After`` when the service sends it, else an exponential backoff). Every
            POST that may be retried carries an ``Idempotency-Key``, so a retry never runs a call twice.
    """

    def __init__(self, api_key: str, base_url: str = "http://localhost:8080", timeout: float = 60.0, max_retries: int = 2) -> None:
        if not api_key:
            raise ValueError("api_key is required")
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max(0, int(max_retries))
        self._opener = urllib.request.build_opener()

    # ------------------------------------------------------------------ transport

    def _backoff(self, attempt: int) -> float:
        return float(min(8.0, 0.5 * (2**attempt))) + random.uniform(0, 0.1)

    def _headers(self, extra: Optional[Mapping[str, str]] = None, *, has_body: bool = False) -> Dict[str, str]:
        h = {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json", "User-Agent": _USER_AGENT}
        if has_body:
            h["Content-Type"] = "application/json"
        if extra:
            h.update(extra)
        return h

    def _open(self, method: str, path: str, data: Optional[bytes], headers: Mapping[str, str]) -> http.client.HTTPResponse:
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=dict(headers))
        return self._opener.open(req, timeout=self.timeout)  # type: ignore[no-any-return]

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        has_body: bool = False,
        headers: Optional[Mapping[str, str]] = None,
        retry: bool = True,
        stream: bool = False,
    ) -> Union[_Response, http.client.HTTPResponse]:
        data = json.dumps(body, separators=(",", ":")).encode("utf-8") if has_body else None
        all_headers = self._headers(headers, has_body=has_body)
        attempt = 0
        while True:
            try:
                resp = self._open(method, path, data, all_headers)
                if stream:
                    return resp
                with resp:
                    raw = resp.read()
                return _Response(resp.status, resp.headers, _parse_body(raw, resp.headers))
            except urllib.error.HTTPError as e:
                try:
                    raw = e.read()
                except (OSError, http.client.HTTPException):
                    raw = b""
                finally:
                    e.close()
                err = error_from_response(e.code, _parse_body(raw, e.headers), e.headers)
                if not retry or e.code not in _RETRY_STATUSES or attempt >= self.max_retries:
                    raise err from None
                delay = err.retry_after if err.retry_after is not None else self._backoff(attempt)
            except (OSError, http.client.HTTPException) as e:
                if not retry or attempt >= self.max_retries:
                    raise TollgateConnectionError(f"{method} {path} failed: {e!r}", code="connection_error") from e
                delay = self._backoff(attempt)
            time.sleep(delay)
            attempt += 1

    def _json(self, method: str, path: str, **kw: Any) -> _Response:
        r = self._send(method, path, **kw)
        assert isinstance(r, _Response)
        return r

    def _idempotency_key(self, given: Optional[str]) -> Optional[str]:
        """The caller's key, else a fresh uuid4 whenever the request may be retried (one per logical call)."""
        if given is not None:
            return given
        return str(uuid.uuid4()) if self.max_retries > 0 else None

    @staticmethod
    def _tool_path(tool: str) -> str:
        return "/tools/" + urllib.parse.quote(tool, safe="")

    @staticmethod
    def _job_path(job_id: str) -> str:
        return "/jobs/" + urllib.parse.quote(job_id, safe="")

    @staticmethod
    def _call_headers(idempotency_key: Optional[str], edge_token: Optional[str], callback_url: Optional[str] = None) -> Dict[str, str]:
        h: Dict[str, str] = {}
        if idempotency_key is not None:
            h["Idempotency-Key"] = idempotency_key
        if edge_token is not None:
            h["X-Edge-Token"] = edge_token
        if callback_url is not None:
            h["Callback-Url"] = callback_url
        return h

    @staticmethod
    def _result(body: Any, job_id: Optional[str], replayed: bool) -> CallResult:
        if not isinstance(body, dict) or "result" not in body:
            raise TollgateError(f"Unexpected answer: {body!r}"[:500], code="unexpected_response")
        return CallResult(
            result=body.get("result"),
            cost_cents=int(body.get("cost_cents") or 0),
            remaining_credits=body.get("remaining_credits"),
            job_id=body.get("job_id") or job_id,
            replayed=replayed,
            sandbox=bool(body.get("sandbox", False)),
            raw=body,
        )

    @staticmethod
    def _replayed(headers: Any) -> bool:
        return str(headers.get("Idempotent-Replayed") or "").lower() == "true"

    # ------------------------------------------------------------------ calls

    def call(
        self,
        tool: str,
        input: Optional[Mapping[str, Any]] = None,
        *,
        idempotency_key: Optional[str] = None,
        edge_token: Optional[str] = None,
        callback_url: Optional[str] = None,
    ) -> CallResult:
        """Runs a tool and returns its result (``POST /tools/{tool}``).

        The service waits for the job up to its sync timeout; a call that outlives it answers ``202`` and
        this waits for the job (polling ``GET /jobs/{id}``) and returns its result all the same. Errors
        raise the :class:`~tollgate.errors.TollgateError` subclass their status names.

        ``edge_token`` is sent as ``X-Edge-Token`` (the cf_* tools); ``callback_url`` as ``Callback-Url``
        (a signed webhook delivery of the outcome; see :func:`tollgate.verify_webhook`).
        """
        key = self._idempotency_key(idempotency_key)
        headers = self._call_headers(key, edge_token, callback_url)
        r = self._json("POST", self._tool_path(tool), body=dict(input or {}), has_body=True, headers=headers, retry=key is not None)
        replayed = self._replayed(r.headers)
        if r.status == 202 and isinstance(r.body, dict) and isinstance(r.body.get("job_id"), str):
            out = self.wait(r.body["job_id"], timeout=None)
            return CallResult(out.result, out.cost_cents, out.remaining_credits, out.job_id, replayed, out.sandbox, out.raw) if replayed else out
        return self._result(r.body, r.headers.get("X-Job-Id"), replayed)

    def submit(
        self,
        tool: str,
        input: Optional[Mapping[str, Any]] = None,
        *,
        idempotency_key: Optional[str] = None,
        edge_token: Optional[str] = None,
        callback_url: Optional[str] = None,
    ) -> Job:
        """Queues a tool call and returns at once (``Prefer: respond-async``): the job to wait for."""
        key = self._idempotency_key(idempotency_key)
        headers = self._call_headers(key, edge_token, callback_url)
        headers["Prefer"] = "respond-async"
        r = self._json("POST", self._tool_path(tool), body=dict(input or {}), has_body=True, headers=headers, retry=key is not None)
        body = r.body if isinstance(r.body, dict) else {}
        job_id = body.get("job_id") or r.headers.get("X-Job-Id")
        if not isinstance(job_id, str):
            raise TollgateError(f"Unexpected answer: {r.body!r}"[:500], status=r.status, code="unexpected_response")
        status = body.get("status") or ("completed" if "result" in body else "queued")
        status_url = body.get("status_url") or r.headers.get("Location") or self._job_path(job_id)
        return Job(job_id=job_id, status=str(status), status_url=str(status_url), replayed=self._replayed(r.headers))

    def get_job(self, job_id: str) -> JSONObject:
        """``GET /jobs/{id}``: ``{job_id, status, progress}`` while it runs, the call's body once completed.

        A failed or cancelled job raises its error (:class:`~tollgate.errors.JobCancelledError` for a cancelled one).
        """
        r = self._json("GET", self._job_path(job_id))
        return r.body if isinstance(r.body, dict) else {"job_id": job_id, "body": r.body}

    def wait(self, job_id: str, timeout: Optional[float] = 300.0, poll: float = 1.0) -> CallResult:
        """Polls ``GET /jobs/{id}`` until the job ends and returns its result (or raises its error).

        The first poll is immediate; the interval starts at ``poll`` seconds and grows by half each time up
        to 5 s (polls count against the account's rate limit). ``timeout=None`` waits as long as it takes;
        otherwise :class:`~tollgate.errors.TollgateTimeoutError` once ``timeout`` seconds have passed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = max(0.05, poll)
        ceiling = max(interval, 5.0)
        while True:
            body = self.get_job(job_id)
            if body.get("status") not in _PENDING:
                return self._result(body, job_id, False)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TollgateTimeoutError(f"Job {job_id} still {body.get('status')} after {timeout} s", code="wait_timeout", details={"job_id": job_id, "status": body.get("status")})
                time.sleep(min(interval, left))
            else:
                time.sleep(interval)
            interval = min(ceiling, interval * 1.5)

    def cancel(self, job_id: str) -> JSONObject:
        """``DELETE /jobs/{id}``: ``{job_id, status: "cancelled", cancelled: true}``.

        A job that already completed or failed raises :class:`~tollgate.errors.ConflictError` (``job_finished``).
        """
        r = self._json("DELETE", self._job_path(job_id))
        return r.body if isinstance(r.body, dict) else {}

    def stream(
        self,
        tool: str,
        input: Optional[Mapping[str, Any]] = None,
        *,
        idempotency_key: Optional[str] = None,
        edge_token: Optional[str] = None,
        max_reconnects: int = 5,
    ) -> "EventStream":
        """Runs a tool as a Server-Sent Events stream (``Accept: text/event-stream``).

        Iterate the returned :class:`EventStream` for :class:`Event` objects (queued, progress, ..., then
        ``result`` or ``error``, which ends it). A connection that drops before the end is resumed from
        ``GET /jobs/{job_id}/events`` with ``Last-Event-ID``, so no event is repeated and the job never
        runs twice. Admission errors (402, 429...) raise before the first event.
        """
        key = self._idempotency_key(idempotency_key)
        return EventStream(self, tool, dict(input or {}), self._call_headers(key, edge_token), retry=key is not None, max_reconnects=max_reconnects)

    # ------------------------------------------------------------------ account

    def balance(self) -> JSONObject:
        """``GET /balance``: ``{credits, plan, used_this_month, key_type}`` (credits in cents)."""
        r = self._json("GET", "/balance")
        return r.body if isinstance(r.body, dict) else {}

    def webhook_secret(self) -> str:
        """``GET /webhooks/secret``: the account's signing secret (``whsec_...``), made the first time (production key only)."""
        r = self._json("GET", "/webhooks/secret")
        body = r.body if isinstance(r.body, dict) else {}
        secret = body.get("secret")
        if not isinstance(secret, str):
            raise TollgateError(f"Unexpected answer: {r.body!r}"[:500], status=r.status, code="unexpected_response")
        return secret

    @staticmethod
    def verify_webhook(
        secret: Union[str, bytes],
        headers: Mapping[str, Any],
        body: Union[str, bytes, bytearray],
        tolerance_seconds: int = 300,
    ) -> JSONObject:
        """Verifies a webhook delivery (Standard Webhooks) and returns its JSON payload; see :func:`tollgate.verify_webhook`."""
        return _verify_webhook(secret, headers, body, tolerance_seconds)


class EventStream:
    """The events of one streamed call. Iterate it once; ``close()`` (or ``with``) stops reading early.

    Attributes:
        job_id: the job (``X-Job-Id``), once the stream has started.
        last_event_id: the id of the last event received (what a resume sends as ``Last-Event-ID``).
        reconnects: how many times a dropped connection was resumed.
        replayed: True when the service followed an earlier call with the same ``Idempotency-Key``.
        result: the :class:`CallResult` of the ``result`` event, once it arrived.
    """

    def __init__(self, client: Tollgate, tool: str, body: JSONObject, headers: Dict[str, str], *, retry: bool, max_reconnects: int) -> None:
        self._client = client
        self._tool = tool
        self._body = body
        self._headers = headers
        self._retry = retry
        self.max_reconnects = max(0, int(max_reconnects))
        self.job_id: Optional[str] = None
        self.last_event_id: Optional[str] = None
        self.reconnects = 0
        self.replayed = False
        self.result: Optional[CallResult] = None
        self._retry_ms = 1000
        self._resp: Optional[http.client.HTTPResponse] = None
        self._started = False
        self._closed = False
        self._iter: Optional[Generator[Event, None, None]] = None

    def __iter__(self) -> Iterator[Event]:
        if self._iter is None:
            self._iter = self._events()
        return self._iter

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stops reading (the job itself runs on; :meth:`Tollgate.get_job` has its outcome)."""
        self._closed = True
        if self._resp is not None:
            self._resp.close()
        if self._iter is not None:
            self._iter.close()

    # -- connecting

    def _connect(self) -> Optional[Union[http.client.HTTPResponse, List[Event]]]:
        """An open event stream, a list of events already known (a JSON answer), or None (204: it had ended)."""
        c = self._client
        sse = {"Accept": "text/event-stream"}
        if not self._started:
            self._started = True
            resp = c._send("POST", Tollgate._tool_path(self._tool), body=self._body, has_body=True, headers={**self._headers, **sse}, retry=self._retry, stream=True)
        elif self.job_id is not None:
            if self.last_event_id is not None:
                sse["Last-Event-ID"] = self.last_event_id
            resp = c._send("GET", Tollgate._job_path(self.job_id) + "/events", headers=sse, stream=True)
        else:
            raise TollgateConnectionError("The event stream dropped before the service named its job; nothing to resume", code="connection_error")
        assert isinstance(resp, http.client.HTTPResponse)
        if self.job_id is None:
            self.job_id = resp.headers.get("X-Job-Id")
        if Tollgate._replayed(resp.headers):
            self.replayed = True
        if resp.status == 204:
            resp.close()
            return None
        if "text/event-stream" not in (resp.headers.get("Content-Type") or ""):
            # A replayed Idempotency-Key can answer as JSON: the stored result, or the job it queued.
            with resp:
                body = _parse_body(resp.read(), resp.headers)
            if isinstance(body, dict) and "result" in body:
                return [Event("result", None, body)]
            if isinstance(body, dict) and isinstance(body.get("job_id"), str):
                self.job_id = body["job_id"]
                return []
            raise TollgateError(f"Unexpected answer: {body!r}"[:500], status=resp.status, code="unexpected_response")
        return resp

    def _outcome(self) -> Event:
        """The job's last event from ``GET /jobs/{id}`` (when a resume finds the stream already ended)."""
        assert self.job_id is not None
        try:
            body = self._client.get_job(self.job_id)
        except TollgateError as e:
            return Event("error", None, _envelope(e))
        return Event("result", None, body)

    # -- reading

    def _read(self, resp: http.client.HTTPResponse) -> Iterator[Event]:
        """Parses Server-Sent Events; an event cut off by a dropped connection is not dispatched."""
        event = ""
        data: List[str] = []
        ev_id: Optional[str] = None
        while True:
            raw = resp.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line == "":
                if data:
                    text = "\n".join(data)
                    try:
                        parsed: Any = json.loads(text)
                    except ValueError:
                        parsed = text
                    yield Event(event or "message", ev_id, parsed)
                event, data, ev_id = "", [], None
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id" and "\0" not in value:
                ev_id = value
            elif name == "retry" and value.isdigit():
                self._retry_ms = int(value)

    def _take(self, ev: Event) -> Event:
        if ev.id is not None:
            self.last_event_id = ev.id
            if self.job_id is None and ":" in ev.id:
                self.job_id = ev.id.rsplit(":", 1)[0]
        if self.job_id is None and ev.event == "queued" and isinstance(ev.data, dict) and isinstance(ev.data.get("job_id"), str):
            self.job_id = ev.data["job_id"]
        if ev.event == "result" and isinstance(ev.data, dict) and "result" in ev.data:
            self.result = Tollgate._result(ev.data, self.job_id, self.replayed)
        return ev

    def _events(self) -> Generator[Event, None, None]:
        while not self._closed:
            got = self._connect()
            if got is None:
                yield self._take(self._outcome())
                return
            if isinstance(got, list):
                for ev in got:
                    yield self._take(ev)
                    if ev.event in _TERMINAL_EVENTS:
                        return
            else:
                self._resp = got
                dropped: Optional[BaseException] = None
                try:
                    for ev in self._read(got):
                        yield self._take(ev)
                        if ev.event in _TERMINAL_EVENTS:
                            return
                except (OSError, ValueError, http.client.HTTPException) as e:
                    # ValueError: the response was closed under the reader (close() from another thread).
                    dropped = e
                finally:
                    got.close()
                    self._resp = None
                if self._closed:
                    return
                if self.reconnects >= self.max_reconnects:
                    raise TollgateConnectionError(
                        f"The event stream of job {self.job_id} dropped {self.reconnects + 1} times; GET /jobs/{self.job_id} has its outcome",
                        code="connection_error",
                        details={"job_id": self.job_id, "last_event_id": self.last_event_id},
                    ) from dropped
                self.reconnects += 1
                time.sleep(min(self._retry_ms, 5000) / 1000)
