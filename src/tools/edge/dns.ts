import { z } from 'zod';
import { AppError } from '../../errors.js';
import { type ToolContext } from '../types.js';
import { CfClient, cfPath, type PlannedWrite } from './cf-client.js';
import { ZoneOut, applyWrites, fqdn, orDryRun, resolveZone, zoneOut, zoneRef, type Zone, defineEdgeTool } from './common.js';
import {
  RecordInput,
  RecordOut,
  recordAsInput,
  recordBody,
  recordFields,
  recordProblems,
  recordSummary,
  recordType,
  type BatchResult,
  type DnsRecord,
} from './dns-records.js';

const RECORD_ID = z.string().regex(/^[0-9a-f]{32}$/, 'expected a 32-character DNS record id');
const recordId = RECORD_ID.describe('DNS record id (32 hex characters), as cf_list_dns shows it');

/** The input fields that pick records: one by record_id, or those at a name (optionally of one type). */
const recordSelector = {
  zone: zoneRef,
  record_id: recordId.optional(),
  name: recordFields.name.optional(),
  type: recordType.optional(),
};
const selectsRecords = (v: { record_id?: string; name?: string }) => Boolean(v.record_id || v.name);
const selectorIssue = { message: 'give record_id, or name (and optionally type)', path: ['record_id'] };

async function selectRecords(cf: CfClient, zone: Zone, by: { record_id?: string; name?: string; type?: string }): Promise<DnsRecord[]> {
  if (by.record_id) return [await cf.get<DnsRecord>(cfPath`/zones/${zone.id}/dns_records/${by.record_id}`)];
  const query = { name: fqdn(by.name!, zone.name), type: by.type };
  const { items } = await cf.listAll<DnsRecord>(cfPath`/zones/${zone.id}/dns_records`, query, { what: 'DNS records' });
  return items;
}

const ListDnsOutput = z.object({
  zone: ZoneOut,
  records: z.array(RecordOut),
  count: z.number().int().min(0).describe('Records returned'),
  total: z.number().int().min(0).describe('Records matching, as Cloudflare counts them'),
  truncated: z.boolean().describe('More records match than limit allowed'),
});

export const cfListDns = defineEdgeTool({
  name: 'cf_list_dns',
  description: "Lists a zone's DNS records, optionally filtered by type, name or content (follows every page).",
  priceCents: 0,
  input: z.object({
    zone: zoneRef,
    type: recordType.optional(),
    name: recordFields.name.optional(),
    content: z.string().max(4096).optional().describe('Only records with exactly this content'),
    limit: z.number().int().min(1).max(5000).default(1000).describe('Most records to return'),
  }),
  qField: 'zone',
  output: '{zone: {id, name}, records: [{id, type, name, content, ttl, proxied, priority?}], count, total, truncated}',
  outputSchema: ListDnsOutput,
  examples: [{ zone: 'example.com' }, { zone: 'example.com', type: 'MX' }, { zone: 'example.com', name: 'www', type: 'A' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const query = { type: input.type, name: input.name ? fqdn(input.name, zone.name) : undefined, content: input.content };
    const { items, total, truncated } = await cf.listAll<DnsRecord>(cfPath`/zones/${zone.id}/dns_records`, query, {
      max: input.limit,
      what: 'DNS records',
    });
    return { zone: zoneOut(zone), records: items.map(recordSummary), count: items.length, total, truncated };
  },
});

export const cfGetDns = defineEdgeTool({
  name: 'cf_get_dns',
  description: 'Gets one DNS record by id, or the records at a name (optionally of one type).',
  priceCents: 0,
  input: z.object(recordSelector).refine(selectsRecords, selectorIssue),
  qField: 'name',
  output: '{zone: {id, name}, records: [{id, type, name, content, ttl, proxied, priority?, comment?}]}',
  outputSchema: z.object({ zone: ZoneOut, records: z.array(RecordOut) }),
  examples: [
    { zone: 'example.com', name: 'www' },
    { zone: 'example.com', name: '@', type: 'MX' },
    { zone: '023e105f4ecef8ad9ca31a8372d0c353', record_id: '372e67954025e0ba6aaa6d586b9e0b59' },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const records = await selectRecords(cf, zone, input);
    return { zone: zoneOut(zone), records: records.map(recordSummary) };
  },
});

export const cfCreateDns = defineEdgeTool({
  name: 'cf_create_dns',
  description: 'Creates one DNS record (A, AAAA, CNAME, MX, TXT, NS, CAA or SRV) in a zone.',
  priceCents: 2,
  sideEffects: true,
  input: z
    .object({ zone: zoneRef, type: recordType, ...recordFields })
    .superRefine((r, c) => recordProblems(r).forEach((i) => c.addIssue({ code: 'custom', path: i.path, message: i.message }))),
  qField: 'name',
  output: '{zone: {id, name}, record: {id, type, name, content, ttl, proxied, priority?}} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(z.object({ zone: ZoneOut, record: RecordOut.describe('The record as Cloudflare created it') })),
  examples: [
    { zone: 'example.com', type: 'A', name: 'app', content: '203.0.113.10', proxied: true },
    { zone: 'example.com', type: 'MX', name: '@', content: 'mail.example.net', priority: 10, ttl: 3600 },
    { zone: 'example.com', type: 'TXT', name: '_github-challenge', content: 'a1b2c3d4e5' },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const write: PlannedWrite = { method: 'POST', path: cfPath`/zones/${zone.id}/dns_records`, body: recordBody(input, zone.name) };
    const applied = await applyWrites(cf, ctx, [write]);
    if ('dry' in applied) return applied.dry;
    return { zone: zoneOut(zone), record: recordSummary(applied.results[0] as DnsRecord) };
  },
});

const UpdateFields = z.object({
  name: recordFields.name.optional(),
  content: recordFields.content,
  priority: recordFields.priority,
  caa: recordFields.caa,
  srv: recordFields.srv,
  ttl: recordFields.ttl,
  proxied: recordFields.proxied,
  comment: recordFields.comment,
});
type UpdateFields = z.output<typeof UpdateFields>;

/** The record after applying the changes, or an invalid_input naming what the result would get wrong. */
function mergeUpdate(existing: DnsRecord, changes: UpdateFields, where: Array<string | number>) {
  const defined = Object.fromEntries(Object.entries(changes).filter(([k, v]) => v !== undefined && k !== 'id'));
  const merged: ReturnType<typeof recordAsInput> = { ...recordAsInput(existing), ...defined };
  // Turning proxying on switches the TTL to automatic, as Cloudflare itself does.
  if (changes.proxied === true && changes.ttl === undefined) merged.ttl = 1;
  const problems = recordProblems(merged);
  if (problems.length) {
    const issues = problems.map((p) => ({ path: [...where, ...p.path], message: p.message }));
    throw new AppError('invalid_input', `The updated ${existing.type} record would be invalid: ${problems[0]!.message}`, { issues });
  }
  return merged;
}

function sameBody(a: Record<string, unknown>, b: Record<string, unknown>): boolean {
  return JSON.stringify(Object.entries(a).sort()) === JSON.stringify(Object.entries(b).sort());
}

export const cfUpdateDns = defineEdgeTool({
  name: 'cf_update_dns',
  description: "Changes one DNS record's content, name, TTL, proxying, priority or comment, keeping its type.",
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: UpdateFields.extend({ zone: zoneRef, record_id: recordId }).refine(
    (v) => Object.entries(v).some(([k, x]) => !['zone', 'record_id'].includes(k) && x !== undefined),
    { message: 'give at least one field to change', path: ['content'] },
  ),
  qField: 'record_id',
  output: '{zone, record (as it is now), changed: boolean} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(
    z.object({
      zone: ZoneOut,
      record: RecordOut.describe('The record as it is now'),
      changed: z.boolean().describe('false when the record already had these values (nothing was sent)'),
    }),
  ),
  examples: [
    { zone: 'example.com', record_id: '372e67954025e0ba6aaa6d586b9e0b59', content: '198.51.100.7' },
    { zone: 'example.com', record_id: '372e67954025e0ba6aaa6d586b9e0b59', proxied: false, ttl: 300 },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const path = cfPath`/zones/${zone.id}/dns_records/${input.record_id}`;
    const existing = await cf.get<DnsRecord>(path);
    const { zone: _z, record_id: _r, ...changes } = input;
    const merged = mergeUpdate(existing, changes, []);
    const body = recordBody(merged, zone.name);
    if (sameBody(body, recordBody(recordAsInput(existing), zone.name))) {
      return { zone: zoneOut(zone), record: recordSummary(existing), changed: false };
    }
    // Cloudflare's PATCH takes the record's full identity (type, name, content) with the changes.
    const applied = await applyWrites(cf, ctx, [{ method: 'PATCH', path, body }]);
    if ('dry' in applied) return applied.dry;
    return { zone: zoneOut(zone), record: recordSummary(applied.results[0] as DnsRecord), changed: true };
  },
});

export const cfDeleteDns = defineEdgeTool({
  name: 'cf_delete_dns',
  description: 'Deletes a DNS record by id, or the record(s) at a name and type.',
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z
    .object({
      ...recordSelector,
      all_matching: z.boolean().default(false).describe('When name/type match several records, delete all of them (otherwise the call is refused)'),
    })
    .refine(selectsRecords, selectorIssue),
  qField: 'name',
  output: '{zone, deleted: [{id, type, name, content}]} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(z.object({ zone: ZoneOut, deleted: z.array(RecordOut).describe('The records deleted, as they were') })),
  examples: [
    { zone: 'example.com', record_id: '372e67954025e0ba6aaa6d586b9e0b59' },
    { zone: 'example.com', name: 'old-app', type: 'A' },
    { zone: 'example.com', name: '_acme-challenge', type: 'TXT', all_matching: true },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const targets = await selectRecords(cf, zone, input);
    if (!input.record_id) {
      const what = `${input.type ?? 'any'} record at ${fqdn(input.name!, zone.name)}`;
      if (!targets.length) throw new AppError('tool_failed', `There is no ${what}`, { zone: zone.name });
      if (targets.length > 1 && !input.all_matching) {
        throw new AppError(
          'invalid_input',
          `${targets.length} records match (${targets.map((r) => `${r.type} ${r.content} [${r.id}]`).join(', ')}); pass record_id, a type, or all_matching: true`,
          { issues: [{ path: ['all_matching'], message: 'several records match' }] },
        );
      }
    }
    const writes: PlannedWrite[] =
      targets.length === 1
        ? [{ method: 'DELETE', path: cfPath`/zones/${zone.id}/dns_records/${targets[0]!.id}` }]
        : [{ method: 'POST', path: cfPath`/zones/${zone.id}/dns_records/batch`, body: { deletes: targets.map((r) => ({ id: r.id })) } }];
    const applied = await applyWrites(cf, ctx, writes);
    if ('dry' in applied) return applied.dry;
    return { zone: zoneOut(zone), deleted: targets.map(recordSummary) };
  },
});

const MAX_BATCH = 200;

export const cfBulkDns = defineEdgeTool({
  name: 'cf_bulk_dns',
  description: 'Creates, updates and deletes many DNS records in one batch request (applied in one transaction).',
  priceCents: 5,
  sideEffects: true,
  input: z
    .object({
      zone: zoneRef,
      create: z.array(RecordInput).max(MAX_BATCH).default([]).describe('Records to create'),
      update: z
        .array(UpdateFields.extend({ id: recordId }))
        .max(MAX_BATCH)
        .default([])
        .describe('Changes to existing records, by id (the type stays)'),
      delete: z.array(recordId).max(MAX_BATCH).default([]).describe('Ids of records to delete'),
    })
    .refine((v) => v.create.length + v.update.length + v.delete.length > 0, { message: 'give at least one change', path: ['create'] })
    .refine((v) => v.create.length + v.update.length + v.delete.length <= MAX_BATCH, {
      message: `at most ${MAX_BATCH} changes per call (the batch limit of every Cloudflare plan)`,
      path: ['create'],
    }),
  qField: 'zone',
  output: '{zone, created: [record], updated: [record], deleted: [id]} or, for sandbox keys, {dry_run, requests}',
  outputSchema: orDryRun(
    z.object({
      zone: ZoneOut,
      created: z.array(RecordOut),
      updated: z.array(RecordOut).describe('The records as they are after the batch'),
      deleted: z.array(z.string()).describe('Ids of the records deleted'),
    }),
  ),
  examples: [
    {
      zone: 'example.com',
      create: [
        { type: 'A', name: 'app1', content: '203.0.113.11' },
        { type: 'A', name: 'app2', content: '203.0.113.12' },
      ],
      delete: ['372e67954025e0ba6aaa6d586b9e0b59'],
    },
    { zone: 'example.com', update: [{ id: '372e67954025e0ba6aaa6d586b9e0b59', proxied: true }] },
  ],
  handler: async (input, ctx: ToolContext) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const needed = new Set([...input.update.map((u) => u.id), ...input.delete]);
    const byId = new Map<string, DnsRecord>();
    if (needed.size) {
      const { items } = await cf.listAll<DnsRecord>(cfPath`/zones/${zone.id}/dns_records`, {}, { what: 'DNS records', max: 100_000 });
      for (const r of items) byId.set(r.id, r);
      const missing = [...needed].filter((id) => !byId.has(id));
      if (missing.length) {
        throw new AppError('invalid_input', `No DNS record with id ${missing.join(', ')} in ${zone.name}`, {
          issues: missing.map((id) => ({ path: ['update/delete'], message: `unknown record id ${id}` })),
        });
      }
    }
    const dup = input.update.find((u) => input.delete.includes(u.id));
    if (dup) throw new AppError('invalid_input', `Record ${dup.id} is both updated and deleted`, { issues: [{ path: ['update'], message: 'also deleted' }] });

    const body: Record<string, unknown> = {};
    if (input.delete.length) body.deletes = input.delete.map((id) => ({ id }));
    if (input.update.length) {
      body.patches = input.update.map(({ id, ...changes }, i) => ({
        id,
        ...recordBody(mergeUpdate(byId.get(id)!, changes, ['update', i]), zone.name),
      }));
    }
    if (input.create.length) body.posts = input.create.map((r) => recordBody(r, zone.name));

    const applied = await applyWrites(cf, ctx, [{ method: 'POST', path: cfPath`/zones/${zone.id}/dns_records/batch`, body }]);
    if ('dry' in applied) return applied.dry;
    const result = (applied.results[0] ?? {}) as BatchResult;
    return {
      zone: zoneOut(zone),
      created: (result.posts ?? []).map(recordSummary),
      updated: (result.patches ?? []).map(recordSummary),
      deleted: (result.deletes ?? []).map((r) => r.id),
    };
  },
});
