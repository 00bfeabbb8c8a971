import { z } from 'zod';
import { CfClient } from './cf-client.js';
import { DryRunOut, ZoneOut, applyWrites, ipv4, ipv6, resolveZone, ttl, zoneOut, zoneRef, defineEdgeTool } from './common.js';
import {
  PlanChangesOut,
  RecordOut,
  batchWrite,
  planIsEmpty,
  planRecords,
  planSummary,
  recordsAt,
  recordSummary,
  type BatchResult,
  type Desired,
} from './dns-records.js';

const ADDRESS_TYPES = new Set(['A', 'AAAA', 'CNAME']);

const PointToServerOutput = z.union([
  z.object({
    zone: ZoneOut,
    changed: z.boolean().describe('false when the records already pointed there (nothing was sent)'),
    records: z.array(RecordOut).describe('The address records at the names now'),
    changes: PlanChangesOut,
  }),
  DryRunOut.extend({ changes: PlanChangesOut }),
]);

export const cfPointToServer = defineEdgeTool({
  name: 'cf_point_to_server',
  description:
    'Points a domain (apex and www) at a server: sets its A/AAAA records and replaces conflicting A, AAAA or CNAME records in one batch; running it again changes nothing.',
  priceCents: 3,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z
    .object({
      zone: zoneRef,
      ipv4: ipv4.optional().describe("The server's IPv4 address"),
      ipv6: ipv6.optional().describe("The server's IPv6 address"),
      proxied: z.boolean().default(true).describe('Serve through Cloudflare (CDN, TLS, protection); false exposes the server IP in DNS'),
      include_www: z.boolean().default(true).describe('Also point www.<domain>; false leaves www alone'),
      ttl: ttl.default(1),
    })
    .refine((v) => v.ipv4 || v.ipv6, { message: 'give ipv4, ipv6 or both', path: ['ipv4'] })
    .refine((v) => !(v.proxied && v.ttl !== 1), { message: 'proxied records always use the automatic TTL (1)', path: ['ttl'] }),
  qField: 'zone',
  output:
    '{zone, changed, records: [{id, type, name, content, proxied, ttl}], changes: {created, updated, deleted, unchanged}} or, for sandbox keys, {dry_run, requests, changes}',
  outputSchema: PointToServerOutput,
  examples: [
    { zone: 'example.com', ipv4: '203.0.113.10' },
    { zone: 'example.com', ipv4: '203.0.113.10', ipv6: '2001:db8::10', proxied: false, ttl: 300 },
    { zone: 'example.com', ipv6: '2001:db8::10', include_www: false },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const names = input.include_www ? [zone.name, `www.${zone.name}`] : [zone.name];

    const byName = await recordsAt(cf, zone.id, names);
    const existing = names.flatMap((name) => byName.get(name)!.filter((r) => ADDRESS_TYPES.has(r.type)));
    const desired: Desired[] = names.flatMap((name) => [
      ...(input.ipv4 ? [{ type: 'A' as const, name, content: input.ipv4, ttl: input.ttl, proxied: input.proxied }] : []),
      ...(input.ipv6 ? [{ type: 'AAAA' as const, name, content: input.ipv6, ttl: input.ttl, proxied: input.proxied }] : []),
    ]);
    // Every A/AAAA/CNAME on these names is ours to replace: a leftover would send visitors elsewhere.
    const plan = planRecords(existing, desired);
    const changes = planSummary(plan);
    const out = { zone: zoneOut(zone) };
    if (planIsEmpty(plan)) return { ...out, changed: false, records: plan.unchanged.map(recordSummary), changes };

    const applied = await applyWrites(cf, ctx, [batchWrite(zone.id, plan)]);
    if ('dry' in applied) return { ...applied.dry, changes };
    const result = (applied.results[0] ?? {}) as BatchResult;
    const records = [...plan.unchanged, ...(result.patches ?? []), ...(result.posts ?? [])].map(recordSummary);
    records.sort((a, b) => a.name.localeCompare(b.name) || a.type.localeCompare(b.type));
    return { ...out, changed: true, records, changes };
  },
});
