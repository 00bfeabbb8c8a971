"""The Python client (clients/python): a call, an async job (submit + wait) and an event stream.

    TOLLGATE_URL=http://localhost:8080 TOLLGATE_KEY=cv_... PYTHONPATH=clients/python python3 examples/python.py
"""

import os
import sys

try:
    from tollgate import Tollgate, TollgateError
except ImportError:  # not installed and no PYTHONPATH: use the client in this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
    from tollgate import Tollgate, TollgateError


def main() -> int:
    base_url = os.environ.get("TOLLGATE_URL")
    api_key = os.environ.get("TOLLGATE_KEY")
    if not base_url or not api_key:
        print("Set TOLLGATE_URL (e.g. http://localhost:8080) and TOLLGATE_KEY (an API key, cv_...).", file=sys.stderr)
        return 2

    tg = Tollgate(api_key, base_url=base_url)
    try:
        # 1. A call: the service runs the job and answers with its result, cost and the balance after it.
        out = tg.call("compute", {"expression": "6 * 7"})
        print(f"call: 6 * 7 = {out.result['value']} (cost {out.cost_cents} cents, {out.remaining_credits} credits left)")

        # 2. An async job: submit answers at once with a job id; wait polls GET /jobs/{id} until it ends.
        job = tg.submit("compute", {"expression": "sqrt(2)"})
        print(f"submit: job {job.job_id} {job.status}")
        done = tg.wait(job.job_id, timeout=60, poll=0.25)
        print(f"wait: job {job.job_id} completed: sqrt(2) = {done.result['value']} (cost {done.cost_cents} cents)")

        # 3. A stream: Server-Sent Events (queued, progress..., then result or error).
        with tg.stream("compute", {"expression": "2 ^ 10"}) as stream:
            for ev in stream:
                if ev.event == "queued":
                    print(f"stream: queued as {ev.data['job_id']}")
                elif ev.event == "progress":
                    print(f"stream: progress {ev.data}")
                elif ev.event == "error":
                    print(f"FAILED: stream ended in error: {ev.data['error']['code']}", file=sys.stderr)
                    return 1
            if stream.result is None:
                print("FAILED: the stream ended without a result", file=sys.stderr)
                return 1
            print(f"stream: 2 ^ 10 = {stream.result.result['value']}")
    except TollgateError as e:
        print(f"FAILED: {e} (HTTP {e.status or '-'}, request {e.request_id or '-'})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
