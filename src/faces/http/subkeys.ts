import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { findTool } from '../../tools/index.js';
import type { KeyCaller } from '../../access/auth.js';
import { KeyAuthenticator } from '../../access/auth.js';
import { requireKeyOwner } from '../../access/keys.js';
import { ToolSetName } from '../../access/tool-sets.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, input, named, ok, type RouteSchema } from './route-schema.js';

const CreateSubKey = named(
  'CreateSubKey',
  z
    .object({
      name: z.string().trim().min(1).max(100),
      monthly_limit: z.number().int().positive('must be a positive number of cents').max(1_000_000_000).describe('Cents per calendar month (UTC).'),
      allowed_tools: z
        .array(z.string())
        .min(1, 'list at least one tool')
        .max(500)
        .superRefine((names, ctx) => {
          const unknown = names.filter((n) => !findTool(n));
          if (unknown.length) ctx.addIssue({ code: 'custom', message: `unknown tools: ${unknown.join(', ')}` });
        })
        .transform((names) => [...new Set(names)])
        .describe('Tool names (GET /tools lists them); an unknown name is refused, repeated names count once.'),
      tool_set: ToolSetName.optional().describe(
        "A tool set of the account (POST /toolsets) as the sub-key's default set: it may call only tools in both it and allowed_tools.",
      ),
    })
    .strict(),
);

const SubKeySchema = named(
  'SubKey',
  z
    .object({
      key_id: z.string().uuid(),
      name: z.string().nullable(),
      display_prefix: z.string().describe('The first characters of the key, to recognise it by.'),
      monthly_limit: z.number().int().describe('Cents per calendar month (UTC).'),
      allowed_tools: z.array(z.string()),
      tool_set: z.string().nullable().describe('Its default tool set (PUT /keys/{key_id}/tool_set changes it), or null.'),
      used_this_month: z.number().int().describe('Cents charged to this sub-key this calendar month (UTC).'),
      created_at: z.string().datetime(),
    })
    .describe('A live sub-key, without its secret.'),
);

const NewSubKeySchema = named(
  'NewSubKey',
  z
    .object({
      key_id: z.string().uuid(),
      api_key: z.string().describe('The sub-key (cv_sub_...), shown only in this answer.'),
      name: z.string(),
      monthly_limit: z.number().int().describe('Cents per calendar month (UTC).'),
      allowed_tools: z.array(z.string()).describe('As sent, each name once.'),
      tool_set: z.string().nullable().describe('Its default tool set, or null.'),
      used_this_month: z.literal(0),
      created_at: z.string().datetime(),
    })
    .describe('The new sub-key (api_key shown once).'),
);

const SubKeyListSchema = z.object({ subkeys: z.array(SubKeySchema).describe('Live (unrevoked) sub-keys, oldest first.') });

const SubKeyIdParams = z.object({ key_id: z.string().describe('A sub-key id (GET /subkeys lists them); anything else is 404.') });

const RevokedSubKeySchema = z.object({ key_id: z.string(), revoked: z.literal(true) });

const MANAGER =
  "Only an enterprise account's current production key manages sub-keys (other keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace; " +
  'another plan: 403 plan_required).';

/** Only an enterprise account's production key manages sub-keys (src/access/keys.ts says who manages what). */
function requireManager(caller: KeyCaller, action: string): void {
  requireKeyOwner(caller, action);
  if (caller.plan !== 'enterprise') {
    throw new AppError('plan_required', 'Sub-keys are an enterprise feature', { required_plan: 'enterprise', current_plan: caller.plan });
  }
}

export async function subkeyRoutes(app: FastifyInstance): Promise<void> {
  const { accounts, redis, config } = app.container;

  app.post(
    '/subkeys/create',
    {
      schema: {
        operationId: 'createSubKey',
        tags: ['Sub-keys'],
        summary: 'Create a sub-key with a monthly limit and allowed tools (enterprise)',
        description:
          `A key (cv_sub_) that calls only \`allowed_tools\` (and, given \`tool_set\`, only those also in that set; an unknown set: 400), charged to the account, ` +
          `refused (402 monthly_limit_exceeded) past \`monthly_limit\` cents a month. ${MANAGER}`,
        body: CreateSubKey,
        bodyExamples: {
          agent: {
            summary: 'An agent that may search and fetch pages, up to $20 a month',
            value: { name: 'research-agent', monthly_limit: 2000, allowed_tools: ['web_search', 'page_fetch'] },
          },
        },
        response: { '201': ok(NewSubKeySchema, 'The new sub-key (api_key shown once).', { headers: RATE_LIMIT }), ...errors(['400', '403', '413', '415']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireManager(caller, 'create sub-keys');
      const body = input<typeof CreateSubKey>(req, 'body', 'Sub-key request is invalid');
      const key = await accounts.createKey({
        accountId: caller.accountId,
        type: 'sub',
        name: body.name,
        monthlyLimitCents: body.monthly_limit,
        allowedTools: body.allowed_tools,
        createdByKeyId: caller.keyId,
        toolSet: body.tool_set ?? null,
      });
      return reply.status(201).send({
        key_id: key.key_id,
        api_key: key.api_key,
        name: body.name,
        monthly_limit: body.monthly_limit,
        allowed_tools: body.allowed_tools,
        tool_set: body.tool_set ?? null,
        used_this_month: 0,
        created_at: key.created_at,
      });
    },
  );

  app.get(
    '/subkeys',
    {
      schema: {
        operationId: 'listSubKeys',
        tags: ['Sub-keys'],
        summary: "The account's sub-keys with this month's use (enterprise)",
        description: MANAGER,
        response: { '200': ok(SubKeyListSchema, "Live sub-keys with this month's use.", { headers: RATE_LIMIT }), ...errors(['403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireManager(caller, 'list sub-keys');
      return { subkeys: await accounts.listSubKeys(caller.accountId) };
    },
  );

  app.delete(
    '/subkeys/:key_id',
    {
      schema: {
        operationId: 'revokeSubKey',
        tags: ['Sub-keys'],
        summary: 'Revoke a sub-key at once',
        description: `Every replica refuses it within milliseconds. Revoking a revoked sub-key answers 200 again; an id that is no sub-key of the account: 404. ${MANAGER}`,
        params: SubKeyIdParams,
        response: { '200': ok(RevokedSubKeySchema, 'Revoked.', { headers: RATE_LIMIT }), ...errors(['403', '404']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireManager(caller, 'delete sub-keys');
      const id = input<typeof SubKeyIdParams>(req, 'params').key_id;
      const revoked = z.string().uuid().safeParse(id).success ? await accounts.revokeKey(id, { accountId: caller.accountId, type: 'sub' }) : null;
      if (!revoked) throw new AppError('not_found', `No sub-key ${id} on this account`);
      // This replica forgets the key now; the others on the broadcast, within milliseconds.
      app.container.api!.auth.clear();
      await KeyAuthenticator.broadcast(redis, config.REDIS_PREFIX);
      return { key_id: id, revoked: true };
    },
  );
}
