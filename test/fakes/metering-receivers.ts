import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * Local receivers for the usage export (src/pay/export), one per wire format, each deduping only by
 * the id the export sends, the way the real services do:
 * - a CloudEvents batch ingest in OpenMeter's shape: `POST /api/v1/events` with
 *   `Content-Type: application/cloudevents-batch+json`, optional Bearer token, 204 when accepted,
 *   RFC 7807 problem bodies when not;
 * - Stripe's v1 meter events endpoint: `POST /v1/billing/meter_events`, form-encoded, Bearer secret
 *   key, answering the `billing.meter_event` object or Stripe's error object, and refusing a second
 *   event with an identifier it has already recorded (400 invalid_request_error), as Stripe does;
 * - Stripe's v2 meter event stream, on the same host (Stripe's own is meter-events.stripe.com, which
 *   the client reaches through the same STRIPE_API_URL override): `POST /v2/billing/meter_event_session`
 *   (Bearer secret key, JSON) answers a `v2.billing.meter_event_session` whose `authentication_token`
 *   is good until `expires_at` (15 minutes, or `sessionTtlMs`); `POST /v2/billing/meter_event_stream`
 *   (Bearer that token, JSON `{events}`, at most 100) answers `{}` and validates afterwards, as Stripe
 *   does: an invalid event is not recorded but reported (`errorReports`), a second event with a known
 *   identifier is dropped. An expired token is 401 `temporary_session_expired`
 *   (`billing_meter_event_session_expired`).
 */

export interface Receiver {
  url: string;
  /** Accepted arrivals per id (more than 1: sent again, and kept once by the dedupe). */
  arrivals: Map<string, number>;
  /** Ids in the order they were first accepted. */
  order: string[];
  /** Requests answered, including refusals. */
  requests: number;
  /** The next `n` requests are refused with `status` (a receiver outage). */
  fail(n: number, status?: number): void;
  /** Every request is held `ms` before it is answered (a slow receiver, to kill a process mid-batch). */
  delay: number;
  close(): Promise<void>;
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function json(res: ServerResponse, status: number, body: unknown, type = 'application/json'): void {
  res.writeHead(status, { 'content-type': type });
  res.end(JSON.stringify(body));
}

function shut(server: Server): Promise<void> {
  return new Promise<void>((r) => {
    server.close(() => r());
    server.closeAllConnections();
  });
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function base(): Omit<Receiver, 'url' | 'close'> & { failing: number; failStatus: number } {
  const r = {
    arrivals: new Map<string, number>(),
    order: [] as string[],
    requests: 0,
    failing: 0,
    failStatus: 500,
    delay: 0,
    fail(n: number, status = 500) {
      r.failing = n;
      r.failStatus = status;
    },
  };
  return r;
}

const problem = (status: number, title: string, detail: string) => ({ type: 'about:blank', title, status, detail });

/** An OpenMeter-style CloudEvents ingest at `${url}/api/v1/events`. */
export async function startCloudEventsReceiver(opts: { token?: string } = {}): Promise<Receiver & { events: Map<string, Record<string, unknown>> }> {
  const state = base();
  const events = new Map<string, Record<string, unknown>>();
  const server = createServer(async (req, res) => {
    const body = await readBody(req);
    state.requests++;
    if (state.delay) await new Promise((r) => setTimeout(r, state.delay));
    if (req.method !== 'POST' || req.url !== '/api/v1/events') return json(res, 404, problem(404, 'Not Found', 'no such route'), 'application/problem+json');
    if (opts.token && req.headers.authorization !== `Bearer ${opts.token}`)
      return json(res, 401, problem(401, 'Unauthorized', 'invalid token'), 'application/problem+json');
    if (state.failing > 0) {
      state.failing--;
      return json(res, state.failStatus, problem(state.failStatus, 'Internal Server Error', 'ingest unavailable'), 'application/problem+json');
    }
    if (req.headers['content-type'] !== 'application/cloudevents-batch+json')
      return json(res, 415, problem(415, 'Unsupported Media Type', `content type ${req.headers['content-type']}`), 'application/problem+json');
    let batch: unknown;
    try {
      batch = JSON.parse(body);
    } catch {
      return json(res, 400, problem(400, 'Bad Request', 'body is not JSON'), 'application/problem+json');
    }
    if (!Array.isArray(batch)) return json(res, 400, problem(400, 'Bad Request', 'a batch is a JSON array'), 'application/problem+json');
    for (const e of batch as Array<Record<string, unknown>>) {
      const ok =
        e?.specversion === '1.0' &&
        typeof e.id === 'string' &&
        e.id.length > 0 &&
        typeof e.source === 'string' &&
        typeof e.type === 'string' &&
        typeof e.subject === 'string' &&
        typeof e.time === 'string' &&
        !Number.isNaN(Date.parse(e.time));
      if (!ok) return json(res, 400, problem(400, 'Bad Request', `invalid CloudEvent ${JSON.stringify(e).slice(0, 200)}`), 'application/problem+json');
    }
    for (const e of batch as Array<Record<string, unknown>>) {
      const id = e.id as string;
      const n = state.arrivals.get(id) ?? 0;
      state.arrivals.set(id, n + 1);
      if (n === 0) {
        state.order.push(id);
        events.set(id, e);
      }
    }
    res.writeHead(204);
    res.end();
  });
  const url = `${await listen(server)}/api/v1/events`;
  return Object.assign(state, { url, events, close: () => shut(server) });
}

/** The event a Stripe meter recorded. */
export interface MeterEvent {
  identifier: string;
  event_name: string;
  customer: string;
  value: string;
  timestamp: number;
}

function stripeError(res: ServerResponse, status: number, type: string, message: string, extra: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json', 'request-id': `req_${Math.random().toString(36).slice(2, 16)}` });
  res.end(JSON.stringify({ error: { type, message, ...extra } }));
}

/** Stripe's meter event endpoints; `url` is the host to give the client (STRIPE_API_URL). */
export async function startStripeMeterReceiver(opts: { secretKey: string; sessionTtlMs?: number }): Promise<
  Receiver & {
    events: Map<string, MeterEvent>;
    /** Requests per endpoint path. */
    byPath: Map<string, number>;
    /** Stream events that failed the after-the-fact validation, with why. */
    errorReports: Array<{ identifier: string | undefined; reason: string }>;
    /** Sessions created (each a token). */
    sessions: number;
    /** Stream requests refused for an expired token. */
    expired: number;
  }
> {
  const state = base();
  const events = new Map<string, MeterEvent>();
  const byPath = new Map<string, number>();
  const errorReports: Array<{ identifier: string | undefined; reason: string }> = [];
  const tokens = new Map<string, number>(); // token -> expires at (ms)
  const out = Object.assign(state, { events, byPath, errorReports, sessions: 0, expired: 0 });
  const now = () => Math.floor(Date.now() / 1000);
  /** Records one event, or says why it is invalid; a known identifier counts as an arrival only. */
  const record = (identifier: string, event_name: string, customer: string, value: string, timestamp: number): void => {
    if (events.has(identifier)) {
      state.arrivals.set(identifier, state.arrivals.get(identifier)! + 1);
      return;
    }
    events.set(identifier, { identifier, event_name, customer, value, timestamp });
    state.arrivals.set(identifier, 1);
    state.order.push(identifier);
  };
  const stamp = (t: number) => Number.isInteger(t) && t >= now() - 35 * 86400 && t <= now() + 300;

  const v2Error = (res: ServerResponse, status: number, type: string, code: string, message: string) => {
    res.writeHead(status, { 'content-type': 'application/json', 'request-id': `req_${Math.random().toString(36).slice(2, 16)}` });
    res.end(JSON.stringify({ error: { type, code, message } }));
  };

  const stream = (req: IncomingMessage, res: ServerResponse, body: string) => {
    const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1];
    const expires = token ? tokens.get(token) : undefined;
    if (expires === undefined) return v2Error(res, 401, 'invalid_request_error', 'unauthorized', 'Invalid meter event session token.');
    if (Date.now() >= expires) {
      out.expired++;
      return v2Error(res, 401, 'temporary_session_expired', 'billing_meter_event_session_expired', 'The temporary session token has expired.');
    }
    if (state.failing > 0) {
      state.failing--;
      return v2Error(res, state.failStatus, 'api_error', 'internal_error', 'An unknown error occurred while processing this request.');
    }
    let parsed: { events?: unknown };
    try {
      parsed = JSON.parse(body) as { events?: unknown };
    } catch {
      return v2Error(res, 400, 'invalid_request_error', 'invalid_json', 'The request body is not valid JSON.');
    }
    const list = parsed?.events;
    if (!Array.isArray(list) || list.length === 0 || list.length > 100)
      return v2Error(res, 400, 'invalid_request_error', 'invalid_fields', 'events: between 1 and 100 events per request.');
    // Accepted now, validated afterwards: what fails is reported, not answered.
    for (const e of list as Array<Record<string, any>>) {
      const identifier = typeof e?.identifier === 'string' ? e.identifier : `gen_${Math.random().toString(36).slice(2)}`;
      const payload = e?.payload as Record<string, unknown> | undefined;
      const t = e?.timestamp === undefined ? now() : Math.floor(Date.parse(String(e.timestamp)) / 1000);
      const reason =
        typeof e?.event_name !== 'string' || !e.event_name
          ? 'missing event_name'
          : typeof payload?.stripe_customer_id !== 'string'
            ? 'missing payload.stripe_customer_id'
            : typeof payload.value !== 'string' || !/^\d+(\.\d+)?$/.test(payload.value)
              ? 'payload.value must be a non-negative number as a string'
              : !stamp(t)
                ? 'timestamp outside the past 35 days or more than 5 minutes ahead'
                : null;
      if (reason) errorReports.push({ identifier: e?.identifier, reason });
      else record(identifier, e.event_name, payload!.stripe_customer_id as string, payload!.value as string, t);
    }
    json(res, 200, {});
  };

  const session = (req: IncomingMessage, res: ServerResponse) => {
    if (req.headers.authorization !== `Bearer ${opts.secretKey}`) return stripeError(res, 401, 'invalid_request_error', 'Invalid API Key provided.');
    const token = `mes_tok_${Math.random().toString(36).slice(2)}${Math.random().toString(36).slice(2)}`;
    const created = Date.now();
    const expires = created + (opts.sessionTtlMs ?? 15 * 60_000);
    tokens.set(token, expires);
    out.sessions++;
    json(res, 200, {
      id: `mes_${Math.random().toString(36).slice(2, 16)}`,
      object: 'v2.billing.meter_event_session',
      authentication_token: token,
      created: new Date(created).toISOString(),
      expires_at: new Date(expires).toISOString(),
      livemode: false,
    });
  };

  const server = createServer(async (req, res) => {
    const body = await readBody(req);
    state.requests++;
    byPath.set(req.url ?? '', (byPath.get(req.url ?? '') ?? 0) + 1);
    if (state.delay) await new Promise((r) => setTimeout(r, state.delay));
    if (req.method === 'POST' && req.url === '/v2/billing/meter_event_session') return session(req, res);
    if (req.method === 'POST' && req.url === '/v2/billing/meter_event_stream') return stream(req, res, body);
    if (req.method !== 'POST' || req.url !== '/v1/billing/meter_events')
      return stripeError(res, 404, 'invalid_request_error', `Unrecognized request URL (${req.method}: ${req.url}).`);
    if (req.headers.authorization !== `Bearer ${opts.secretKey}`) return stripeError(res, 401, 'invalid_request_error', 'Invalid API Key provided.');
    if (state.failing > 0) {
      state.failing--;
      return stripeError(res, state.failStatus, 'api_error', 'An unknown error occurred while processing this request.');
    }
    if (!String(req.headers['content-type']).startsWith('application/x-www-form-urlencoded'))
      return stripeError(res, 400, 'invalid_request_error', 'Invalid request: expected a form-encoded body.');
    const form = new URLSearchParams(body);
    for (const param of ['event_name', 'payload[stripe_customer_id]', 'payload[value]']) {
      if (!form.get(param)) return stripeError(res, 400, 'invalid_request_error', `Missing required param: ${param}.`, { param, code: 'parameter_missing' });
    }
    const value = form.get('payload[value]')!;
    if (!/^\d+(\.\d+)?$/.test(value))
      return stripeError(res, 400, 'invalid_request_error', 'payload[value] must be a non-negative number.', { param: 'payload[value]' });
    const timestamp = Number(form.get('timestamp') ?? now());
    if (!stamp(timestamp))
      return stripeError(res, 400, 'invalid_request_error', 'Timestamp must be within the past 35 calendar days or up to 5 minutes in the future.', {
        param: 'timestamp',
      });
    const identifier = form.get('identifier') ?? `gen_${Math.random().toString(36).slice(2)}`;
    if (events.has(identifier)) {
      record(identifier, '', '', '', 0);
      return stripeError(res, 400, 'invalid_request_error', `An event already exists with identifier ${identifier}.`, { param: 'identifier' });
    }
    record(identifier, form.get('event_name')!, form.get('payload[stripe_customer_id]')!, value, timestamp);
    const event = events.get(identifier)!;
    json(res, 200, {
      object: 'billing.meter_event',
      created: now(),
      event_name: event.event_name,
      identifier,
      livemode: false,
      payload: { stripe_customer_id: event.customer, value },
      timestamp,
    });
  });
  const url = await listen(server);
  return Object.assign(out, { url, close: () => shut(server) });
}
