import { z } from 'zod';
import { CfClient, cfPath, withQuery, type PlannedWrite } from './cf-client.js';
import { accountId, applyWrites, orDryRun, resolveAccountId, defineEdgeTool } from './common.js';

const scriptName = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?$/, 'lower-case letters, digits, - and _ (not at the ends)')
  .describe('Worker (script) name, e.g. hello-api');

interface Script {
  id: string;
  created_on?: string;
  modified_on?: string;
  etag?: string;
  handlers?: string[];
  compatibility_date?: string;
  usage_model?: string;
  last_deployed_from?: string;
}

/** summary's shape, in output schemas. */
const WorkerOut = z.object({
  name: z.string(),
  created_on: z.string().nullable(),
  modified_on: z.string().nullable(),
  handlers: z.array(z.string()).describe('The events the script handles, e.g. fetch, scheduled'),
  compatibility_date: z.string().nullable(),
  last_deployed_from: z.string().nullable().describe('How it was last deployed, e.g. api, wrangler, dash'),
});
const accountOut = z.string().describe('The Cloudflare account id');

function summary(s: Script) {
  return {
    name: s.id,
    created_on: s.created_on ?? null,
    modified_on: s.modified_on ?? null,
    handlers: s.handlers ?? [],
    compatibility_date: s.compatibility_date ?? null,
    last_deployed_from: s.last_deployed_from ?? null,
  };
}

export const cfListWorkers = defineEdgeTool({
  name: 'cf_list_workers',
  description: 'Lists the Workers scripts of the Cloudflare account.',
  priceCents: 0,
  input: z.object({ account_id: accountId }),
  qField: 'account_id',
  output: '{account_id, workers: [{name, created_on, modified_on, handlers, compatibility_date}], count}',
  outputSchema: z.object({ account_id: accountOut, workers: z.array(WorkerOut), count: z.number().int().min(0) }),
  examples: [{}, { account_id: '01a7362d577a6c3019a474fd6f485823' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const account = await resolveAccountId(cf, input.account_id);
    const scripts = await cf.get<Script[]>(cfPath`/accounts/${account}/workers/scripts`);
    return { account_id: account, workers: scripts.map(summary), count: scripts.length };
  },
});

const MAIN_MODULE = 'worker.js';

export const cfDeployWorker = defineEdgeTool({
  name: 'cf_deploy_worker',
  description: 'Uploads and deploys an ES-module Worker (creates it or replaces its code), with plain-text variables.',
  priceCents: 5,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z.object({
    account_id: accountId,
    name: scriptName,
    script: z
      .string()
      .min(1)
      .max(900_000)
      .refine(
        (s) => /\bexport\s+(default\b|\{)/.test(s),
        'the script must be an ES module with an export default handler, e.g. export default { fetch(request) { ... } }',
      )
      .describe('The Worker source as an ES module: export default { async fetch(request, env) { ... } }'),
    compatibility_date: z
      .string()
      .regex(/^\d{4}-\d{2}-\d{2}$/, 'expected YYYY-MM-DD')
      .optional()
      .describe('Workers runtime compatibility date; defaults to today (UTC)'),
    compatibility_flags: z
      .array(z.string().regex(/^[a-z0-9_]+$/))
      .max(20)
      .optional()
      .describe('Runtime flags, e.g. ["nodejs_compat"]'),
    vars: z
      .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'variable names are identifiers'), z.string().max(5120))
      .optional()
      .describe('Plain-text environment variables, available as env.NAME (not for secrets)'),
  }),
  qField: 'script',
  output: '{account_id, worker: {name, modified_on, handlers, compatibility_date}, deployed: true} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(z.object({ account_id: accountOut, worker: WorkerOut, deployed: z.literal(true) })),
  examples: [
    {
      name: 'hello-api',
      script: "export default {\n  async fetch(request) {\n    return new Response('Hello from the edge');\n  },\n};\n",
      compatibility_date: '2024-09-23',
    },
    {
      name: 'greeter',
      script: 'export default { fetch(req, env) { return new Response(`Hi from ${env.REGION}`); } };',
      vars: { REGION: 'eu' },
    },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const account = await resolveAccountId(cf, input.account_id);
    const metadata = {
      main_module: MAIN_MODULE,
      compatibility_date: input.compatibility_date ?? new Date().toISOString().slice(0, 10),
      ...(input.compatibility_flags?.length ? { compatibility_flags: input.compatibility_flags } : {}),
      bindings: Object.entries(input.vars ?? {}).map(([name, text]) => ({ type: 'plain_text', name, text })),
    };
    const write: PlannedWrite = {
      method: 'PUT',
      path: cfPath`/accounts/${account}/workers/scripts/${input.name}`,
      multipart: [
        { name: 'metadata', contentType: 'application/json', content: JSON.stringify(metadata) },
        { name: MAIN_MODULE, filename: MAIN_MODULE, contentType: 'application/javascript+module', content: input.script },
      ],
    };
    await ctx.progress({ stage: 'uploading worker', done: 0, total: Buffer.byteLength(input.script), unit: 'bytes' });
    const applied = await applyWrites(cf, ctx, [write]);
    if ('dry' in applied) return applied.dry;
    const script = applied.results[0] as Script;
    return { account_id: account, worker: summary({ ...script, id: script.id ?? input.name }), deployed: true };
  },
});

export const cfDeleteWorker = defineEdgeTool({
  name: 'cf_delete_worker',
  description: 'Deletes a Worker script from the account.',
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z.object({
    account_id: accountId,
    name: scriptName,
    force: z.boolean().default(false).describe('Delete even if other Workers or Durable Objects are bound to it'),
  }),
  qField: 'name',
  output: '{account_id, deleted: name} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(z.object({ account_id: accountOut, deleted: z.string().describe('The name of the Worker deleted') })),
  examples: [{ name: 'hello-api' }, { name: 'old-worker', force: true }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const account = await resolveAccountId(cf, input.account_id);
    const path = withQuery(cfPath`/accounts/${account}/workers/scripts/${input.name}`, { force: input.force ? true : undefined });
    const applied = await applyWrites(cf, ctx, [{ method: 'DELETE', path }]);
    if ('dry' in applied) return applied.dry;
    return { account_id: account, deleted: input.name };
  },
});
