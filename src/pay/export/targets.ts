import { Agent as HttpAgent } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
import Stripe from 'stripe';
import type { LedgerEntry, TargetName } from './ledger-feed.js';

/**
 * A billing system entries are exported to. `send` resolves with how many of the entries, from the
 * first, the target has accepted (all of them, normally); it throws an ExportFailure when it took
 * fewer, carrying that count, so the cursor moves over exactly what was accepted.
 */
export interface ExportTarget {
  readonly name: TargetName;
  /** How many of `entries` this target is sent (the rest are passed over: not its kind of entry). */
  send(entries: readonly LedgerEntry[]): Promise<{ sent: number }>;
  /** Frees the target's connections. */
  close?(): void;
}

/** A batch a target did not take whole: `accepted` entries from the first were, the rest were not. */
export class ExportFailure extends Error {
  constructor(
    message: string,
    readonly accepted: number,
  ) {
    super(message);
  }
}

/** The CloudEvents `source` of every exported entry: the ledger of this deployment. */
export const CLOUDEVENTS_SOURCE = 'tollgate/ledger';

/** The CloudEvents id, and the Stripe identifier: the ledger row's id, which no other entry ever has. */
export function exportId(e: LedgerEntry): string {
  return `ledger-${e.id}`;
}

/**
 * One entry as a CloudEvent 1.0 in the structured JSON shape OpenMeter's ingest takes. The subject is
 * what the entry is billed to: the account, or the payer's address for a call paid per call (x402).
 */
export function cloudEvent(e: LedgerEntry) {
  return {
    specversion: '1.0',
    id: exportId(e),
    source: CLOUDEVENTS_SOURCE,
    type: `tollgate.ledger.${e.kind}`,
    subject: e.account_id ?? e.payer ?? 'unknown',
    time: e.created_at,
    datacontenttype: 'application/json',
    data: {
      kind: e.kind,
      // Signed as in the ledger (a charge is negative), and the positive amount meters usually sum.
      delta_cents: e.delta_cents,
      cents: Math.abs(e.delta_cents),
      tool: e.tool,
      key_id: e.key_id,
      entry_key: e.entry_key,
      agent_name: e.agent_name,
      ...(e.payer ? { payer: e.payer } : {}),
    },
  };
}

/** Every entry, as one `application/cloudevents-batch+json` POST per batch; any 2xx accepts it whole. */
export class CloudEventsTarget implements ExportTarget {
  readonly name = 'cloudevents' as const;
  constructor(
    private readonly url: string,
    private readonly token: string,
    private readonly timeoutMs = 30_000,
  ) {}

  async send(entries: readonly LedgerEntry[]): Promise<{ sent: number }> {
    const res = await fetch(this.url, {
      method: 'POST',
      headers: {
        'content-type': 'application/cloudevents-batch+json',
        ...(this.token ? { authorization: `Bearer ${this.token}` } : {}),
      },
      body: JSON.stringify(entries.map(cloudEvent)),
      signal: AbortSignal.timeout(this.timeoutMs),
    }).catch((err: Error) => {
      // fetch's message names only the failure; the URL may carry credentials, so it is left out.
      throw new ExportFailure(`cloudevents: request failed: ${err.cause instanceof Error ? err.cause.message : err.message}`, 0);
    });
    // The body is read (and dropped) so the connection goes back to the pool.
    const text = await res.text().catch(() => '');
    if (!res.ok) throw new ExportFailure(`cloudevents: HTTP ${res.status} ${text.slice(0, 200)}`, 0);
    return { sent: entries.length };
  }
}

/** Stripe refuses meter events older than 35 days; entries older than this are passed over. */
export const STRIPE_MAX_AGE_MS = 34 * 24 * 3600 * 1000;

/** A Stripe client for the export, on kept-alive connections (the client's host override covers the stream's host too). */
function meterClient(secretKey: string, apiUrl: string | undefined, sockets: number): { stripe: Stripe; agent: HttpAgent } {
  const url = apiUrl ? new URL(apiUrl) : null;
  const protocol = url?.protocol === 'http:' ? 'http' : 'https';
  const agent = protocol === 'http' ? new HttpAgent({ keepAlive: true, maxSockets: sockets }) : new HttpsAgent({ keepAlive: true, maxSockets: sockets });
  const stripe = new Stripe(secretKey, {
    ...(url ? { host: url.hostname, port: url.port || (protocol === 'http' ? 80 : 443), protocol } : {}),
    httpAgent: agent,
    // The exporter retries a batch itself, with backoff; the identifier makes a retry harmless.
    maxNetworkRetries: 0,
    timeout: 30_000,
    telemetry: false,
  });
  return { stripe, agent };
}

/** The entries Stripe should be sent: charges of accounts with a customer, recent enough for Stripe. */
function billable(e: LedgerEntry, now: number): boolean {
  return e.kind === 'charge' && e.delta_cents < 0 && e.customer_id !== null && now - Date.parse(e.created_at) < STRIPE_MAX_AGE_MS;
}

/**
 * The client records its caller's stack on every request (for its error messages); with source maps
 * on, that was the largest CPU cost of an export. The entry's id says more here.
 */
function withoutStacks<T>(f: () => Promise<T>): Promise<T> {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return f();
  } finally {
    Error.stackTraceLimit = limit;
  }
}

/** The failure of a batch whose first refused entry is `index`: the entries before it were accepted. */
function batchFailure(err: Error, index: number): ExportFailure {
  const status = (err as { statusCode?: number }).statusCode;
  return new ExportFailure(`stripe: ${status ? `HTTP ${status} ` : ''}${err.message}`, index);
}

/**
 * Charges of accounts with a Stripe customer, as v1 meter events (`POST /v1/billing/meter_events`),
 * `identifier` = the ledger entry's id: Stripe keeps identifiers unique for at least 24 hours and
 * refuses a second event with one, so a batch sent again after a crash bills nothing twice. One event
 * a request, each answered with its verdict; STRIPE_CONCURRENCY requests at a time. Chosen with
 * EXPORT_STRIPE_METER_API=v1; the default is the v2 stream below.
 */
export class StripeMeterTarget implements ExportTarget {
  readonly name = 'stripe' as const;
  private readonly stripe: Stripe;
  private readonly agent: HttpAgent;

  constructor(
    secretKey: string,
    private readonly eventName: string,
    apiUrl: string | undefined,
    private readonly concurrency = STRIPE_CONCURRENCY,
    private readonly now: () => number = Date.now,
  ) {
    ({ stripe: this.stripe, agent: this.agent } = meterClient(secretKey, apiUrl, concurrency));
  }

  async send(entries: readonly LedgerEntry[]): Promise<{ sent: number }> {
    const outcome: Array<Error | null> = new Array(entries.length).fill(null);
    const now = this.now();
    let next = 0;
    let sent = 0;
    const lane = async () => {
      for (let i = next++; i < entries.length; i = next++) {
        const e = entries[i]!;
        if (!billable(e, now)) continue;
        try {
          await withoutStacks(() =>
            this.stripe.billing.meterEvents.create({
              event_name: this.eventName,
              identifier: exportId(e),
              timestamp: Math.floor(Date.parse(e.created_at) / 1000),
              payload: { stripe_customer_id: e.customer_id!, value: String(-e.delta_cents) },
            }),
          );
          sent++;
        } catch (err) {
          if (alreadyRecorded(err)) continue;
          outcome[i] = err as Error;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.concurrency, entries.length) }, lane));
    const failed = outcome.findIndex((o) => o !== null);
    if (failed >= 0) throw batchFailure(outcome[failed]!, failed);
    return { sent };
  }

  close(): void {
    this.agent.destroy();
  }
}

/** Events per stream request: Stripe's limit. */
export const STREAM_EVENTS_PER_REQUEST = 100;
/** Stream requests in flight at once. */
export const STREAM_CONCURRENCY = 4;
/** A session token is replaced this long before it expires, so no request carries one that lapses on the way. */
const SESSION_MARGIN_MS = 60_000;

/**
 * Charges of accounts with a Stripe customer, on the v2 meter event stream (the default,
 * EXPORT_STRIPE_METER_API=v2): a meter event session (`POST /v2/billing/meter_event_session`, secret
 * key) gives a token good for 15 minutes, and `POST /v2/billing/meter_event_stream` (that token)
 * takes up to 100 events a request, up to 10,000 requests a second in live mode. The same
 * `identifier` (the ledger entry's id) keeps a batch sent again after a crash from billing twice:
 * Stripe drops a second event with an identifier it saw in the last 24 hours.
 *
 * The stream answers before it validates: an event it later finds invalid is not billed and is
 * reported to the operator by Stripe (the `v1.billing.meter.error_report_triggered` event, and in the
 * dashboard), not to us; the cursor moves over what the stream accepted. What the export sends is
 * always well formed (a customer id, a positive whole value, a timestamp Stripe takes), so that report
 * means the meter's configuration and Stripe's disagree. v1 (StripeMeterTarget) answers each event
 * with its verdict, at one event a request.
 *
 * The session token is a credential: it lives in this object only, never logged or stored.
 */
export class StripeMeterStreamTarget implements ExportTarget {
  readonly name = 'stripe' as const;
  private readonly stripe: Stripe;
  private readonly agent: HttpAgent;
  private session: Promise<{ token: string; renewAt: number }> | null = null;

  constructor(
    secretKey: string,
    private readonly eventName: string,
    apiUrl: string | undefined,
    private readonly concurrency = STREAM_CONCURRENCY,
    private readonly now: () => number = Date.now,
  ) {
    ({ stripe: this.stripe, agent: this.agent } = meterClient(secretKey, apiUrl, concurrency + 1));
  }

  /**
   * The current session's token; a new session when there is none, it is about to expire, or it is
   * the `expired` one a request was just refused with. Lanes asking at once share one new session.
   */
  private async token(expired?: string): Promise<string> {
    const pending = this.session;
    const current = pending ? await pending.catch(() => null) : null;
    if (current && current.token !== expired && this.now() < current.renewAt) return current.token;
    if (this.session === pending) {
      this.session = withoutStacks(() => this.stripe.v2.billing.meterEventSession.create()).then((s) => ({
        token: s.authentication_token,
        renewAt: Math.max(this.now(), Date.parse(s.expires_at) - SESSION_MARGIN_MS),
      }));
    }
    return (await this.session!).token;
  }

  /** One request of up to 100 events; a session that expired on the way is renewed and the request sent once more. */
  private async post(events: LedgerEntry[]): Promise<void> {
    const body = {
      events: events.map((e) => ({
        event_name: this.eventName,
        identifier: exportId(e),
        timestamp: new Date(Date.parse(e.created_at)).toISOString(),
        payload: { stripe_customer_id: e.customer_id!, value: String(-e.delta_cents) },
      })),
    };
    const token = await this.token();
    try {
      await withoutStacks(() => this.stripe.v2.billing.meterEventStream.create(body, { apiKey: token }));
    } catch (err) {
      if (!(err instanceof Stripe.errors.TemporarySessionExpiredError)) throw err;
      const renewed = await this.token(token);
      await withoutStacks(() => this.stripe.v2.billing.meterEventStream.create(body, { apiKey: renewed }));
    }
  }

  async send(entries: readonly LedgerEntry[]): Promise<{ sent: number }> {
    const now = this.now();
    // Requests of up to 100 billable entries each, in ledger order, each remembering where it starts.
    const requests: Array<{ first: number; events: LedgerEntry[] }> = [];
    entries.forEach((e, i) => {
      if (!billable(e, now)) return;
      const last = requests.at(-1);
      if (last && last.events.length < STREAM_EVENTS_PER_REQUEST) last.events.push(e);
      else requests.push({ first: i, events: [e] });
    });
    const failures: Array<Error | null> = new Array(requests.length).fill(null);
    let next = 0;
    let sent = 0;
    const lane = async () => {
      for (let r = next++; r < requests.length; r = next++) {
        try {
          await this.post(requests[r]!.events);
          sent += requests[r]!.events.length;
        } catch (err) {
          failures[r] = err as Error;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.concurrency, requests.length) }, lane));
    const failed = failures.findIndex((f) => f !== null);
    if (failed >= 0) throw batchFailure(failures[failed]!, requests[failed]!.first);
    return { sent };
  }

  close(): void {
    this.agent.destroy();
  }
}

/** Meter events in flight at once. */
export const STRIPE_CONCURRENCY = 32;

/**
 * Stripe's answer to a second event with the same identifier (400 invalid_request_error, "An event
 * already exists with identifier ..."): proof the event was recorded before, so it counts as accepted.
 */
function alreadyRecorded(err: unknown): boolean {
  return err instanceof Stripe.errors.StripeInvalidRequestError && /already exists with identifier/i.test(err.message);
}
