import { z } from 'zod';
import { AppError } from '../../errors.js';
import {
  DELIVERY_RE,
  HANDLE_RE,
  PASSPORT_LABEL_MAX,
  PASSPORT_MAX_TTL_S,
  PASSPORT_MIN_TTL_S,
  PASSPORT_PAGE_MAX,
  SELF,
  type PassportApi,
} from './passport-api.js';
import { defineTool, type AnyTool, type ToolContext } from '../types.js';

/**
 * passport_store and passport_send: handlers over ctx.passports (src/access/passports.ts), which the
 * runner binds to the caller's account, key and sandbox flag. Another account's handle is not found.
 */

/** The schema's bound on content (UTF-16 units); the real cap, PASSPORT_MAX_BYTES of UTF-8, is the service's. */
const CONTENT_MAX_CHARS = 4 * 1024 * 1024;

const Handle = z.string().regex(HANDLE_RE, 'a passport handle: pp_ and 32 letters, digits, _ or -');
const Content = z
  .string()
  .max(CONTENT_MAX_CHARS)
  .describe('The text to keep, at most PASSPORT_MAX_BYTES (256 KiB by default) of UTF-8; given back byte for byte');
const Label = z.string().max(PASSPORT_LABEL_MAX).describe(`A name for the passport (at most ${PASSPORT_LABEL_MAX} characters)`);
const Ttl = z
  .number()
  .int()
  .min(PASSPORT_MIN_TTL_S)
  .max(PASSPORT_MAX_TTL_S)
  .describe(`Seconds the passport lives, ${PASSPORT_MIN_TTL_S} to ${PASSPORT_MAX_TTL_S} (30 days); default 86,400 (a day)`);

const ACTIONS = ['put', 'get', 'list', 'inbox', 'delete'] as const;

const StoreInput = z
  .object({
    action: z.enum(ACTIONS).optional().describe('put (default with content), get, list (default without content), inbox or delete'),
    content: Content.optional(),
    label: Label.optional(),
    ttl_s: Ttl.optional(),
    handle: Handle.optional().describe('The passport to get or delete'),
    delivery_id: z
      .string()
      .regex(DELIVERY_RE, 'a delivery id: dl_ and 22 letters, digits, _ or -')
      .optional()
      .describe('delete: removes this delivery from your inbox instead of a passport'),
    limit: z.number().int().min(1).max(PASSPORT_PAGE_MAX).optional().describe(`list, inbox: entries per page (1-${PASSPORT_PAGE_MAX}, default 50)`),
    cursor: z
      .string()
      .regex(/^\d{1,7}$/)
      .optional()
      .describe("list, inbox: the previous page's next_cursor"),
  })
  .strict()
  .superRefine((v, ctx) => {
    const action = v.action ?? (v.content !== undefined ? 'put' : 'list');
    const issue = (path: string, message: string) => ctx.addIssue({ code: z.ZodIssueCode.custom, path: [path], message });
    const only = (allowed: string[]) => {
      for (const f of ['content', 'label', 'ttl_s', 'handle', 'delivery_id', 'limit', 'cursor'] as const) {
        if (v[f] !== undefined && !allowed.includes(f)) issue(f, `not used by action ${action}`);
      }
    };
    if (action === 'put') {
      if (v.content === undefined) issue('content', 'put needs content');
      only(['content', 'label', 'ttl_s']);
    } else if (action === 'get') {
      if (v.handle === undefined) issue('handle', 'get needs a handle');
      only(['handle']);
    } else if (action === 'delete') {
      if ((v.handle === undefined) === (v.delivery_id === undefined)) issue('handle', 'delete needs a handle, or a delivery_id, not both');
      only(['handle', 'delivery_id']);
    } else {
      only(['limit', 'cursor']);
    }
  });

const Iso = z.string().datetime();
const Sha = z.string().regex(/^[0-9a-f]{64}$/);
const Meta = z.object({
  handle: z.string(),
  label: z.string().nullable(),
  bytes: z.number().int().nonnegative(),
  sha256: Sha,
  created_at: Iso,
  expires_at: Iso,
  from_key_id: z.string().nullable(),
});
const DeliveryOut = z.object({
  delivery_id: z.string(),
  handle: z.string(),
  from_key_id: z.string().nullable(),
  label: z.string().nullable(),
  bytes: z.number().int().nonnegative(),
  sha256: Sha,
  sent_at: Iso,
  expires_at: Iso,
});

const StoreOutput = z.discriminatedUnion('action', [
  z.object({ action: z.literal('put'), handle: z.string(), bytes: z.number().int().nonnegative(), sha256: Sha, expires_at: Iso }),
  Meta.extend({ action: z.literal('get'), content: z.string() }),
  z.object({ action: z.literal('list'), passports: z.array(Meta), total: z.number().int().nonnegative(), next_cursor: z.string().nullable() }),
  z.object({ action: z.literal('inbox'), deliveries: z.array(DeliveryOut), total: z.number().int().nonnegative(), next_cursor: z.string().nullable() }),
  z.object({ action: z.literal('delete'), deleted: z.literal(true), handle: z.string().optional(), delivery_id: z.string().optional() }),
]);

function passportsOf(ctx: ToolContext): PassportApi {
  if (!ctx.passports) throw new AppError('forbidden', 'Passports belong to an account: call with an API key');
  return ctx.passports;
}

export const passportStore = defineTool({
  name: 'passport_store',
  description: "Keeps text for your account's keys and agents (put, get, list, inbox, delete): encrypted, with a TTL.",
  tier: 'enterprise',
  priceCents: 0,
  family: 'core',
  input: StoreInput,
  qField: 'content',
  output:
    'put: {action, handle, bytes, sha256, expires_at}; get: {action, handle, content, bytes, sha256, label, created_at, expires_at, from_key_id}; list: {action, passports[meta], total, next_cursor}; inbox: {action, deliveries[{delivery_id, handle, from_key_id, label, bytes, sha256, sent_at, expires_at}], total, next_cursor}; delete: {action, deleted, handle|delivery_id}',
  outputSchema: StoreOutput,
  examples: [
    { action: 'put', content: 'Goal: ship the billing fix. State: tests pass; deploy pending.', label: 'handoff', ttl_s: 3600 },
    { action: 'list', limit: 10 },
    { action: 'inbox' },
  ],
  // Writes account state (put, delete): not read-only for MCP, and not sold per call to x402 payers, who have no account.
  sideEffects: true,
  // put's input and get's answer are a passport's content.
  sensitive: true,
  handler: async (input, ctx): Promise<z.infer<typeof StoreOutput>> => {
    const pp = passportsOf(ctx);
    const action = input.action ?? (input.content !== undefined ? 'put' : 'list');
    switch (action) {
      case 'put':
        return { action, ...(await pp.put({ content: input.content!, label: input.label, ttl_s: input.ttl_s })) };
      case 'get':
        return { action, ...(await pp.get(input.handle!)) };
      case 'list':
        return { action, ...(await pp.list({ limit: input.limit, cursor: input.cursor })) };
      case 'inbox':
        return { action, ...(await pp.inbox({ limit: input.limit, cursor: input.cursor })) };
      case 'delete':
        return { action, ...(input.handle !== undefined ? await pp.delete(input.handle) : await pp.dismiss(input.delivery_id!)) };
    }
  },
});

const SendInput = z
  .object({
    to: z.string().min(1).max(200).describe(`The recipient in your account: a key id, an agent key's name, or "${SELF}" (the calling key)`),
    handle: Handle.optional().describe('An existing passport to deliver'),
    content: Content.optional().describe('New content to store as a passport and deliver (instead of handle)'),
    label: Label.optional(),
    ttl_s: Ttl.optional().describe(
      `New content: seconds the passport lives (${PASSPORT_MIN_TTL_S}-${PASSPORT_MAX_TTL_S}, default a day). An existing handle: the delivery may end sooner than the passport, never later`,
    ),
  })
  .strict()
  .superRefine((v, ctx) => {
    if ((v.handle === undefined) === (v.content === undefined)) {
      ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['content'], message: 'send either handle or content, not both' });
    }
    if (v.handle !== undefined && v.label !== undefined) {
      ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['label'], message: 'label names new content; an existing passport keeps its own' });
    }
  });

const SendOutput = z.object({
  delivery_id: z.string(),
  handle: z.string(),
  to_key_id: z.string(),
  expires_at: Iso,
  dry_run: z.literal(true).optional(),
});

export const passportSend = defineTool({
  name: 'passport_send',
  description: "Delivers a passport (an existing handle or new content) to another key or agent of your account; it appears in that key's inbox.",
  tier: 'enterprise',
  priceCents: 5,
  family: 'core',
  input: SendInput,
  qField: 'content',
  output: '{delivery_id, handle, to_key_id, expires_at, dry_run?}',
  outputSchema: SendOutput,
  // "self" makes the example runnable by any key: a real recipient's key id is per account.
  examples: [{ to: SELF, content: 'Brief for the next session: the billing fix is merged; deploy on Monday.', ttl_s: 3600 }],
  sideEffects: true,
  // New content is a passport's content.
  sensitive: true,
  handler: async (input, ctx): Promise<z.infer<typeof SendOutput>> => passportsOf(ctx).send(input),
});

/** passport_store, passport_send. */
export const passportTools: AnyTool[] = [passportStore, passportSend];
