/**
 * Tool sets: named lists of tools and whole families an account keeps (migrations/014_tool_sets.sql).
 * They narrow what a caller sees and may call, two ways:
 *
 * - a key's default set (`api_keys.tool_set_id`): authentication puts it on the caller and
 *   `authorizeTool` (src/calls/admission.ts) refuses every tool outside it, on every surface. It
 *   composes with a sub-key's (or grant's) `allowed_tools`: a tool must be in both.
 * - a narrowing of one /mcp request (`?tools=`, `?families=`, `?set=`): its tools/list shows only
 *   those tools and its tools/call refuses the others.
 *
 * A set is resolved against the registry when it is used: its tools plus every tool of its families
 * (so a tool added to a family later joins the set), less any name the registry no longer has.
 */
import { z } from 'zod';
import { FAMILIES, type Family } from '../config.js';
import { AppError } from '../errors.js';
import { sql, type DatabasePool } from '../db/pool.js';
import { TOOLS, findTool } from '../tools/index.js';

/** A key's reference to its set failed: the set was deleted while the key was being given it. */
export function isToolSetGone(e: unknown): boolean {
  return (e as { constraint?: unknown } | null)?.constraint === 'api_keys_tool_set_fk';
}

/** How many sets one account may keep, and how many tools one set may name. */
export const MAX_TOOL_SETS = 50;
export const MAX_SET_TOOLS = 200;
/** A set's name: lower-case letters, digits, `_` and `-`, starting with a letter or digit. */
export const TOOL_SET_NAME = /^[a-z0-9][a-z0-9_-]{0,63}$/;

export const ToolSetName = z
  .string()
  .regex(TOOL_SET_NAME, 'must be 1-64 lower-case letters, digits, _ or -, starting with a letter or digit')
  .describe('Lower-case letters, digits, _ and -; unique within the account.');

/** What a set is made of (stored as given, each name once). */
export interface ToolSetDefinition {
  tools: string[];
  families: Family[];
}

/** A key's default set as authentication hands it to the caller: its name and the tools it allows. */
export interface KeyToolSet {
  name: string;
  tools: ReadonlySet<string>;
}

/** The stored form of a key's default set, as the key lookup reads it. */
export const StoredToolSetSchema = z.object({ name: z.string(), tools: z.array(z.string()), families: z.array(z.string()) });
export type StoredToolSet = z.infer<typeof StoredToolSetSchema>;

/** The registry's tool names a definition stands for: its tools plus every tool of its families. */
export function resolveToolSet(def: { tools: readonly string[]; families: readonly string[] }): Set<string> {
  const families = new Set(def.families);
  const names = new Set(def.tools.filter((n) => findTool(n)));
  for (const t of TOOLS) if (families.has(t.family)) names.add(t.name);
  return names;
}

const resolvedOnce = new WeakMap<StoredToolSet, KeyToolSet>();

/** A key record's stored set as the caller carries it; resolved once per cached record. */
export function keyToolSet(stored: StoredToolSet | null | undefined): KeyToolSet | null {
  if (!stored) return null;
  let set = resolvedOnce.get(stored);
  if (!set) {
    set = { name: stored.name, tools: resolveToolSet(stored) };
    resolvedOnce.set(stored, set);
  }
  return set;
}

/**
 * The call-time rule of a key's default set: refused (403 tool_not_allowed, uncharged) unless the
 * set includes the tool. `authorizeTool` applies it, so every surface that calls a tool does.
 */
export function assertInKeyToolSet(toolSet: KeyToolSet | null | undefined, toolName: string): void {
  if (!toolSet || toolSet.tools.has(toolName)) return;
  throw new AppError('tool_not_allowed', `This key's tool set "${toolSet.name}" does not include ${toolName}`, {
    tool_set: toolSet.name,
  });
}

/** Names given as a list, each once, those the registry does not know refused by name. */
const ToolNames = z
  .array(z.string().max(100))
  .max(MAX_SET_TOOLS)
  .superRefine((names, ctx) => {
    const unknown = names.filter((n) => !findTool(n));
    if (unknown.length) ctx.addIssue({ code: 'custom', message: `unknown tools: ${unknown.slice(0, 20).join(', ')}` });
  })
  .transform((names) => [...new Set(names)]);

const FamilyNames = z
  .array(z.string().max(100))
  .max(FAMILIES.length * 2)
  .superRefine((names, ctx) => {
    const unknown = names.filter((n) => !(FAMILIES as readonly string[]).includes(n));
    if (unknown.length) ctx.addIssue({ code: 'custom', message: `unknown families: ${unknown.join(', ')} (families: ${FAMILIES.join(', ')})` });
  })
  .transform((names) => [...new Set(names)] as Family[]);

/** The body of POST /toolsets and PUT /toolsets/{name}: tools and/or families, at least one name in all. */
export const ToolSetContents = z
  .object({
    tools: ToolNames.optional().describe(`Tool names (GET /tools lists them), at most ${MAX_SET_TOOLS}; an unknown name is refused.`),
    families: FamilyNames.optional().describe(`Whole families (${FAMILIES.join(', ')}): every tool of each, those added later too.`),
  })
  .strict()
  .superRefine((v, ctx) => {
    if (!v.tools?.length && !v.families?.length) ctx.addIssue({ code: 'custom', message: 'name at least one tool or family', path: ['tools'] });
  });

const Row = z.object({
  id: z.string().uuid(),
  name: z.string(),
  tools: z.array(z.string()),
  families: z.array(z.string()),
  created_at: z.string(),
  updated_at: z.string(),
  key_ids: z.array(z.string().uuid()),
});
export type ToolSetRow = z.infer<typeof Row>;

/** A key that may still authenticate (not revoked, not past a rotation's grace): it keeps its set. */
const liveKey = sql.fragment`k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())`;

const columns = sql.fragment`s.id, s.name, s.tools, s.families, s.created_at, s.updated_at,
  ARRAY(SELECT k.id FROM api_keys k WHERE k.tool_set_id = s.id AND ${liveKey} ORDER BY k.created_at, k.id)::text[] AS key_ids`;

/** One lock per account around changes to its sets, so two creations cannot both pass the count. */
const lockAccountSets = (accountId: string) => sql.unsafe`SELECT pg_advisory_xact_lock(hashtext(${`tool_sets:${accountId}`}))`;

export type SetKeyToolSet = { ok: true; key_id: string; tool_set: string | null } | { ok: false; state: 'no_key' | 'no_set' | 'key_not_active' };

export class ToolSetsRepo {
  constructor(private readonly pool: DatabasePool) {}

  async list(accountId: string): Promise<ToolSetRow[]> {
    return [...(await this.pool.any(sql.type(Row)`SELECT ${columns} FROM tool_sets s WHERE s.account_id = ${accountId} ORDER BY s.name`))];
  }

  async get(accountId: string, name: string): Promise<ToolSetRow | null> {
    return this.pool.maybeOne(sql.type(Row)`SELECT ${columns} FROM tool_sets s WHERE s.account_id = ${accountId} AND s.name = ${name}`);
  }

  /** A new set; 'exists' when the account has one of that name, 'full' at MAX_TOOL_SETS. */
  async create(accountId: string, name: string, def: ToolSetDefinition): Promise<ToolSetRow | 'exists' | 'full'> {
    return this.pool.transaction(async (tx) => {
      await tx.query(lockAccountSets(accountId));
      const count = await tx.oneFirst(sql.type(z.object({ n: z.number().int() }))`
        SELECT count(*)::bigint AS n FROM tool_sets WHERE account_id = ${accountId}`);
      const taken = await tx.exists(sql.unsafe`SELECT 1 FROM tool_sets WHERE account_id = ${accountId} AND name = ${name}`);
      if (taken) return 'exists';
      if (count >= MAX_TOOL_SETS) return 'full';
      return tx.one(sql.type(Row)`
        WITH s AS (
          INSERT INTO tool_sets (account_id, name, tools, families)
          VALUES (${accountId}, ${name}, ${sql.array(def.tools, 'text')}, ${sql.array(def.families, 'text')})
          RETURNING *
        )
        SELECT s.id, s.name, s.tools, s.families, s.created_at, s.updated_at, '{}'::text[] AS key_ids FROM s`);
    });
  }

  /** Replaces a set's contents; null when the account has no set of that name. */
  async replace(accountId: string, name: string, def: ToolSetDefinition): Promise<ToolSetRow | null> {
    return this.pool.maybeOne(sql.type(Row)`
      WITH s AS (
        UPDATE tool_sets SET tools = ${sql.array(def.tools, 'text')}, families = ${sql.array(def.families, 'text')}, updated_at = now()
        WHERE account_id = ${accountId} AND name = ${name}
        RETURNING *
      )
      SELECT ${columns} FROM s`);
  }

  /**
   * Deletes a set no live key names ('in_use' with their ids otherwise: move or revoke those keys
   * first, so no key is ever left naming nothing). Revoked and expired keys let go of it.
   * Null when the account has no set of that name.
   */
  async delete(accountId: string, name: string): Promise<{ deleted: true } | { in_use: string[] } | null> {
    return this.pool.transaction(async (tx) => {
      // Locked first: a key being given this set meanwhile waits, then fails its reference check.
      const id = await tx.maybeOneFirst(sql.type(z.object({ id: z.string().uuid() }))`
        SELECT id FROM tool_sets WHERE account_id = ${accountId} AND name = ${name} FOR UPDATE`);
      if (id === null) return null;
      const users = await tx.anyFirst(sql.type(z.object({ id: z.string().uuid() }))`
        SELECT k.id FROM api_keys k WHERE k.tool_set_id = ${id} AND ${liveKey} ORDER BY k.created_at, k.id`);
      if (users.length) return { in_use: [...users] };
      await tx.query(sql.unsafe`UPDATE api_keys SET tool_set_id = NULL WHERE tool_set_id = ${id}`);
      await tx.query(sql.unsafe`DELETE FROM tool_sets WHERE id = ${id}`);
      return { deleted: true as const };
    });
  }

  /** A set's id by name, locked against deletion until the transaction ends; null when none. */
  async idForUpdate(tx: Pick<DatabasePool, 'maybeOneFirst'>, accountId: string, name: string): Promise<string | null> {
    return tx.maybeOneFirst(sql.type(z.object({ id: z.string().uuid() }))`
      SELECT id FROM tool_sets WHERE account_id = ${accountId} AND name = ${name} FOR SHARE`);
  }

  /** Gives a live key of the account a default set (or none, with null). */
  async setKeyToolSet(accountId: string, keyId: string, name: string | null): Promise<SetKeyToolSet> {
    return this.pool.transaction(async (tx) => {
      const key = await tx.maybeOne(sql.type(z.object({ live: z.boolean() }))`
        SELECT (${liveKey}) AS live FROM api_keys k WHERE k.id = ${keyId} AND k.account_id = ${accountId} FOR UPDATE`);
      if (!key) return { ok: false as const, state: 'no_key' as const };
      if (!key.live) return { ok: false as const, state: 'key_not_active' as const };
      const setId = name === null ? null : await this.idForUpdate(tx, accountId, name);
      if (name !== null && setId === null) return { ok: false as const, state: 'no_set' as const };
      await tx.query(sql.unsafe`UPDATE api_keys SET tool_set_id = ${setId} WHERE id = ${keyId}`);
      return { ok: true as const, key_id: keyId, tool_set: name };
    });
  }
}

/** The narrowing of one /mcp request: which tools it offers, and how the caller asked for it. */
export interface ToolNarrowing {
  tools: ReadonlySet<string>;
  /** The query as the caller gave it, e.g. "?families=core", for messages. */
  asked: string;
}

/** /mcp's query: comma-separated lists, length-capped before anything is split. */
export interface NarrowingQuery {
  tools?: string;
  families?: string;
  set?: string;
}

const split = (v: string) =>
  v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);

/**
 * Resolves /mcp's `?tools=`, `?families=` and `?set=` into the tools that request offers: each one
 * given narrows (the intersection of all). Null when none is given. An unknown tool, family or set is
 * refused (400 invalid_input naming each), never dropped: a typo must not widen or empty the list.
 */
export async function resolveNarrowing(
  q: NarrowingQuery,
  lookupSet: (name: string) => Promise<{ tools: string[]; families: string[] } | null>,
): Promise<ToolNarrowing | null> {
  if (q.tools === undefined && q.families === undefined && q.set === undefined) return null;
  const issues: Array<{ path: string[]; message: string }> = [];
  const parts: Array<Set<string>> = [];
  const asked: string[] = [];
  if (q.tools !== undefined) {
    const names = split(q.tools);
    const unknown = names.filter((n) => !findTool(n));
    if (!names.length) issues.push({ path: ['tools'], message: 'name at least one tool' });
    else if (unknown.length) issues.push({ path: ['tools'], message: `unknown tools: ${unknown.slice(0, 20).join(', ')}` });
    parts.push(new Set(names));
    asked.push(`tools=${q.tools}`);
  }
  if (q.families !== undefined) {
    const names = split(q.families);
    const unknown = names.filter((n) => !(FAMILIES as readonly string[]).includes(n));
    if (!names.length) issues.push({ path: ['families'], message: 'name at least one family' });
    else if (unknown.length) issues.push({ path: ['families'], message: `unknown families: ${unknown.join(', ')} (families: ${FAMILIES.join(', ')})` });
    parts.push(resolveToolSet({ tools: [], families: names }));
    asked.push(`families=${q.families}`);
  }
  if (q.set !== undefined) {
    const set = TOOL_SET_NAME.test(q.set) ? await lookupSet(q.set) : null;
    if (!set) issues.push({ path: ['set'], message: `unknown tool set: ${q.set} (GET /toolsets lists this account's sets)` });
    else parts.push(resolveToolSet(set));
    asked.push(`set=${q.set}`);
  }
  if (issues.length) {
    throw new AppError('invalid_input', `The /mcp query is invalid: ${issues.map((i) => `${i.path[0]}: ${i.message}`).join('; ')}`, { issues });
  }
  const [first, ...rest] = parts;
  const tools = new Set([...first!].filter((n) => rest.every((p) => p.has(n))));
  return { tools, asked: `?${asked.join('&')}` };
}
