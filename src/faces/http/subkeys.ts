import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { findTool } from '../../tools/index.js';
import type { KeyCaller } from '../../access/auth.js';
import { KeyAuthenticator } from '../../access/auth.js';
import { parseOrThrow } from '../../errors.js';
import { requireKeyOwner } from '../../access/keys.js';

const CreateSubKey = z
  .object({
    name: z.string().trim().min(1).max(100),
    monthly_limit: z.number().int().positive('must be a positive number of cents').max(1_000_000_000),
    allowed_tools: z
      .array(z.string())
      .min(1, 'list at least one tool')
      .max(500)
      .superRefine((names, ctx) => {
        const unknown = names.filter((n) => !findTool(n));
        if (unknown.length) ctx.addIssue({ code: 'custom', message: `unknown tools: ${unknown.join(', ')}` });
      })
      .transform((names) => [...new Set(names)]),
  })
  .strict();

/** Only an enterprise account's production key manages sub-keys (src/access/keys.ts says who manages what). */
function requireManager(caller: KeyCaller, action: string): void {
  requireKeyOwner(caller, action);
  if (caller.plan !== 'enterprise') {
    throw new AppError('plan_required', 'Sub-keys are an enterprise feature', { required_plan: 'enterprise', current_plan: caller.plan });
  }
}

export async function subkeyRoutes(app: FastifyInstance): Promise<void> {
  const { accounts, redis, config } = app.container;

  app.post('/subkeys/create', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireManager(caller, 'create sub-keys');
    const input = parseOrThrow(CreateSubKey, req.body, 'Sub-key request is invalid');
    const key = await accounts.createKey({
      accountId: caller.accountId,
      type: 'sub',
      name: input.name,
      monthlyLimitCents: input.monthly_limit,
      allowedTools: input.allowed_tools,
      createdByKeyId: caller.keyId,
    });
    return reply.status(201).send({
      key_id: key.key_id,
      api_key: key.api_key,
      name: input.name,
      monthly_limit: input.monthly_limit,
      allowed_tools: input.allowed_tools,
      used_this_month: 0,
      created_at: key.created_at,
    });
  });

  app.get('/subkeys', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireManager(caller, 'list sub-keys');
    return { subkeys: await accounts.listSubKeys(caller.accountId) };
  });

  app.delete<{ Params: { key_id: string } }>('/subkeys/:key_id', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireManager(caller, 'delete sub-keys');
    const id = req.params.key_id;
    const revoked = z.string().uuid().safeParse(id).success
      ? await accounts.revokeKey(id, { accountId: caller.accountId, type: 'sub' })
      : null;
    if (!revoked) throw new AppError('not_found', `No sub-key ${id} on this account`);
    // This replica forgets the key now; the others on the broadcast, within milliseconds.
    app.container.api!.auth.clear();
    await KeyAuthenticator.broadcast(redis, config.REDIS_PREFIX);
    return { key_id: id, revoked: true };
  });
}
