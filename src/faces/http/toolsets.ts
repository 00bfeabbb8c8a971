import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { FAMILIES } from '../../config.js';
import type { KeyCaller } from '../../access/auth.js';
import { KeyAuthenticator } from '../../access/auth.js';
import { requireKeyOwner } from '../../access/keys.js';
import {
  MAX_SET_TOOLS,
  MAX_TOOL_SETS,
  ToolSetContents,
  ToolSetName,
  ToolSetsRepo,
  resolveToolSet,
  type ToolSetDefinition,
  type ToolSetRow,
} from '../../access/tool-sets.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, input, named, ok, type RouteSchema } from './route-schema.js';

const CreateToolSet = named(
  'CreateToolSet',
  z.object({ name: ToolSetName }).merge(ToolSetContents.innerType()).strict().superRefine(atLeastOne).describe('A new tool set of the account.'),
);

const ReplaceToolSet = named('ReplaceToolSet', ToolSetContents.describe("A tool set's new contents: tools and/or families."));

function atLeastOne(v: { tools?: string[]; families?: string[] }, ctx: z.RefinementCtx): void {
  if (!v.tools?.length && !v.families?.length) ctx.addIssue({ code: 'custom', message: 'name at least one tool or family', path: ['tools'] });
}

const ToolSetSchema = named(
  'ToolSet',
  z
    .object({
      name: z.string(),
      tools: z.array(z.string()).describe('Tool names, as given (each once).'),
      families: z.array(z.enum(FAMILIES)).describe('Families, as given: every tool of each, those added later too.'),
      resolved_tools: z.array(z.string()).describe('The tools the set stands for now, by name: its tools plus its families.'),
      key_ids: z.array(z.string().uuid()).describe('Live keys that have it as their default set (PUT /keys/{key_id}/tool_set).'),
      created_at: z.string().datetime(),
      updated_at: z.string().datetime(),
    })
    .describe('A named tool set: narrows /mcp (?set=) and, as a key’s default, what that key may call anywhere.'),
);

const ToolSetListSchema = z.object({ tool_sets: z.array(ToolSetSchema).describe(`By name; at most ${MAX_TOOL_SETS}.`) });

const NameParams = z.object({ name: z.string().max(200).describe('A tool set of the account (GET /toolsets lists them).') });

const DeletedSchema = z.object({ name: z.string(), deleted: z.literal(true) });

const KeyIdParams = z.object({ key_id: z.string().uuid('key_id must be a key id (uuid)').describe('A key id (GET /keys lists them).') });

const SetKeyToolSet = named(
  'SetKeyToolSet',
  z
    .object({
      tool_set: ToolSetName.nullable().describe('A tool set of the account, or null for none.'),
    })
    .strict(),
);

const KeyToolSetSchema = z.object({ key_id: z.string().uuid(), tool_set: z.string().nullable() });

const MANAGER = "Only the account's current production key manages tool sets (other keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace).";

function view(row: ToolSetRow) {
  return {
    name: row.name,
    tools: row.tools,
    families: row.families,
    resolved_tools: [...resolveToolSet(row)].sort(),
    key_ids: row.key_ids,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

function notFound(name: string): AppError {
  return new AppError('not_found', `No tool set named ${name} on this account`);
}

function definition(body: { tools?: string[]; families?: ToolSetDefinition['families'] }): ToolSetDefinition {
  return { tools: body.tools ?? [], families: body.families ?? [] };
}

/** Named tool sets (src/access/tool-sets.ts) and keys' default sets, managed by the account's production key. */
export async function toolSetRoutes(app: FastifyInstance): Promise<void> {
  const { redis, config } = app.container;
  const toolSets = new ToolSetsRepo(app.container.pool);

  /** Keys that name a changed set carry its old contents in every replica's cache: they forget them. */
  const forgetKeys = async () => {
    app.container.api!.auth.clear();
    await KeyAuthenticator.broadcast(redis, config.REDIS_PREFIX);
  };

  const manager = async (req: Parameters<typeof app.authenticate>[0], reply: Parameters<typeof app.authenticate>[1], action: string): Promise<KeyCaller> => {
    const caller = await app.authenticate(req, reply);
    requireKeyOwner(caller, action);
    return caller;
  };

  app.post(
    '/toolsets',
    {
      schema: {
        operationId: 'createToolSet',
        tags: ['Keys'],
        summary: 'Create a named tool set (tools and/or families)',
        description:
          `A set narrows /mcp to its tools (\`?set=<name>\`) and, given to a key (PUT /keys/{key_id}/tool_set, or \`tool_set\` on POST /subkeys/create), ` +
          `limits what that key may call on every surface. At most ${MAX_TOOL_SETS} sets per account and ${MAX_SET_TOOLS} tools per set; ` +
          `an unknown tool or family: 400; a name the account already uses: 409 tool_set_exists. ${MANAGER}`,
        body: CreateToolSet,
        bodyExamples: {
          research: { summary: 'Web research plus compute', value: { name: 'research', families: ['web'], tools: ['compute'] } },
          core: { summary: 'Just the core tools', value: { name: 'core-only', families: ['core'] } },
        },
        response: { '201': ok(ToolSetSchema, 'The new tool set.', { headers: RATE_LIMIT }), ...errors(['400', '403', '409', '413', '415']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await manager(req, reply, 'manage tool sets');
      const body = input<typeof CreateToolSet>(req, 'body', 'Tool set is invalid');
      const created = await toolSets.create(caller.accountId, body.name, definition(body));
      if (created === 'exists') throw new AppError('tool_set_exists', `This account already has a tool set named ${body.name}`, { name: body.name });
      if (created === 'full') {
        throw new AppError('invalid_input', `This account already has ${MAX_TOOL_SETS} tool sets, the most it may keep: delete one first`, {
          issues: [{ path: ['name'], message: `at most ${MAX_TOOL_SETS} tool sets per account` }],
        });
      }
      return reply.status(201).header('location', `/toolsets/${created.name}`).send(view(created));
    },
  );

  app.get(
    '/toolsets',
    {
      schema: {
        operationId: 'listToolSets',
        tags: ['Keys'],
        summary: "The account's tool sets",
        description: MANAGER,
        response: { '200': ok(ToolSetListSchema, "The account's tool sets, by name.", { headers: RATE_LIMIT }), ...errors(['403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await manager(req, reply, 'list tool sets');
      return { tool_sets: (await toolSets.list(caller.accountId)).map(view) };
    },
  );

  app.get(
    '/toolsets/:name',
    {
      schema: {
        operationId: 'getToolSet',
        tags: ['Keys'],
        summary: 'One tool set, with the tools it stands for now and the keys that use it',
        description: `No set of that name: 404. ${MANAGER}`,
        params: NameParams,
        response: { '200': ok(ToolSetSchema, 'The tool set.', { headers: RATE_LIMIT }), ...errors(['403', '404']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await manager(req, reply, 'read tool sets');
      const { name } = input<typeof NameParams>(req, 'params');
      const row = await toolSets.get(caller.accountId, name);
      if (!row) throw notFound(name);
      return view(row);
    },
  );

  app.put(
    '/toolsets/:name',
    {
      schema: {
        operationId: 'replaceToolSet',
        tags: ['Keys'],
        summary: "Replace a tool set's tools and families",
        description:
          'Keys that have it as their default set call by its new contents at once, on every replica. ' +
          `No set of that name: 404 (create it with POST /toolsets). ${MANAGER}`,
        params: NameParams,
        body: ReplaceToolSet,
        bodyExamples: { narrower: { summary: 'Only two tools now', value: { tools: ['compute', 'page_fetch'] } } },
        response: { '200': ok(ToolSetSchema, 'The tool set as it is now.', { headers: RATE_LIMIT }), ...errors(['400', '403', '404', '413', '415']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await manager(req, reply, 'manage tool sets');
      const { name } = input<typeof NameParams>(req, 'params');
      const body = input<typeof ReplaceToolSet>(req, 'body', 'Tool set is invalid');
      const row = await toolSets.replace(caller.accountId, name, definition(body));
      if (!row) throw notFound(name);
      if (row.key_ids.length) await forgetKeys();
      return view(row);
    },
  );

  app.delete(
    '/toolsets/:name',
    {
      schema: {
        operationId: 'deleteToolSet',
        tags: ['Keys'],
        summary: 'Delete a tool set no live key uses',
        description:
          'A set that live keys have as their default is not deleted: 409 tool_set_in_use names them (`key_ids`); give them another set or none ' +
          `(PUT /keys/{key_id}/tool_set) or revoke them first, so no key is left naming nothing. No set of that name: 404. ${MANAGER}`,
        params: NameParams,
        response: { '200': ok(DeletedSchema, 'Deleted.', { headers: RATE_LIMIT }), ...errors(['403', '404', '409']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await manager(req, reply, 'manage tool sets');
      const { name } = input<typeof NameParams>(req, 'params');
      const out = await toolSets.delete(caller.accountId, name);
      if (!out) throw notFound(name);
      if ('in_use' in out) {
        throw new AppError('tool_set_in_use', `Tool set ${name} is the default set of ${out.in_use.length} live key(s): give them another set or none first`, {
          name,
          key_ids: out.in_use,
        });
      }
      return { name, deleted: true };
    },
  );

  app.put(
    '/keys/:key_id/tool_set',
    {
      schema: {
        operationId: 'setKeyToolSet',
        tags: ['Keys'],
        summary: "Give a key of the account a default tool set (or none): it then calls only the set's tools",
        description:
          'Enforced at call time on every surface (POST /tools/{name}, chains and parallels, /mcp, the chat API): another tool is 403 tool_not_allowed, ' +
          "uncharged; /mcp lists only the set's tools. With a sub-key's allowed_tools, a tool must be in both. Any live key of the account, " +
          'the production key itself included (it still manages everything). A rotation keeps the set. A key of another account: 404; revoked or expired: ' +
          `409 key_not_active; an unknown set: 400. ${MANAGER}`,
        params: KeyIdParams,
        body: SetKeyToolSet,
        bodyExamples: {
          set: { summary: 'Only the tools of the set "research"', value: { tool_set: 'research' } },
          none: { summary: 'No default set', value: { tool_set: null } },
        },
        response: { '200': ok(KeyToolSetSchema, "The key's default set now.", { headers: RATE_LIMIT }), ...errors(['400', '403', '404', '409', '413', '415']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await manager(req, reply, 'set tool sets of keys');
      const { key_id: keyId } = input<typeof KeyIdParams>(req, 'params', 'Key id is invalid');
      const { tool_set: name } = input<typeof SetKeyToolSet>(req, 'body', 'Tool set is invalid');
      const out = await toolSets.setKeyToolSet(caller.accountId, keyId, name);
      if (!out.ok) {
        if (out.state === 'no_key') throw new AppError('not_found', `No key ${keyId} on this account`);
        if (out.state === 'key_not_active') throw new AppError('key_not_active', `Key ${keyId} is revoked or expired`, { state: 'inactive' });
        throw new AppError('invalid_input', `No tool set named ${name} on this account`, { issues: [{ path: ['tool_set'], message: 'unknown tool set' }] });
      }
      await forgetKeys();
      return { key_id: out.key_id, tool_set: out.tool_set };
    },
  );
}
