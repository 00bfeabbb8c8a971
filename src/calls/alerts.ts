import type { Logger } from 'pino';
import { z } from 'zod';
import { sql, type DatabasePool } from '../db/pool.js';
import { AppError } from '../errors.js';
import type { Settlement } from '../money/settlement.js';
import type { Webhooks } from './webhooks.js';

/**
 * Spend alerts (PUT /alerts): an account names percents of its sub-keys' and OAuth grants' monthly
 * caps, a balance to be told under, and a URL; crossing one sends one signed webhook event,
 * `spend.threshold_crossed` or `balance.low`, per threshold per period.
 *
 * Exactly once, across replicas: whether a threshold was crossed is decided in Postgres
 * (`alert_check`, migrations/017_alerts.sql), right after a settlement batch commits, by inserting one
 * row per (account, key, threshold, period) with ON CONFLICT DO NOTHING: of every replica that sees a
 * crossing, only the one whose insert lands gets the event back to queue. The check compares the
 * committed spend with each threshold (not "this charge crossed it"), so the later of two concurrent
 * checks sees both charges and none is missed. The event's delivery is its row in the webhook outbox,
 * written by the same statement (so an event is never without its delivery, nor sent twice), and
 * sent by the webhook relay (src/calls/webhooks.ts: signed, retried, every attempt recorded).
 */

export const CAP_PERCENTS_MAX = 10;
export const EVENTS_DEFAULT = 50;
export const EVENTS_MAX = 200;

export interface AlertSettings {
  cap_percents: number[];
  balance_below_cents: number | null;
  url: string;
  created_at: string;
  updated_at: string;
}

const SettingsRow = z.object({
  cap_percents: z.array(z.number().int()),
  balance_below_cents: z.number().int().nullable(),
  url: z.string(),
  created_at: z.string(),
  updated_at: z.string(),
});

const DueRow = z.object({ id: z.string(), account_id: z.string(), type: z.string(), url: z.string(), body: z.unknown() });

const EventRow = z.object({
  id: z.string(),
  seq: z.number().int(),
  type: z.enum(['spend.threshold_crossed', 'balance.low']),
  data: z.record(z.unknown()),
  created_at: z.string(),
  url: z.string(),
  delivered_at: z.string().nullable(),
  deliveries: z.array(z.object({ at: z.string(), status: z.number().nullable(), ok: z.boolean(), error: z.string().nullable() })),
});

/** An event as GET /alerts lists it: what was sent, and its delivery as GET /jobs/{id} shows a job's. */
export interface AlertEvent {
  id: string;
  type: 'spend.threshold_crossed' | 'balance.low';
  data: Record<string, unknown>;
  created_at: string;
  webhook: { url: string; deliveries: Array<{ at: string; status: number | null; ok: boolean; error?: string }>; delivered_at: string | null };
}

/** Opaque page cursor: the last event's sequence number. */
function encodeCursor(seq: number): string {
  return Buffer.from(JSON.stringify(['alerts', seq])).toString('base64url');
}

function decodeCursor(cursor: string): number {
  try {
    const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
    if (Array.isArray(v) && v.length === 2 && v[0] === 'alerts' && Number.isSafeInteger(v[1]) && (v[1] as number) > 0) return v[1] as number;
  } catch {
    // fall through
  }
  throw new AppError('invalid_input', 'cursor is not one this service gave out: pass next_cursor from the previous page unchanged', {
    issues: [{ path: ['cursor'], message: 'invalid cursor' }],
  });
}

export class Alerts {
  constructor(private readonly deps: { pool: DatabasePool; webhooks: Webhooks; log: Logger }) {}

  /**
   * Checks the thresholds of the accounts and keys just charged (settlement's `onCharged`); the events
   * due are written with their outbox rows, and this process's relay is woken. One statement for
   * accounts without alerts: it finds no settings.
   */
  async check(charged: Array<Pick<Settlement, 'accountId' | 'keyId'>>): Promise<void> {
    const seen = new Set<string>();
    const batch = charged
      .map((c) => ({ account_id: c.accountId, key_id: c.keyId }))
      .filter((c) => !seen.has(`${c.account_id}/${c.key_id}`) && seen.add(`${c.account_id}/${c.key_id}`));
    const { outbox } = this.deps.webhooks;
    const due = await this.deps.pool.any(sql.type(DueRow)`
      SELECT id, account_id, type, url, body FROM alert_check(${sql.jsonb(batch)}, ${outbox.scope})`);
    if (!due.length) return;
    outbox.wake();
    this.deps.log.info({ events: due.map((d) => d.type) }, 'spend alerts queued');
  }

  async get(accountId: string): Promise<AlertSettings | null> {
    return this.deps.pool.maybeOne(sql.type(SettingsRow)`
      SELECT cap_percents, balance_below_cents, url, created_at, updated_at FROM alert_settings WHERE account_id = ${accountId}`);
  }

  /**
   * Saves the account's alerts (replacing any), then checks them at once against this month's spend
   * and the balance: a threshold already passed is sent now, once, not at the next charge. A new
   * balance threshold starts a new balance.low period.
   */
  async put(accountId: string, s: { cap_percents: number[]; balance_below_cents: number | null; url: string }): Promise<AlertSettings> {
    const saved = await this.deps.pool.one(sql.type(SettingsRow)`
      INSERT INTO alert_settings AS a (account_id, cap_percents, balance_below_cents, url)
      VALUES (${accountId}, ${sql.array(s.cap_percents, 'int4')}, ${s.balance_below_cents}, ${s.url})
      ON CONFLICT (account_id) DO UPDATE SET cap_percents = EXCLUDED.cap_percents, balance_below_cents = EXCLUDED.balance_below_cents,
        url = EXCLUDED.url, updated_at = now(),
        balance_since = CASE WHEN a.balance_below_cents IS DISTINCT FROM EXCLUDED.balance_below_cents THEN now() ELSE a.balance_since END
      RETURNING cap_percents, balance_below_cents, url, created_at, updated_at`);
    const keys = await this.deps.pool.anyFirst(sql.type(z.object({ id: z.string() }))`
      SELECT id FROM api_keys WHERE account_id = ${accountId} AND type IN ('sub', 'grant') AND monthly_limit_cents IS NOT NULL AND revoked_at IS NULL`);
    // Saved is saved: a failed check only delays its events to the account's next charge.
    await this.check([{ accountId, keyId: null }, ...keys.map((keyId) => ({ accountId, keyId }))]).catch((err: Error) =>
      this.deps.log.warn({ err: err.message }, 'checking spend alerts after saving them failed'),
    );
    return saved;
  }

  /** Removes the account's alerts (the events sent stay listed). False when it had none. */
  async remove(accountId: string): Promise<boolean> {
    const gone = await this.deps.pool.maybeOneFirst(sql.type(z.object({ account_id: z.string() }))`
      DELETE FROM alert_settings WHERE account_id = ${accountId} RETURNING account_id`);
    return gone !== null;
  }

  /** The account's events, newest first, `limit` a page. */
  async events(accountId: string, page: { limit: number; cursor?: string }): Promise<{ events: AlertEvent[]; next_cursor: string | null }> {
    const before = page.cursor ? decodeCursor(page.cursor) : null;
    const rows = await this.deps.pool.any(sql.type(EventRow)`
      SELECT 'evt_' || e.id AS id, e.seq, e.type, e.body -> 'data' AS data, e.created_at, e.url, w.delivered_at,
        COALESCE((SELECT json_agg(json_build_object('at', d.at, 'status', d.status, 'ok', d.ok, 'error', d.error) ORDER BY d.id)
          FROM webhook_deliveries d WHERE d.job_id = 'evt_' || e.id), '[]'::json) AS deliveries
      FROM alert_events e LEFT JOIN webhook_jobs w ON w.job_id = 'evt_' || e.id
      WHERE e.account_id = ${accountId} ${before ? sql.fragment`AND e.seq < ${before}` : sql.fragment``}
      ORDER BY e.seq DESC LIMIT ${page.limit + 1}`);
    const shown = rows.slice(0, page.limit);
    return {
      events: shown.map((r) => ({
        id: r.id,
        type: r.type,
        data: r.data,
        created_at: r.created_at,
        webhook: {
          url: r.url,
          deliveries: r.deliveries.map((d) => ({ at: new Date(d.at).toISOString(), status: d.status, ok: d.ok, ...(d.error ? { error: d.error } : {}) })),
          delivered_at: r.delivered_at,
        },
      })),
      next_cursor: rows.length > page.limit ? encodeCursor(shown[shown.length - 1]!.seq) : null,
    };
  }
}
