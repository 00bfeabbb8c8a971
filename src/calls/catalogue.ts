import { zodToJsonSchema } from 'zod-to-json-schema';
import { serviceVersion, type Config } from '../config.js';
import { TOOLS, dollars, toolsByTier } from '../tools/index.js';
import { llmChatModels } from '../tools/llm/index.js';
import { PLANS, type AnyTool } from '../tools/types.js';
import { PROTOCOL_MODES } from './protocol.js';

/** The service's version, package.json's: the root document's `v`, MCP's serverInfo, the OpenAPI info. */
export const API_VERSION: string = serviceVersion();

/** Every route the service serves, as the root document lists them. Keep in step with src/faces. */
export const ENDPOINTS: Record<string, string> = {
  'GET /': 'This document',
  'GET /health': 'Health of Redis, Postgres and the workers per family (503 degraded when one is down or a family has no live worker)',
  'GET /docs': 'Interactive API reference (from /openapi.json)',
  'GET /docs/readme': 'The README as Markdown: full API documentation',
  'GET /client/tollgate-mcp.tgz': 'The stdio MCP client as an npm tarball (no key): npx -y <base>/client/tollgate-mcp.tgz, see npm',
  'GET /openapi.json': 'OpenAPI 3.1 description of every endpoint and tool',
  'GET /metrics': 'Prometheus metrics (METRICS_TOKEN as a bearer; 404 when the operator set none)',
  'GET /tools': 'Catalogue of every tool with its price',
  'GET /tools/{name}': "A tool's input JSON Schema, examples, price and tier",
  'POST /tools/{name}': 'Run a tool (JSON body = the tool input); Prefer: respond-async for a 202; Accept: text/event-stream for Server-Sent Events',
  'GET /jobs': "The key's recent calls, newest first (limit, cursor, since, tool, status)",
  'GET /jobs/{id}': 'Status and result of a call, chain or parallel request (same key only)',
  'DELETE /jobs/{id}':
    'Cancel a queued or running call, chain or parallel request (same key only): not charged unless it had already settled (then 409 job_finished)',
  'GET /jobs/{id}/events': 'Server-Sent Events of a job: stored events replayed, then live ones until its result (same key only; Last-Event-ID resumes)',
  'POST /': 'Root protocol: {chain, q}, {parallel, q}, {m, q} or {stream: true, m, q} (see protocol below)',
  'GET /balance': 'Credits, plan and this month\u2019s use',
  'GET /webhooks/secret':
    'The account\u2019s webhook signing secret (created on first use; production key only). Callback-Url on a call gets its outcome POSTed, signed, when it ends',
  'POST /webhooks/secret': 'Roll the webhook signing secret (production key only)',
  'PUT /alerts': "Spend alerts: percents of sub-keys' and grants' monthly caps and a low balance, sent once per threshold and period as signed webhook events",
  'GET /alerts': "The account's spend alerts and every event they sent (production key only)",
  'DELETE /alerts': "Remove the account's spend alerts",
  'POST /credits/topup': 'Buy credits with an x402 payment: 402 with the exact amount, then settled and credited once',
  'GET /subscribe': 'Plans and how to sign up, with a partner\u2019s attribution_code (HTML, or JSON on Accept: application/json)',
  'POST /signup': 'Create a free account and its key (SIGNUP_ENABLED; rate-limited per address)',
  'GET /v1/manifest': 'Tool tiers and prices, machine-readable',
  'GET /subkeys': "The account's sub-keys with this month's use (enterprise)",
  'POST /subkeys/create': 'Create a sub-key with a monthly limit and allowed tools (enterprise)',
  'DELETE /subkeys/{key_id}': 'Revoke a sub-key at once',
  'GET /usage':
    "A month's charges (UTC, ?month=YYYY-MM) by tool, key and day, its top-ups and balance moves, all from the ledger (a sub-key or sandbox key: its own lines only)",
  'GET /usage/entries': 'Ledger lines, newest first (limit, cursor, tool, key_id, since)',
  'GET /keys': "The account's keys without secrets (production key only)",
  'POST /keys/{key_id}/rotate':
    'Replace a key with a new one of the same type (shown once); the old one works KEY_ROTATION_GRACE_SECONDS more, for tool calls and its own jobs only',
  'DELETE /keys/{key_id}': 'Revoke a key of the account at once (a rotated key in its grace included); production key only',
  'PUT /keys/{key_id}/tool_set': "Give a key of the account a default tool set (or none): it then calls only the set's tools, on every surface",
  'GET /toolsets': "The account's tool sets (production key only); POST /toolsets creates one (tools and/or families)",
  'GET /toolsets/{name}': 'One tool set with the tools it stands for and the keys that use it; PUT replaces it, DELETE deletes it (409 while in use)',
  'POST /mcp':
    'Model Context Protocol (Streamable HTTP, stateless): tools/list shows what your key may call, tools/call runs and charges like POST /tools/{name}',
  'GET /v1/models': 'OpenAI-compatible model list: svc-genius, svc-hints, svc-roast (those your plan may call)',
  'GET /v1/models/{model}': 'One model (403 plan_required above your plan)',
  'POST /v1/chat/completions': 'OpenAI-compatible chat completions (stream: true for SSE); each svc-* model runs the tool of the same name at its price',
};

const schemaCache = new WeakMap<AnyTool, object>();

export function inputJsonSchema(tool: AnyTool): object {
  let s = schemaCache.get(tool);
  if (!s) {
    const { $schema: _drop, ...schema } = zodToJsonSchema(tool.input, { target: 'jsonSchema7', $refStrategy: 'none' }) as Record<string, unknown>;
    s = schema;
    schemaCache.set(tool, s);
  }
  return s;
}

const outputCache = new WeakMap<AnyTool, object>();

/** The result's JSON Schema (from the tool's `outputSchema`), or null for a tool that declares none. */
export function outputJsonSchema(tool: AnyTool): object | null {
  if (!tool.outputSchema) return null;
  let s = outputCache.get(tool);
  if (!s) {
    const { $schema: _drop, ...schema } = zodToJsonSchema(tool.outputSchema, { target: 'jsonSchema7', $refStrategy: 'none' }) as Record<string, unknown>;
    s = schema;
    outputCache.set(tool, s);
  }
  return s;
}

export function catalogueEntry(tool: AnyTool) {
  return {
    name: tool.name,
    cost: dollars(tool.priceCents),
    endpoint: `POST /tools/${tool.name}`,
    price_cents: tool.priceCents,
    tier: tool.tier,
    description: tool.description,
  };
}

let catalogueCache: ReturnType<typeof catalogueEntry>[] | undefined;
export function catalogue() {
  return (catalogueCache ??= TOOLS.map(catalogueEntry));
}

export function toolDetail(tool: AnyTool) {
  return {
    name: tool.name,
    description: tool.description,
    tier: tool.tier,
    family: tool.family,
    cost: dollars(tool.priceCents),
    price_cents: tool.priceCents,
    endpoint: `POST /tools/${tool.name}`,
    q_field: tool.qField,
    q_parse: tool.qParse ?? 'text',
    needs: tool.needs ?? [],
    progress: tool.progress ?? false,
    input_schema: inputJsonSchema(tool),
    examples: tool.examples,
    output: tool.output,
    ...(tool.outputSchema ? { output_schema: outputJsonSchema(tool) } : {}),
    ...(tool.limits ? { limits: { time_ms: tool.limits.timeMs ?? null, memory_mb: tool.limits.memoryMb ?? null } } : {}),
    side_effects: tool.sideEffects ?? false,
    needs_edge_token: tool.needsEdgeToken ?? false,
  };
}

export function rootDocument(base: string, config: Config) {
  const byTier = toolsByTier();
  const tools = Object.fromEntries(
    PLANS.map((plan) => [plan, Object.fromEntries(byTier[plan].map((t) => [t.name, { cost: dollars(t.priceCents), tier: t.tier }]))]),
  );
  return {
    _: new URL(base).host,
    v: API_VERSION,
    t: Math.floor(Date.now() / 1000),
    tools,
    total_tools: TOOLS.length,
    endpoints: ENDPOINTS,
    protocol: PROTOCOL_MODES,
    openai: { base_url: `${base}/v1`, models: [...llmChatModels.keys()] },
    docs: config.DOCS_URL ?? `${base}/docs`,
    // The stdio MCP relay (bin/tollgate-mcp.js), served as a tarball at GET /client/tollgate-mcp.tgz:
    // npx installs and runs it anywhere, given the key and this service's base URL.
    npm: `TOLLGATE_URL=${base} TOLLGATE_API_KEY=<your key> npx -y ${base}/client/tollgate-mcp.tgz`,
  };
}

export function manifest(base: string) {
  const byTier = toolsByTier();
  return {
    name: 'tollgate',
    version: API_VERSION,
    base_url: base,
    currency: 'USD',
    unit: 'cents',
    total_tools: TOOLS.length,
    tiers: Object.fromEntries(
      PLANS.map((plan) => [
        plan,
        byTier[plan].map((t) => ({
          name: t.name,
          cost: dollars(t.priceCents),
          price_cents: t.priceCents,
          family: t.family,
          endpoint: `POST /tools/${t.name}`,
        })),
      ]),
    ),
  };
}
