"""Tests of the tollgate client against a running Tollgate service (no mocks of the service).

Environment:
    TOLLGATE_URL, TOLLGATE_KEY    the service and a key with credits (enterprise, so tool tiers never refuse)
    TOLLGATE_POOR_KEY             a key of an account with 0 credits (the 402 test)
    TOLLGATE_LIMITED_KEY          a key of an account limited to 1 request per minute (the 429 test)
    TOLLGATE_WEBHOOK_RECEIVER     host:port this process may listen on, which the service is allowed to
                                  deliver webhooks to (WEBHOOK_ALLOWED_HOSTS): the live delivery test
    TOLLGATE_TEST_TOOLS=1         the service has the test-only tool test_wait_signal (test/helpers/slow-tools.ts)
                                  and SYNC_TIMEOUT_MS of at most 1500: the slow-job tests (202, cancel, wait timeout)

The webhook verification tests need none of these: they sign bodies themselves with a known secret.
Dropped connections and lost answers are real: a small TCP relay between the client and the service cuts
the stream after its first event, or closes the connection before the service's answer reaches the client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time
import unittest
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tollgate  # noqa: E402
from tollgate import (  # noqa: E402
    ConflictError,
    InvalidInputError,
    JobCancelledError,
    NotFoundError,
    PaymentRequiredError,
    RateLimitedError,
    Tollgate,
    TollgateConnectionError,
    TollgateError,
    TollgateTimeoutError,
    UnprocessableError,
    WebhookVerificationError,
    verify_webhook,
)

URL = os.environ.get("TOLLGATE_URL", "")
KEY = os.environ.get("TOLLGATE_KEY", "")
POOR_KEY = os.environ.get("TOLLGATE_POOR_KEY", "")
LIMITED_KEY = os.environ.get("TOLLGATE_LIMITED_KEY", "")
RECEIVER = os.environ.get("TOLLGATE_WEBHOOK_RECEIVER", "")
TEST_TOOLS = os.environ.get("TOLLGATE_TEST_TOOLS", "") == "1"

live = unittest.skipUnless(URL and KEY, "TOLLGATE_URL and TOLLGATE_KEY are not set: these tests need a running Tollgate service")


class FaultRelay:
    """A TCP relay to the service that breaks chosen connections for real.

    Each accepted connection takes the next action from ``plan`` (then ``pass``):
      - ``pass``: relay both ways untouched;
      - ``cut_after_first_event``: relay the answer up to the end of its first Server-Sent Event, then close;
      - ``lose_answer``: relay the request, wait until the service starts answering (so it has done the
        work), then close the client's connection without a byte of the answer.
    ``heads`` records every request's head (request line and headers) in order.
    """

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.plan: List[str] = []
        self.heads: List[str] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                action = self.plan.pop(0) if self.plan else "pass"
            threading.Thread(target=self._serve, args=(client, action), daemon=True).start()

    def _serve(self, client: socket.socket, action: str) -> None:
        upstream = socket.create_connection(self.upstream)

        def shut() -> None:
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

        def requests() -> None:
            head = b""
            try:
                while True:
                    chunk = client.recv(65536)
                    if not chunk:
                        break
                    if b"\r\n\r\n" not in head:
                        head += chunk
                        if b"\r\n\r\n" in head:
                            with self._lock:
                                self.heads.append(head.split(b"\r\n\r\n", 1)[0].decode("latin-1"))
                    upstream.sendall(chunk)
            except OSError:
                pass

        threading.Thread(target=requests, daemon=True).start()
        seen = b""
        try:
            while True:
                chunk = upstream.recv(65536)
                if not chunk:
                    break
                if action == "lose_answer":
                    break
                if action == "cut_after_first_event":
                    seen += chunk
                    at = seen.find(b"event: ")
                    end = seen.find(b"\n\n", at) if at >= 0 else -1
                    if end < 0:
                        continue  # hold bytes back until the first event is whole
                    end += 2
                    if seen[end : end + 2] == b"\r\n":
                        end += 2  # the chunk's own end, so the client reads the event and then the cut
                    client.sendall(seen[:end])
                    break
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            shut()


def header(head: str, name: str) -> Optional[str]:
    for line in head.split("\r\n")[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == name.lower():
            return v.strip()
    return None


@live
class CallTests(unittest.TestCase):
    client: Tollgate

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = Tollgate(KEY, base_url=URL, timeout=30)

    def credits(self) -> int:
        return int(self.client.balance()["credits"])

    def test_sync_call(self) -> None:
        out = self.client.call("compute", {"expression": "6 * 7"})
        self.assertIsInstance(out, tollgate.CallResult)
        self.assertEqual(out.result["value"], 42)
        self.assertEqual(out.cost_cents, 2)
        self.assertIsInstance(out.remaining_credits, int)
        self.assertTrue(out.job_id)
        self.assertFalse(out.replayed)

    def test_balance(self) -> None:
        b = self.client.balance()
        self.assertEqual(b["plan"], "enterprise")
        self.assertEqual(b["key_type"], "production")
        before = b["credits"]
        out = self.client.call("compute", {"expression": "1 + 1"})
        self.assertEqual(out.remaining_credits, before - 2)
        self.assertEqual(self.credits(), before - 2)

    def test_submit_and_wait(self) -> None:
        job = self.client.submit("compute", {"expression": "2 ^ 10"})
        self.assertIsInstance(job, tollgate.Job)
        self.assertTrue(job.job_id)
        self.assertEqual(job.status_url, f"/jobs/{job.job_id}")
        self.assertIn(job.status, ("queued", "running", "completed"))
        out = self.client.wait(job.job_id, timeout=30, poll=0.2)
        self.assertEqual(out.result["value"], 1024)
        self.assertEqual(out.job_id, job.job_id)
        stored = self.client.get_job(job.job_id)
        self.assertEqual(stored["status"], "completed")
        self.assertEqual(stored["result"]["value"], 1024)
        # A finished job cannot be cancelled: 409 job_finished, with what it cost.
        with self.assertRaises(ConflictError) as ctx:
            self.client.cancel(job.job_id)
        self.assertEqual(ctx.exception.status, 409)
        self.assertEqual(ctx.exception.code, "job_finished")
        self.assertEqual(ctx.exception.details.get("cost_cents"), 2)

    def test_stream(self) -> None:
        s = self.client.stream("compute", {"expression": "3 * 3"})
        events = list(s)
        self.assertEqual([e.event for e in events], ["queued", "result"])
        self.assertEqual(events[0].data["job_id"], s.job_id)
        self.assertEqual(events[-1].data["result"]["value"], 9)
        self.assertEqual(events[-1].id, f"{s.job_id}:end")
        self.assertIsNotNone(s.result)
        assert s.result is not None
        self.assertEqual(s.result.result["value"], 9)
        self.assertEqual(s.reconnects, 0)

    def test_stream_resumes_after_dropped_connection(self) -> None:
        relay = FaultRelay(URL)
        self.addCleanup(relay.close)
        relay.plan = ["cut_after_first_event"]
        client = Tollgate(KEY, base_url=relay.url, timeout=30)
        before = self.credits()
        s = client.stream("compute", {"expression": "6 * 7"})
        events = list(s)
        # The first connection ended after `queued`; the client resumed from GET /jobs/{id}/events.
        self.assertEqual(s.reconnects, 1)
        self.assertEqual([e.event for e in events], ["queued", "result"])
        self.assertEqual(sum(1 for e in events if e.event == "result"), 1)
        self.assertEqual(events[-1].data["result"]["value"], 42)
        self.assertEqual(len(relay.heads), 2)
        self.assertTrue(relay.heads[0].startswith("POST /tools/compute "))
        self.assertTrue(relay.heads[1].startswith(f"GET /jobs/{s.job_id}/events "))
        self.assertEqual(header(relay.heads[1], "Last-Event-ID"), events[0].id)
        self.assertEqual(self.credits(), before - 2, "the job ran and was charged once")

    def test_idempotent_retry_with_the_same_key(self) -> None:
        key = f"py-{uuid.uuid4()}"
        before = self.credits()
        first = self.client.call("compute", {"expression": "6 * 7"}, idempotency_key=key)
        second = self.client.call("compute", {"expression": "6 * 7"}, idempotency_key=key)
        self.assertFalse(first.replayed)
        self.assertTrue(second.replayed)
        self.assertEqual(second.job_id, first.job_id)
        self.assertEqual(second.result, first.result)
        self.assertEqual(self.credits(), before - 2, "charged once for two answers")
        # The same key with another body is refused, and nothing runs.
        with self.assertRaises(UnprocessableError) as ctx:
            self.client.call("compute", {"expression": "6 * 8"}, idempotency_key=key)
        self.assertEqual(ctx.exception.status, 422)
        self.assertEqual(ctx.exception.code, "idempotency_key_reused")
        self.assertEqual(self.credits(), before - 2)

    def test_retry_after_a_lost_answer_runs_once(self) -> None:
        relay = FaultRelay(URL)
        self.addCleanup(relay.close)
        relay.plan = ["lose_answer"]
        client = Tollgate(KEY, base_url=relay.url, timeout=30, max_retries=2)
        before = self.credits()
        out = client.call("compute", {"expression": "7 * 6"})
        self.assertEqual(out.result["value"], 42)
        self.assertTrue(out.replayed, "the retry got the first request's answer")
        self.assertEqual(len(relay.heads), 2)
        keys = [header(h, "Idempotency-Key") for h in relay.heads]
        self.assertIsNotNone(keys[0])
        self.assertEqual(keys[0], keys[1], "one key for the logical call")
        uuid.UUID(str(keys[0]))
        self.assertEqual(self.credits(), before - 2, "the call ran and was charged once")

    def test_errors_are_typed(self) -> None:
        with self.assertRaises(NotFoundError) as nf:
            self.client.get_job("core-00000000-0000-0000-0000-000000000000")
        self.assertEqual((nf.exception.status, nf.exception.code), (404, "not_found"))
        self.assertTrue(nf.exception.request_id)
        with self.assertRaises(NotFoundError) as tool:
            self.client.call("no_such_tool", {})
        self.assertEqual(tool.exception.code, "tool_not_found")
        with self.assertRaises(InvalidInputError) as bad:
            self.client.call("compute", {"expr": "1"})
        self.assertEqual((bad.exception.status, bad.exception.code), (400, "invalid_input"))
        self.assertEqual(bad.exception.details["issues"][0]["path"], ["expression"])

    @unittest.skipUnless(POOR_KEY, "TOLLGATE_POOR_KEY (an account with 0 credits) is not set")
    def test_payment_required(self) -> None:
        poor = Tollgate(POOR_KEY, base_url=URL)
        with self.assertRaises(PaymentRequiredError) as ctx:
            poor.call("compute", {"expression": "6 * 7"})
        e = ctx.exception
        self.assertEqual((e.status, e.code), (402, "insufficient_credits"))
        self.assertTrue(e.message)
        self.assertTrue(e.request_id)
        self.assertEqual(e.details.get("required_cents"), 2)
        self.assertEqual(e.details.get("available_cents"), 0)
        self.assertIsInstance(e, TollgateError)

    @unittest.skipUnless(LIMITED_KEY, "TOLLGATE_LIMITED_KEY (an account limited to 1 request a minute) is not set")
    def test_rate_limited(self) -> None:
        limited = Tollgate(LIMITED_KEY, base_url=URL, max_retries=0)
        try:
            limited.call("compute", {"expression": "1 + 1"})
        except RateLimitedError:
            pass  # a run less than a minute ago took this minute's one request
        with self.assertRaises(RateLimitedError) as ctx:
            limited.call("compute", {"expression": "1 + 2"})
        e = ctx.exception
        self.assertEqual((e.status, e.code), (429, "rate_limited"))
        self.assertIsNotNone(e.retry_after)
        assert e.retry_after is not None
        self.assertGreater(e.retry_after, 0)
        self.assertLessEqual(e.retry_after, 60)


@live
@unittest.skipUnless(TEST_TOOLS, "TOLLGATE_TEST_TOOLS=1 is not set: the service needs the test-only tool test_wait_signal and SYNC_TIMEOUT_MS <= 1500")
class SlowJobTests(unittest.TestCase):
    client: Tollgate

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = Tollgate(KEY, base_url=URL, timeout=30)

    def credits(self) -> int:
        return int(self.client.balance()["credits"])

    def test_a_call_that_outlives_the_sync_timeout_waits_for_its_job(self) -> None:
        relay = FaultRelay(URL)
        self.addCleanup(relay.close)
        client = Tollgate(KEY, base_url=relay.url, timeout=30)
        out = client.call("test_wait_signal", {"ms": 2500, "tag": "py-202"})
        self.assertEqual(out.result, {"waited": 2500, "tag": "py-202"})
        self.assertEqual(out.cost_cents, 2)
        # The service answered 202 after its sync timeout; the client polled the job to its end.
        self.assertTrue(relay.heads[0].startswith("POST /tools/test_wait_signal "))
        self.assertGreaterEqual(len(relay.heads), 2)
        for head in relay.heads[1:]:
            self.assertTrue(head.startswith(f"GET /jobs/{out.job_id} "), head)

    def test_cancel_a_running_job(self) -> None:
        before = self.credits()
        job = self.client.submit("test_wait_signal", {"ms": 30000, "tag": "py-cancel"})
        time.sleep(0.3)
        out = self.client.cancel(job.job_id)
        self.assertEqual((out["job_id"], out["status"], out["cancelled"]), (job.job_id, "cancelled", True))
        with self.assertRaises(JobCancelledError) as ctx:
            self.client.wait(job.job_id, timeout=10, poll=0.2)
        self.assertEqual((ctx.exception.status, ctx.exception.code), (409, "cancelled"))
        with self.assertRaises(JobCancelledError):
            self.client.get_job(job.job_id)
        self.assertEqual(self.credits(), before, "a cancelled job is not charged")

    def test_wait_gives_up_at_its_timeout(self) -> None:
        job = self.client.submit("test_wait_signal", {"ms": 30000, "tag": "py-timeout"})
        self.addCleanup(self.client.cancel, job.job_id)
        started = time.monotonic()
        with self.assertRaises(TollgateTimeoutError) as ctx:
            self.client.wait(job.job_id, timeout=0.6, poll=0.2)
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(ctx.exception.details["job_id"], job.job_id)
        self.assertIn(self.client.get_job(job.job_id)["status"], ("queued", "running"))


class ConnectionTests(unittest.TestCase):
    def test_no_service_is_a_connection_error_after_retries(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        client = Tollgate("cv_unused", base_url=f"http://127.0.0.1:{port}", timeout=2, max_retries=1)
        started = time.monotonic()
        with self.assertRaises(TollgateConnectionError) as ctx:
            client.call("compute", {"expression": "1"})
        self.assertIsNone(ctx.exception.status)
        self.assertGreaterEqual(time.monotonic() - started, 0.5, "it waited and retried once")


SECRET_BYTES = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(SECRET_BYTES).decode()


def signed(body: bytes, *, msg_id: str = "msg_test_1", timestamp: Optional[int] = None, key: bytes = SECRET_BYTES) -> Tuple[Dict[str, str], bytes]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": "v1," + base64.b64encode(mac).decode()}, body


BODY = json.dumps({"job_id": "core-1", "status": "completed", "result": {"value": 42}, "cost_cents": 2}).encode()


class WebhookTests(unittest.TestCase):
    def test_accepts_a_signed_delivery(self) -> None:
        headers, body = signed(BODY)
        payload = verify_webhook(SECRET, headers, body)
        self.assertEqual(payload["result"]["value"], 42)
        # Header names in any case, the body as text, and the client's static method all verify.
        upper = {k.title(): v for k, v in headers.items()}
        self.assertEqual(Tollgate.verify_webhook(SECRET, upper, body.decode()), payload)

    def test_accepts_any_of_several_signatures(self) -> None:
        headers, body = signed(BODY)
        other = base64.b64encode(os.urandom(32)).decode()
        headers["webhook-signature"] = f"v1,{other} {headers['webhook-signature']}"
        self.assertEqual(verify_webhook(SECRET, headers, body)["job_id"], "core-1")

    def test_rejects_a_changed_body(self) -> None:
        headers, body = signed(BODY)
        with self.assertRaises(WebhookVerificationError):
            verify_webhook(SECRET, headers, body.replace(b"42", b"43"))

    def test_rejects_an_old_timestamp(self) -> None:
        headers, body = signed(BODY, timestamp=int(time.time()) - 301)
        with self.assertRaises(WebhookVerificationError) as ctx:
            verify_webhook(SECRET, headers, body)
        self.assertEqual(ctx.exception.code, "timestamp_too_old")
        # Within a wider tolerance the same delivery verifies.
        self.assertEqual(verify_webhook(SECRET, headers, body, tolerance_seconds=600)["job_id"], "core-1")

    def test_rejects_a_future_timestamp(self) -> None:
        headers, body = signed(BODY, timestamp=int(time.time()) + 3600)
        with self.assertRaises(WebhookVerificationError):
            verify_webhook(SECRET, headers, body)

    def test_rejects_a_wrong_secret(self) -> None:
        headers, body = signed(BODY)
        wrong = "whsec_" + base64.b64encode(bytes(32)).decode()
        with self.assertRaises(WebhookVerificationError) as ctx:
            verify_webhook(wrong, headers, body)
        self.assertEqual(ctx.exception.code, "invalid_signature")

    def test_rejects_another_id_and_missing_headers(self) -> None:
        headers, body = signed(BODY)
        with self.assertRaises(WebhookVerificationError):
            verify_webhook(SECRET, {**headers, "webhook-id": "msg_other"}, body)
        with self.assertRaises(WebhookVerificationError):
            verify_webhook(SECRET, {k: v for k, v in headers.items() if k != "webhook-signature"}, body)


@live
@unittest.skipUnless(RECEIVER, "TOLLGATE_WEBHOOK_RECEIVER (host:port the service may deliver webhooks to) is not set")
class LiveWebhookTests(unittest.TestCase):
    def test_a_real_delivery_verifies(self) -> None:
        received: List[Tuple[Dict[str, str], bytes]] = []
        arrived = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append(({k: v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.end_headers()
                arrived.set()

            def log_message(self, *args: Any) -> None:
                pass

        host, _, port = RECEIVER.rpartition(":")
        server = HTTPServer((host, int(port)), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)

        client = Tollgate(KEY, base_url=URL)
        secret = client.webhook_secret()
        self.assertTrue(secret.startswith("whsec_"))
        out = client.call("compute", {"expression": "6 * 7"}, callback_url=f"http://{RECEIVER}/hook")
        self.assertTrue(arrived.wait(20), "the delivery arrived")
        headers, body = received[0]
        payload = verify_webhook(secret, headers, body)
        self.assertEqual(payload["job_id"], out.job_id)
        self.assertEqual(payload["result"]["value"], 42)
        with self.assertRaises(WebhookVerificationError):
            verify_webhook(secret, headers, body + b" ")


if __name__ == "__main__":
    unittest.main()
