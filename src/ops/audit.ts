import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { CommonQueryMethods } from 'slonik';
import { sql } from '../db/pool.js';

/**
 * The operators' audit log (migrations/016_audit.sql): append-only, one row per change made through
 * the admin API or the admin CLI. Rows are written with the change's own transaction connection, so a
 * change and its record commit together or not at all. Nothing here updates or deletes a row (and the
 * table's triggers refuse it).
 */

/** Who made a change: the admin API (by its token's fingerprint), the CLI (by OS user), or the service itself (seeding). */
export interface Actor {
  kind: 'admin-api' | 'cli' | 'system';
  id: string;
  /** The HTTP request's id (X-Request-Id), or the CLI run's own id. */
  requestId: string | null;
}

/** What the record says about the token: enough to tell two tokens apart, nothing to recover one. */
export function tokenFingerprint(token: string): string {
  return 'sha256:' + createHash('sha256').update(token).digest('hex').slice(0, 16);
}

export const AUDIT_ACTIONS = [
  'account.create',
  'account.update',
  'credits.add',
  'credits.remove',
  'key.create',
  'key.revoke',
  'partner.create',
  'payment.mark_settled',
  'payment.mark_failed',
  'payments.settle',
] as const;
export type AuditAction = (typeof AUDIT_ACTIONS)[number];

export interface AuditEntry {
  action: AuditAction;
  accountId?: string | null;
  targetId?: string | null;
  before: unknown;
  after: unknown;
}

export const AuditRecordSchema = z.object({
  id: z.number().int(),
  at: z.string(),
  actor: z.object({ kind: z.enum(['admin-api', 'cli', 'system']), id: z.string() }),
  request_id: z.string().nullable(),
  action: z.enum(AUDIT_ACTIONS),
  account_id: z.string().uuid().nullable(),
  target_id: z.string().nullable(),
  before: z.unknown(),
  after: z.unknown(),
});
export type AuditRecord = z.infer<typeof AuditRecordSchema>;

const Row = z.object({
  id: z.number().int(),
  at: z.string(),
  actor_kind: z.enum(['admin-api', 'cli', 'system']),
  actor_id: z.string(),
  request_id: z.string().nullable(),
  action: z.enum(AUDIT_ACTIONS),
  account_id: z.string().nullable(),
  target_id: z.string().nullable(),
  before: z.unknown(),
  after: z.unknown(),
});

export interface AuditQuery {
  accountId?: string;
  action?: AuditAction;
  actorKind?: Actor['kind'];
  since?: string;
  until?: string;
  /** Records older than this id (the previous page's next_cursor). */
  beforeId?: number;
  limit: number;
}

/** Appends one record, on `db`: the change's transaction when there is one. */
export async function appendAudit(db: CommonQueryMethods, actor: Actor, e: AuditEntry): Promise<void> {
  await db.query(sql.unsafe`
    INSERT INTO admin_audit (actor_kind, actor_id, request_id, action, account_id, target_id, before, after)
    VALUES (${actor.kind}, ${actor.id.slice(0, 200)}, ${actor.requestId?.slice(0, 200) ?? null}, ${e.action}, ${e.accountId ?? null},
            ${e.targetId ?? null}, ${json(e.before)}::jsonb, ${json(e.after)}::jsonb)`);
}

function json(v: unknown): string | null {
  return v === undefined || v === null ? null : JSON.stringify(v);
}

/** Newest first, keyset-paged by id (ids only grow, so pages never repeat or skip a record). */
export async function listAudit(db: CommonQueryMethods, q: AuditQuery): Promise<AuditRecord[]> {
  const rows = await db.any(sql.type(Row)`
    SELECT id, at, actor_kind, actor_id, request_id, action, account_id, target_id, before, after
    FROM admin_audit
    WHERE true
      ${q.accountId ? sql.fragment`AND account_id = ${q.accountId}` : sql.fragment``}
      ${q.action ? sql.fragment`AND action = ${q.action}` : sql.fragment``}
      ${q.actorKind ? sql.fragment`AND actor_kind = ${q.actorKind}` : sql.fragment``}
      ${q.since ? sql.fragment`AND at >= ${q.since}::timestamptz` : sql.fragment``}
      ${q.until ? sql.fragment`AND at < ${q.until}::timestamptz` : sql.fragment``}
      ${q.beforeId !== undefined ? sql.fragment`AND id < ${q.beforeId}` : sql.fragment``}
    ORDER BY id DESC
    LIMIT ${q.limit}`);
  return rows.map(({ actor_kind, actor_id, ...r }) => ({ ...r, actor: { kind: actor_kind, id: actor_id } }));
}
