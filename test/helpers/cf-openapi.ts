import { readFileSync } from 'node:fs';
import { isIPv4, isIPv6 } from 'node:net';
import { fileURLToPath } from 'node:url';

/**
 * Checks requests recorded by the fake Cloudflare against Cloudflare's own API description
 * (test/fixtures/cloudflare-openapi-2024-08-06.subset.json: the operations the edge tools call and
 * the components they reach, cut unedited from the published file by scripts/cf-openapi-subset.ts;
 * its license beside it): the path must match a template, the
 * method must exist there, path and query parameters must be declared (and fit their schemas), and
 * the JSON body must satisfy the request schema (types, enums, patterns, formats, required fields,
 * no undeclared properties). Two endpoints are newer than that file and are checked against
 * Cloudflare's documented shapes instead: POST /zones/{id}/dns_records/batch and POST /graphql.
 *
 * Where the 2024-08-06 file contradicts the live API in a way that would reject correct requests,
 * ERRATA below patches it, each with its reason and source. Nothing else is relaxed.
 */

const SPEC_PATH = fileURLToPath(new URL('../fixtures/cloudflare-openapi-2024-08-06.subset.json', import.meta.url));
/** Appended to "not found" problems: the subset lacks what a tool does not call yet, which is a finding, never a pass. */
const SUBSET_NOTE =
  'subset (test/fixtures/cloudflare-openapi-2024-08-06.subset.json; if a tool calls it, add it to scripts/cf-openapi-subset.ts and regenerate)';

type Schema = Record<string, unknown>;
interface Spec {
  paths: Record<string, Record<string, Operation>>;
  /** Templates of the full file that the subset leaves out but a request for a kept one could resemble. */
  'x-tollgate-subset'?: { left_out_paths?: string[] };
  components: { schemas: Record<string, Schema>; parameters: Record<string, Parameter>; requestBodies?: Record<string, unknown> };
}
interface Parameter {
  name: string;
  in: 'path' | 'query' | 'header';
  required?: boolean;
  schema?: Schema;
  $ref?: string;
}
interface Operation {
  parameters?: Parameter[];
  requestBody?: { required?: boolean; content?: Record<string, { schema?: Schema; encoding?: Record<string, { contentType?: string }> }>; $ref?: string };
}

let spec: Spec | undefined;
function load(): Spec {
  spec ??= JSON.parse(readFileSync(SPEC_PATH, 'utf8')) as Spec;
  return spec;
}

/** Page-rule action ids and values as the API reference documents them (https://developers.cloudflare.com/api/resources/page_rules/). */
const onOff = { type: 'string', enum: ['on', 'off'] };
const pageRuleActions: Schema[] = [
  {
    type: 'object',
    required: ['id', 'value'],
    properties: {
      id: { enum: ['forward_url'] },
      value: { type: 'object', required: ['url'], properties: { url: { type: 'string' }, status_code: { type: 'integer', enum: [301, 302] } } },
    },
  },
  ...['always_use_https', 'disable_performance', 'disable_apps', 'disable_zaraz'].map((id) => ({
    type: 'object',
    required: ['id'],
    properties: { id: { enum: [id] } },
  })),
  {
    type: 'object',
    required: ['id', 'value'],
    properties: { id: { enum: ['cache_level'] }, value: { type: 'string', enum: ['bypass', 'basic', 'simplified', 'aggressive', 'cache_everything'] } },
  },
  ...['edge_cache_ttl', 'browser_cache_ttl'].map((id) => ({
    type: 'object',
    required: ['id', 'value'],
    properties: { id: { enum: [id] }, value: { type: 'integer', minimum: 0 } },
  })),
  {
    type: 'object',
    required: ['id', 'value'],
    properties: { id: { enum: ['ssl'] }, value: { type: 'string', enum: ['off', 'flexible', 'full', 'strict', 'origin_pull'] } },
  },
  {
    type: 'object',
    required: ['id', 'value'],
    properties: { id: { enum: ['security_level'] }, value: { type: 'string', enum: ['off', 'essentially_off', 'low', 'medium', 'high', 'under_attack'] } },
  },
  ...[
    'automatic_https_rewrites',
    'browser_check',
    'email_obfuscation',
    'rocket_loader',
    'cache_deception_armor',
    'explicit_cache_control',
    'ip_geolocation',
    'opportunistic_encryption',
    'origin_error_page_pass_thru',
    'sort_query_string_for_cache',
    'true_client_ip_header',
    'waf',
    'cache_by_device_type',
    'respect_strong_etag',
    'response_buffering',
    'server_side_exclude',
  ].map((id) => ({ type: 'object', required: ['id', 'value'], properties: { id: { enum: [id] }, value: onOff } })),
];

/**
 * Corrections to the 2024-08-06 description, by component schema name.
 * - dns-records_dns-record: its top-level `required` lists id, proxiable, created_on and
 *   modified_on, which the server assigns (they are in every response, never in a create). The
 *   per-type branches keep their own required lists (type, name, content/data, MX priority).
 * - rulesets_RuleAction: its pattern ^[a-z]+$ rejects the file's own action names that contain an
 *   underscore (set_cache_settings, managed_challenge, js_challenge in the rules' discriminator
 *   mapping); the pattern becomes ^[a-z_]+$.
 * - rulesets_SetCacheSettingsRule: edge_ttl lists mode, default and status_code_ttl as required,
 *   yet the file's own example for edge_ttl (`{status_code_ttl: [...], mode: "respect_origin"}`)
 *   has no default, and default only means something with override_origin. As for browser_ttl,
 *   only mode is required.
 * - zones_actions: the file describes only `{name: "forward_url", value: {type, url}}` while its
 *   own example, the live API and the current reference use `{id, value}` for all page-rule
 *   actions (forward_url's value being `{url, status_code}`).
 */
const ERRATA: Record<string, (s: Schema) => Schema> = {
  'dns-records_dns-record': (s) => {
    const { required: _serverAssigned, ...rest } = s;
    return rest;
  },
  rulesets_RuleAction: (s) => ({ ...s, pattern: '^[a-z_]+$' }),
  rulesets_SetCacheSettingsRule: (s) => {
    const copy = structuredClone(s) as { allOf: Array<{ properties?: Record<string, Schema> }> };
    const params = copy.allOf[1]?.properties?.action_parameters as { properties?: Record<string, Schema> } | undefined;
    if (params?.properties?.edge_ttl) params.properties.edge_ttl = { ...params.properties.edge_ttl, required: ['mode'] };
    return copy as unknown as Schema;
  },
  zones_actions: (s) => ({ ...s, items: { oneOf: pageRuleActions } }),
};

/**
 * Corrections by operation. PATCH /zones/{zone_id}/settings/{setting_id}: the file reuses the
 * setting object `{id, value}` as the body, but the setting id is the path parameter and the API
 * takes `{value}` (current reference: body `{value}` or `{enabled}`,
 * https://developers.cloudflare.com/api/resources/zones/subresources/settings/methods/edit/).
 * The body is therefore checked as `{id: <setting_id>, ...body}`, which keeps the per-setting
 * value enums.
 */
function bodyForCheck(template: string, method: string, pathParams: Record<string, string>, body: unknown): unknown {
  if (template === '/zones/{zone_id}/settings/{setting_id}' && method === 'patch' && body && typeof body === 'object') {
    if ('id' in body) return body; // sending id is the file's shape; check it as is
    return { id: pathParams.setting_id, ...(body as object) };
  }
  return body;
}

export interface RecordedRequest {
  method: string;
  /** Path below the API base, e.g. /zones/abc/dns_records. */
  path: string;
  query: Record<string, string>;
  headers: Record<string, string>;
  /** Parsed JSON body, or the multipart parts, or undefined. */
  body: unknown;
  multipart?: Array<{ name: string; filename?: string; type: string; text: string }>;
}

function resolveRef(ref: string): { schema: Schema; name: string } {
  const parts = ref.replace(/^#\//, '').split('/');
  let node: unknown = load();
  for (const p of parts) node = (node as Record<string, unknown> | undefined)?.[p];
  if (node === undefined) throw new Error(`${ref} is not in the API description ${SUBSET_NOTE}`);
  const name = parts[parts.length - 1]!;
  const schema = node as Schema;
  return { schema: ERRATA[name] ? ERRATA[name](schema) : schema, name };
}

function deref(s: Schema | undefined): Schema {
  let cur: Schema = s ?? {};
  for (let i = 0; i < 20 && typeof cur.$ref === 'string'; i++) cur = resolveRef(cur.$ref).schema;
  return cur;
}

function isReadOnly(s: Schema | undefined, depth = 0): boolean {
  if (!s || depth > 10) return false;
  const d = deref(s);
  if (d.readOnly === true) return true;
  return Array.isArray(d.allOf) && (d.allOf as Schema[]).some((x) => isReadOnly(x, depth + 1));
}

/** Every property schema a composed schema declares for a name (own, allOf, and each alternative). */
function propertySchemas(s: Schema, name: string, depth = 0, out: Schema[] = []): Schema[] {
  if (depth > 12) return out;
  const d = deref(s);
  const props = d.properties as Record<string, Schema> | undefined;
  if (props && props[name]) out.push(props[name]!);
  for (const k of ['allOf', 'oneOf', 'anyOf'] as const) for (const x of (d[k] as Schema[] | undefined) ?? []) propertySchemas(x, name, depth + 1, out);
  return out;
}

/** Property names declared anywhere in a composed schema; null when the object is open. */
function declaredProperties(s: Schema, depth = 0): Set<string> | null {
  if (depth > 12) return new Set();
  const d = deref(s);
  if (d.additionalProperties !== undefined && d.additionalProperties !== false) return null;
  const out = new Set(Object.keys((d.properties as object | undefined) ?? {}));
  let open = !d.properties && !d.allOf && !d.oneOf && !d.anyOf;
  for (const k of ['allOf', 'oneOf', 'anyOf'] as const) {
    for (const x of (d[k] as Schema[] | undefined) ?? []) {
      const sub = declaredProperties(x, depth + 1);
      if (sub === null) return null;
      sub.forEach((n) => out.add(n));
      if (sub.size) open = false;
    }
  }
  return open && out.size === 0 ? null : out;
}

function typeOk(type: unknown, v: unknown): boolean {
  switch (type) {
    case 'object':
      return typeof v === 'object' && v !== null && !Array.isArray(v);
    case 'array':
      return Array.isArray(v);
    case 'string':
      return typeof v === 'string';
    case 'integer':
      return typeof v === 'number' && Number.isInteger(v);
    case 'number':
      return typeof v === 'number' && Number.isFinite(v);
    case 'boolean':
      return typeof v === 'boolean';
    default:
      return true;
  }
}

const HOSTNAME_RE = /^(?=.{1,253}$)([a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?)(\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?)*\.?$/i;

/** Problems of a value against a schema, each prefixed with its JSON path. Request semantics: readOnly fields are not required. */
export function validate(schema: Schema, value: unknown, at = '$', depth = 0, composing = false): string[] {
  if (depth > 40) return [];
  const s = deref(schema);
  if (value === null && s.nullable === true) return [];
  const out: string[] = [];

  // allOf members describe parts of the same object, so undeclared fields are judged on the whole.
  for (const sub of (s.allOf as Schema[] | undefined) ?? []) out.push(...validate(sub, value, at, depth + 1, true));

  const alternatives = (s.oneOf ?? s.anyOf) as Schema[] | undefined;
  if (alternatives?.length) {
    const disc = s.discriminator as { propertyName: string; mapping?: Record<string, string> } | undefined;
    const tag = disc && value && typeof value === 'object' ? (value as Record<string, unknown>)[disc.propertyName] : undefined;
    if (disc?.mapping && typeof tag === 'string') {
      const ref = disc.mapping[tag];
      if (!ref) out.push(`${at}.${disc.propertyName}: '${tag}' is none of ${Object.keys(disc.mapping).join(', ')}`);
      else out.push(...validate({ $ref: ref }, value, at, depth + 1));
    } else {
      const results = alternatives.map((alt) => validate(alt, value, at, depth + 1));
      if (!results.some((r) => r.length === 0)) {
        // The closest alternative is one whose constants (type: "MX"...) fit, with the fewest problems.
        const fitting = results.filter((r) => !r.some((p) => p.includes('is not one of')));
        const best = (fitting.length ? fitting : results).reduce((a, b) => (b.length < a.length ? b : a));
        out.push(`${at}: matches none of ${alternatives.length} alternatives; closest: ${best.join('; ')}`);
      }
    }
  }

  if (s.type && !typeOk(s.type, value)) {
    out.push(`${at}: expected ${String(s.type)}, got ${Array.isArray(value) ? 'array' : value === null ? 'null' : typeof value}`);
    return out;
  }
  if (Array.isArray(s.enum) && !s.enum.some((e) => e === value)) out.push(`${at}: ${JSON.stringify(value)} is not one of ${JSON.stringify(s.enum)}`);

  if (typeof value === 'string') {
    if (typeof s.maxLength === 'number' && value.length > s.maxLength) out.push(`${at}: longer than ${s.maxLength}`);
    if (typeof s.minLength === 'number' && value.length < s.minLength) out.push(`${at}: shorter than ${s.minLength}`);
    if (typeof s.pattern === 'string') {
      let re: RegExp | null = null;
      try {
        re = new RegExp(s.pattern);
      } catch {
        re = null; // a pattern JavaScript cannot compile is not checked
      }
      if (re && !re.test(value)) out.push(`${at}: '${value}' does not match ${s.pattern}`);
    }
    if (s.format === 'ipv4' && !isIPv4(value)) out.push(`${at}: '${value}' is not an IPv4 address`);
    if (s.format === 'ipv6' && !isIPv6(value)) out.push(`${at}: '${value}' is not an IPv6 address`);
    if (s.format === 'hostname' && !HOSTNAME_RE.test(value)) out.push(`${at}: '${value}' is not a host name`);
  }
  if (typeof value === 'number') {
    if (typeof s.minimum === 'number' && value < s.minimum) out.push(`${at}: below ${s.minimum}`);
    if (typeof s.maximum === 'number' && value > s.maximum) out.push(`${at}: above ${s.maximum}`);
  }
  if (Array.isArray(value)) {
    if (typeof s.minItems === 'number' && value.length < s.minItems) out.push(`${at}: fewer than ${s.minItems} items`);
    if (typeof s.maxItems === 'number' && value.length > s.maxItems) out.push(`${at}: more than ${s.maxItems} items`);
    if (s.items) value.forEach((v, i) => out.push(...validate(s.items as Schema, v, `${at}[${i}]`, depth + 1)));
  }
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    const obj = value as Record<string, unknown>;
    for (const r of (s.required as string[] | undefined) ?? []) {
      if (obj[r] !== undefined) continue;
      const defs = propertySchemas(s, r);
      if (defs.some((d) => isReadOnly(d))) continue; // server-assigned: only in responses
      out.push(`${at}: missing required field '${r}'`);
    }
    const props = (s.properties as Record<string, Schema> | undefined) ?? {};
    for (const [k, v] of Object.entries(obj)) if (props[k]) out.push(...validate(props[k]!, v, `${at}.${k}`, depth + 1));
    if (s.additionalProperties && typeof s.additionalProperties === 'object') {
      for (const [k, v] of Object.entries(obj)) if (!props[k]) out.push(...validate(s.additionalProperties as Schema, v, `${at}.${k}`, depth + 1));
    }
    // Undeclared fields, judged against everything the (composed) schema declares for this object.
    if (!composing) {
      const declared = declaredProperties(s);
      if (declared && declared.size) for (const k of Object.keys(obj)) if (!declared.has(k)) out.push(`${at}: field '${k}' is not in the API description`);
    }
  }
  return [...new Set(out)];
}

interface Match {
  template: string;
  params: Record<string, string>;
  /** null: a template of the full file that the subset leaves out. */
  item: Record<string, Operation> | null;
}

function matchPath(path: string): Match | null {
  const segs = path.split('/').filter(Boolean);
  let best: (Match & { literal: number }) | null = null;
  const leftOut = (load()['x-tollgate-subset']?.left_out_paths ?? []).map((t) => [t, null] as const);
  for (const [template, item] of [...Object.entries(load().paths), ...leftOut]) {
    const t = template.split('/').filter(Boolean);
    if (t.length !== segs.length) continue;
    const params: Record<string, string> = {};
    let literal = 0;
    let ok = true;
    for (let i = 0; i < t.length && ok; i++) {
      const m = /^\{(.+)\}$/.exec(t[i]!);
      if (m) params[m[1]!] = decodeURIComponent(segs[i]!);
      else if (t[i] === segs[i]) literal++;
      else ok = false;
    }
    if (ok && (!best || literal > best.literal)) best = { template, params, item, literal };
  }
  return best;
}

function parameter(p: Parameter): Parameter {
  return p.$ref ? (resolveRef(p.$ref).schema as unknown as Parameter) : p;
}

function coerce(raw: string, schema: Schema): unknown {
  const s = deref(schema);
  if (s.type === 'integer' || s.type === 'number') return Number(raw);
  if (s.type === 'boolean') return raw === 'true' ? true : raw === 'false' ? false : raw;
  return raw;
}

/** Every problem with one recorded request; an empty list means it fits the description. */
export function checkRequest(req: RecordedRequest): string[] {
  const where = `${req.method} ${req.path}`;
  if (req.path === '/graphql') return checkGraphql(req).map((p) => `${where}: ${p}`);
  if (/^\/zones\/[^/]+\/dns_records\/batch$/.test(req.path)) return checkBatch(req).map((p) => `${where}: ${p}`);

  const match = matchPath(req.path);
  if (!match) return [`${where}: no such path in the API description ${SUBSET_NOTE}`];
  if (!match.item) return [`${where}: ${match.template} is left out of the API description ${SUBSET_NOTE}`];
  const method = req.method.toLowerCase();
  const op = match.item[method];
  if (!op)
    return [
      `${where}: ${match.template} has no ${req.method} (only ${Object.keys(match.item)
        .filter((k) => k !== 'parameters')
        .join(', ')}) in the API description ${SUBSET_NOTE}`,
    ];
  const problems: string[] = [];

  const params = [...((match.item.parameters as unknown as Parameter[] | undefined) ?? []), ...(op.parameters ?? [])].map(parameter);
  for (const p of params.filter((x) => x.in === 'path')) {
    const v = match.params[p.name];
    if (v === undefined) problems.push(`path parameter ${p.name} missing`);
    else if (p.schema) problems.push(...validate(p.schema, v, `path.${p.name}`));
  }
  const declaredQuery = new Map(params.filter((x) => x.in === 'query').map((x) => [x.name, x]));
  for (const [k, v] of Object.entries(req.query)) {
    const p = declaredQuery.get(k);
    if (!p) problems.push(`query parameter '${k}' is not declared for ${match.template}`);
    else if (p.schema) problems.push(...validate(p.schema, coerce(v, p.schema), `query.${k}`));
  }
  for (const p of declaredQuery.values()) if (p.required && req.query[p.name] === undefined) problems.push(`query parameter ${p.name} is required`);

  const rb = op.requestBody?.$ref ? (resolveRef(op.requestBody.$ref).schema as Operation['requestBody']) : op.requestBody;
  const content = rb?.content ?? {};
  const jsonSchema = content['application/json']?.schema;
  const hasBody = req.body !== undefined || req.multipart !== undefined;
  if (!hasBody) {
    // The file marks an empty `{}` body "required" on several DELETEs; the API needs none.
    const demanding = jsonSchema && Object.keys(jsonSchema).length > 0;
    if (rb?.required && (demanding || content['multipart/form-data'])) problems.push('a request body is required');
  } else if (req.multipart) {
    problems.push(...checkMultipart(req, content['multipart/form-data']));
  } else if (!rb) {
    problems.push(`${match.template} takes no request body`);
  } else if (!content['application/json']) {
    problems.push(`${match.template} does not take JSON (it takes ${Object.keys(content).join(', ')})`);
  } else if (jsonSchema && Object.keys(jsonSchema).length) {
    problems.push(...validate(jsonSchema, bodyForCheck(match.template, method, match.params, req.body), 'body'));
  }
  return problems.map((p) => `${where}: ${p}`);
}

function checkMultipart(req: RecordedRequest, desc: { schema?: Schema; encoding?: Record<string, { contentType?: string }> } | undefined): string[] {
  if (!desc) return ['multipart/form-data is not accepted here'];
  const problems: string[] = [];
  const parts = req.multipart ?? [];
  const meta = parts.find((p) => p.name === 'metadata');
  if (!meta) return ['the multipart body has no metadata part'];
  let metadata: unknown;
  try {
    metadata = JSON.parse(meta.text);
  } catch {
    return ['the metadata part is not JSON'];
  }
  const schema = deref(desc.schema);
  const alternatives = (schema.oneOf as Schema[] | undefined) ?? [schema];
  const metaSchema = alternatives.map((a) => (deref(a).properties as Record<string, Schema> | undefined)?.metadata).find(Boolean);
  if (metaSchema) problems.push(...validate(metaSchema, metadata, 'metadata'));
  const main = (metadata as { main_module?: string }).main_module;
  if (!main) problems.push('metadata.main_module is missing (module workers name their entry module)');
  const module = parts.find((p) => p.name === main);
  if (main && !module) problems.push(`no part named '${main}' (metadata.main_module)`);
  const allowed = (desc.encoding?.['<any part name>']?.contentType ?? '').split(',').map((s) => s.trim());
  for (const p of parts.filter((x) => x.name !== 'metadata')) {
    const type = p.type.split(';')[0]!.trim();
    if (!allowed.includes(type)) problems.push(`part '${p.name}' has content type ${type}, not one of ${allowed.join(', ')}`);
  }
  if (module && module.type.split(';')[0] !== 'application/javascript+module') problems.push(`the main module must be sent as application/javascript+module`);
  return problems;
}

// ---------------------------------------------------------------------------------------------
// POST /zones/{zone_id}/dns_records/batch, documented at
// https://developers.cloudflare.com/api/resources/dns/subresources/records/methods/batch/ :
// body {deletes?: [{id}], patches?: [{id, ...record fields}], puts?: [{id, ...record}],
// posts?: [record]}; executed as deletes, patches, puts, posts; at most 200 changes on Free plans.
// Records are checked with the file's own DNS record schemas.

const BATCH_KEYS = ['deletes', 'patches', 'puts', 'posts'];
const RECORD_REF = '#/components/schemas/dns-records_dns-record';

function checkBatch(req: RecordedRequest): string[] {
  if (req.method !== 'POST') return ['the batch endpoint takes POST'];
  const body = req.body as Record<string, unknown> | undefined;
  if (!body || typeof body !== 'object' || Array.isArray(body)) return ['body must be an object'];
  const problems: string[] = [];
  for (const k of Object.keys(body)) if (!BATCH_KEYS.includes(k)) problems.push(`unknown batch field '${k}'`);
  let total = 0;
  for (const k of BATCH_KEYS) {
    const list = body[k];
    if (list === undefined) continue;
    if (!Array.isArray(list)) {
      problems.push(`${k} must be an array`);
      continue;
    }
    total += list.length;
    list.forEach((item: unknown, i) => {
      const at = `body.${k}[${i}]`;
      if (!item || typeof item !== 'object') return problems.push(`${at}: must be an object`);
      const rec = item as Record<string, unknown>;
      if (k !== 'posts' && (typeof rec.id !== 'string' || !/^[0-9a-f]{32}$/.test(rec.id))) problems.push(`${at}: id must be a 32-character record id`);
      if (k === 'deletes') {
        for (const f of Object.keys(rec)) if (f !== 'id') problems.push(`${at}: deletes take only id, not '${f}'`);
        return;
      }
      if (k === 'posts' && 'id' in rec) problems.push(`${at}: posts must not carry an id`);
      const { id: _id, ...fields } = rec;
      if (k === 'patches') {
        // A patch names the record's type to check its fields against; the fields themselves may be partial.
        if (typeof fields.type !== 'string') return problems.push(`${at}: give the record type so its fields can be checked`);
        const branch = recordBranch(fields.type);
        if (!branch) return problems.push(`${at}: unknown record type ${fields.type}`);
        const { required: _req, ...partial } = deref(branch);
        problems.push(...validate({ ...partial }, fields, at));
        return;
      }
      problems.push(...validate({ $ref: RECORD_REF }, fields, at));
    });
  }
  if (total === 0) problems.push('the batch is empty');
  if (total > 200) problems.push(`${total} changes exceed the 200 per batch allowed on every plan`);
  return problems;
}

function recordBranch(type: string): Schema | undefined {
  const all = deref({ $ref: RECORD_REF }).oneOf as Schema[];
  return all.find((b) => {
    const t = propertySchemas(b, 'type').map(deref);
    return t.some((x) => Array.isArray(x.enum) && x.enum.includes(type));
  });
}

// ---------------------------------------------------------------------------------------------
// POST /graphql: the GraphQL Analytics API (https://developers.cloudflare.com/analytics/graphql-api/).
// The body is {query, variables?, operationName?}; the query selects viewer.zones(filter:
// {zoneTag}) and, under it, datasets with limit and filter arguments and the fields the schema has.

export type GqlValue =
  | { kind: 'var'; name: string }
  | { kind: 'lit'; value: string | number | boolean | null }
  | { kind: 'enum'; value: string }
  | { kind: 'list'; items: GqlValue[] }
  | { kind: 'obj'; fields: Record<string, GqlValue> };

export interface GqlField {
  alias?: string;
  name: string;
  args: Record<string, GqlValue>;
  selections: GqlField[];
}

export interface GqlDocument {
  variables: Array<{ name: string; type: string }>;
  selections: GqlField[];
}

/** A small GraphQL query parser: enough for the Analytics API's queries (no fragments or directives). */
export function parseGraphql(src: string): GqlDocument {
  const tokens = src.match(/"(?:[^"\\]|\\.)*"|\.\.\.|-?\d+(?:\.\d+)?|[A-Za-z_][A-Za-z0-9_]*|[{}()[\]:$!=@,]|#[^\n]*|\S/g) ?? [];
  const toks = tokens.filter((t) => t !== ',' && !t.startsWith('#'));
  let i = 0;
  const peek = () => toks[i];
  const next = () => {
    const t = toks[i++];
    if (t === undefined) throw new Error('unexpected end of query');
    return t;
  };
  const expect = (t: string) => {
    const got = next();
    if (got !== t) throw new Error(`expected '${t}' but found '${got}'`);
  };
  const name = () => {
    const t = next();
    if (!/^[A-Za-z_]/.test(t)) throw new Error(`expected a name but found '${t}'`);
    return t;
  };

  const value = (): GqlValue => {
    const t = next();
    if (t === '$') return { kind: 'var', name: name() };
    if (t === '[') {
      const items: GqlValue[] = [];
      while (peek() !== ']') items.push(value());
      expect(']');
      return { kind: 'list', items };
    }
    if (t === '{') {
      const fields: Record<string, GqlValue> = {};
      while (peek() !== '}') {
        const k = name();
        expect(':');
        fields[k] = value();
      }
      expect('}');
      return { kind: 'obj', fields };
    }
    if (t.startsWith('"')) return { kind: 'lit', value: JSON.parse(t) as string };
    if (/^-?\d/.test(t)) return { kind: 'lit', value: Number(t) };
    if (t === 'true' || t === 'false') return { kind: 'lit', value: t === 'true' };
    if (t === 'null') return { kind: 'lit', value: null };
    if (/^[A-Za-z_]/.test(t)) return { kind: 'enum', value: t };
    throw new Error(`unexpected '${t}' in a value`);
  };

  const selectionSet = (): GqlField[] => {
    expect('{');
    const out: GqlField[] = [];
    while (peek() !== '}') {
      if (peek() === '...') throw new Error('fragments are not used by these queries');
      let n = name();
      let alias: string | undefined;
      if (peek() === ':') {
        next();
        alias = n;
        n = name();
      }
      const args: Record<string, GqlValue> = {};
      if (peek() === '(') {
        next();
        while (peek() !== ')') {
          const k = name();
          expect(':');
          args[k] = value();
        }
        expect(')');
      }
      const selections = peek() === '{' ? selectionSet() : [];
      out.push({ ...(alias ? { alias } : {}), name: n, args, selections });
    }
    expect('}');
    return out;
  };

  const variables: Array<{ name: string; type: string }> = [];
  if (peek() === 'query') {
    next();
    if (peek() !== '(' && peek() !== '{') name();
    if (peek() === '(') {
      next();
      while (peek() !== ')') {
        expect('$');
        const v = name();
        expect(':');
        let type = '';
        while (peek() !== ')' && peek() !== '$' && peek() !== '=') type += next();
        if (peek() === '=') {
          next();
          value();
        }
        variables.push({ name: v, type });
      }
      expect(')');
    }
  }
  const selections = selectionSet();
  if (i !== toks.length) throw new Error(`unexpected '${toks[i]}' after the query`);
  return { variables, selections };
}

/** Resolves a parsed argument against the request's variables. */
export function gqlValue(v: GqlValue, vars: Record<string, unknown>): unknown {
  switch (v.kind) {
    case 'var':
      return vars[v.name];
    case 'lit':
      return v.value;
    case 'enum':
      return v.value;
    case 'list':
      return v.items.map((x) => gqlValue(x, vars));
    case 'obj':
      return Object.fromEntries(Object.entries(v.fields).map(([k, x]) => [k, gqlValue(x, vars)]));
  }
}

type FieldTree = { [field: string]: FieldTree | true };
const sum1d: FieldTree = {
  bytes: true,
  cachedBytes: true,
  cachedRequests: true,
  requests: true,
  threats: true,
  pageViews: true,
  encryptedBytes: true,
  encryptedRequests: true,
  countryMap: { clientCountryName: true, requests: true, bytes: true, threats: true },
  responseStatusMap: { edgeResponseStatus: true, requests: true },
  contentTypeMap: { edgeResponseContentTypeName: true, requests: true, bytes: true },
  threatPathingMap: { threatPathingName: true, requests: true },
  browserMap: { uaBrowserFamily: true, pageViews: true },
  clientSSLMap: { clientSSLProtocol: true, requests: true },
  clientHTTPVersionMap: { clientHTTPProtocol: true, requests: true },
  ipClassMap: { ipType: true, requests: true },
};
const fwDimensions: FieldTree = {
  action: true,
  source: true,
  clientIP: true,
  clientCountryName: true,
  clientAsn: true,
  clientASNDescription: true,
  clientRequestHTTPHost: true,
  clientRequestPath: true,
  clientRequestHTTPMethodName: true,
  ruleId: true,
  userAgent: true,
  datetime: true,
  datetimeHour: true,
  datetimeFifteenMinutes: true,
  date: true,
};

/** Datasets under viewer.zones used by the suite, with the fields Cloudflare's schema gives them. */
export const GRAPHQL_DATASETS: Record<string, { filterKeys: string[]; fields: FieldTree }> = {
  httpRequests1dGroups: {
    filterKeys: ['date', 'date_geq', 'date_gt', 'date_leq', 'date_lt'],
    fields: { dimensions: { date: true }, sum: sum1d, uniq: { uniques: true } },
  },
  httpRequests1hGroups: {
    filterKeys: ['datetime', 'datetime_geq', 'datetime_gt', 'datetime_leq', 'datetime_lt'],
    fields: { dimensions: { datetime: true }, sum: sum1d, uniq: { uniques: true } },
  },
  httpRequestsAdaptiveGroups: {
    filterKeys: [
      'datetime_geq',
      'datetime_gt',
      'datetime_leq',
      'datetime_lt',
      'requestSource',
      'clientRequestHTTPHost',
      'clientCountryName',
      'edgeResponseStatus',
    ],
    fields: {
      count: true,
      dimensions: {
        date: true,
        datetime: true,
        datetimeHour: true,
        clientCountryName: true,
        clientRequestHTTPHost: true,
        clientRequestPath: true,
        edgeResponseStatus: true,
        coloCode: true,
        cacheStatus: true,
      },
      sum: { visits: true, edgeResponseBytes: true },
      avg: { sampleInterval: true },
    },
  },
  firewallEventsAdaptiveGroups: {
    filterKeys: [
      'datetime_geq',
      'datetime_gt',
      'datetime_leq',
      'datetime_lt',
      'action',
      'action_neq',
      'source',
      'clientIP',
      'clientCountryName',
      'ruleId',
      'clientRequestHTTPHost',
    ],
    fields: { count: true, dimensions: fwDimensions },
  },
};

function checkFields(fields: GqlField[], tree: FieldTree, at: string): string[] {
  const out: string[] = [];
  for (const f of fields) {
    const spec = tree[f.name];
    if (!spec) {
      out.push(`${at}.${f.name} is not a field of the schema`);
      continue;
    }
    if (spec === true && f.selections.length) out.push(`${at}.${f.name} is a scalar and takes no selection`);
    if (spec !== true) {
      if (!f.selections.length) out.push(`${at}.${f.name} needs a selection of subfields`);
      out.push(...checkFields(f.selections, spec, `${at}.${f.name}`));
    }
  }
  return out;
}

function usedVariables(v: GqlValue, out: Set<string>): Set<string> {
  if (v.kind === 'var') out.add(v.name);
  if (v.kind === 'list') v.items.forEach((x) => usedVariables(x, out));
  if (v.kind === 'obj') Object.values(v.fields).forEach((x) => usedVariables(x, out));
  return out;
}

function checkGraphql(req: RecordedRequest): string[] {
  if (req.method !== 'POST') return ['the GraphQL endpoint is queried with POST'];
  const body = req.body as { query?: unknown; variables?: unknown; operationName?: unknown } | undefined;
  if (!body || typeof body.query !== 'string') return ['body must be {query: string, variables?: object}'];
  const extra = Object.keys(body).filter((k) => !['query', 'variables', 'operationName'].includes(k));
  const problems = extra.map((k) => `unknown body field '${k}'`);
  const vars = (body.variables ?? {}) as Record<string, unknown>;
  if (typeof vars !== 'object' || Array.isArray(vars)) return [...problems, 'variables must be an object'];
  let doc: GqlDocument;
  try {
    doc = parseGraphql(body.query);
  } catch (e) {
    return [...problems, `query does not parse: ${(e as Error).message}`];
  }
  const declared = new Set(doc.variables.map((v) => v.name));
  const used = new Set<string>();
  const walk = (fs: GqlField[]) => fs.forEach((f) => (Object.values(f.args).forEach((a) => usedVariables(a, used)), walk(f.selections)));
  walk(doc.selections);
  for (const u of used) {
    if (!declared.has(u)) problems.push(`variable $${u} is used but not declared`);
    else if (vars[u] === undefined) problems.push(`variable $${u} has no value`);
  }
  for (const d of declared) if (!used.has(d)) problems.push(`variable $${d} is declared but not used`);

  const viewer = doc.selections;
  if (viewer.length !== 1 || viewer[0]!.name !== 'viewer') return [...problems, 'the query must select viewer'];
  const zones = viewer[0]!.selections;
  if (zones.length !== 1 || zones[0]!.name !== 'zones') return [...problems, 'the suite queries viewer.zones'];
  const zoneFilter = gqlValue(zones[0]!.args.filter ?? { kind: 'lit', value: null }, vars) as { zoneTag?: unknown } | null;
  if (!zoneFilter || typeof zoneFilter.zoneTag !== 'string' || !/^[0-9a-f]{32}$/.test(zoneFilter.zoneTag)) {
    problems.push('zones needs filter: {zoneTag: <32-character zone id>}');
  }
  for (const ds of zones[0]!.selections) {
    const def = GRAPHQL_DATASETS[ds.name];
    if (!def) {
      problems.push(`viewer.zones.${ds.name} is not a dataset this check knows`);
      continue;
    }
    const limit = gqlValue(ds.args.limit ?? { kind: 'lit', value: null }, vars);
    if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > 10000) problems.push(`${ds.name} needs limit: 1..10000`);
    const filter = gqlValue(ds.args.filter ?? { kind: 'lit', value: null }, vars) as Record<string, unknown> | null;
    if (!filter || typeof filter !== 'object') problems.push(`${ds.name} needs a filter with its time range`);
    else {
      for (const k of Object.keys(filter)) if (!def.filterKeys.includes(k)) problems.push(`${ds.name} filter has no key ${k}`);
      if (!Object.keys(filter).some((k) => k.startsWith('date'))) problems.push(`${ds.name} filter needs a time range`);
    }
    for (const a of Object.keys(ds.args)) if (!['limit', 'filter', 'orderBy'].includes(a)) problems.push(`${ds.name} has no argument ${a}`);
    problems.push(...checkFields(ds.selections, def.fields, ds.alias ?? ds.name));
  }
  return problems;
}

/** Throws with every problem of every request; returns how many were checked. */
export function assertRequestsMatchSpec(reqs: RecordedRequest[]): number {
  const problems = reqs.flatMap(checkRequest);
  if (problems.length) throw new Error(`Requests that do not fit Cloudflare's API description:\n  ${problems.join('\n  ')}`);
  return reqs.length;
}
