import { z } from 'zod';
import { CfClient, cfPath, type PlannedWrite } from './cf-client.js';
import { DryRunOut, ZoneOut, applyWrites, resolveZone, settingWrite, zoneOut, zoneRef, type ZoneSetting, defineEdgeTool } from './common.js';

const SSL_MODES = ['off', 'flexible', 'full', 'strict'] as const;
const MODE_LABEL: Record<string, string> = { off: 'Off', flexible: 'Flexible', full: 'Full', strict: 'Full (strict)' };

interface Verification {
  certificate_status: string;
  cert_pack_uuid?: string;
  validation_method?: string;
  verification_status?: boolean;
  verification_type?: string;
  verification_info?: Record<string, string>;
  signature?: string;
  brand_check?: boolean;
}

const onOff = z.enum(['on', 'off']);
const minTls = z.enum(['1.0', '1.1', '1.2', '1.3']);
/** The zone's ssl setting, or unknown when the zone does not report one. */
const modeOut = z.enum([...SSL_MODES, 'unknown']);

const SslStatusOutput = z.object({
  zone: ZoneOut,
  mode: modeOut,
  mode_label: z.string().describe('The mode as the dashboard names it, e.g. Full (strict)'),
  universal_ssl: z.boolean().nullable().describe('Universal SSL enabled; null when Cloudflare does not say'),
  always_use_https: onOff.nullable(),
  min_tls_version: minTls.nullable(),
  tls_1_3: z.enum(['on', 'off', 'zrt']).nullable(),
  certificates: z.array(
    z.object({
      status: z.enum(['initializing', 'authorizing', 'active', 'expired', 'issuing', 'timing_out', 'pending_deployment']),
      cert_pack_uuid: z.string().nullable(),
      validation_method: z.enum(['http', 'cname', 'txt']).nullable(),
      verification_status: z.boolean().nullable(),
      verification_type: z.enum(['cname', 'meta tag']).nullable(),
      verification_info: z.record(z.string()).optional().describe('What Cloudflare needs to see to verify the certificate, when it says'),
    }),
  ),
  summary: z.string().describe('One line: the mode and the edge certificate state'),
});

const SslModeOutput = z.union([
  z.object({
    zone: ZoneOut,
    mode: z.enum(SSL_MODES),
    previous_mode: modeOut,
    changed: z.boolean().describe('false when every setting already had the wanted value (nothing was sent)'),
    always_use_https: z.boolean(),
    min_tls_version: minTls.nullable(),
    warnings: z.array(z.string()),
  }),
  DryRunOut.extend({ warnings: z.array(z.string()) }),
]);

async function settingsMap(cf: CfClient, zoneId: string): Promise<Map<string, ZoneSetting>> {
  const all = await cf.get<ZoneSetting[]>(cfPath`/zones/${zoneId}/settings`);
  return new Map(all.map((s) => [s.id, s]));
}

export const cfSslStatus = defineEdgeTool({
  name: 'cf_ssl_status',
  description: "Shows a zone's SSL/TLS state: encryption mode, Universal SSL, certificate verification, HTTPS redirect and minimum TLS.",
  priceCents: 0,
  input: z.object({ zone: zoneRef }),
  qField: 'zone',
  output:
    '{zone, mode, mode_label, universal_ssl, always_use_https, min_tls_version, certificates: [{status, validation_method, verification_status, ...}], summary}',
  outputSchema: SslStatusOutput,
  examples: [{ zone: 'example.com' }],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const settings = await settingsMap(cf, zone.id);
    const universal = await cf.get<{ enabled?: boolean }>(cfPath`/zones/${zone.id}/ssl/universal/settings`);
    const verification = await cf.get<Verification[]>(cfPath`/zones/${zone.id}/ssl/verification`);
    const mode = String(settings.get('ssl')?.value ?? 'unknown');
    const certificates = verification.map((v) => ({
      status: v.certificate_status,
      cert_pack_uuid: v.cert_pack_uuid ?? null,
      validation_method: v.validation_method ?? null,
      verification_status: v.verification_status ?? null,
      verification_type: v.verification_type ?? null,
      ...(v.verification_info ? { verification_info: v.verification_info } : {}),
    }));
    const active = certificates.some((c) => c.status === 'active');
    return {
      zone: zoneOut(zone),
      mode,
      mode_label: MODE_LABEL[mode] ?? mode,
      universal_ssl: universal.enabled ?? null,
      always_use_https: settings.get('always_use_https')?.value ?? null,
      min_tls_version: settings.get('min_tls_version')?.value ?? null,
      tls_1_3: settings.get('tls_1_3')?.value ?? null,
      certificates,
      summary: `${MODE_LABEL[mode] ?? mode} encryption; ${
        certificates.length ? (active ? 'edge certificate active' : `edge certificate ${certificates[0]!.status}`) : 'no edge certificate yet'
      }${universal.enabled === false ? '; Universal SSL is disabled' : ''}`,
    };
  },
});

export const cfSslMode = defineEdgeTool({
  name: 'cf_ssl_mode',
  description: "Sets a zone's SSL/TLS encryption mode (off, flexible, full, strict) and optionally HTTPS redirects and minimum TLS.",
  priceCents: 2,
  sideEffects: true,
  // Sets a state or removes a thing: the same call again changes nothing more.
  idempotent: true,
  input: z.object({
    zone: zoneRef,
    mode: z
      .enum(SSL_MODES)
      .describe(
        'off; flexible (HTTPS to visitors, HTTP to the origin); full (HTTPS to the origin, any certificate); strict (HTTPS to the origin with a valid certificate)',
      ),
    always_use_https: z.boolean().optional().describe('Also redirect every HTTP request to HTTPS'),
    min_tls_version: z.enum(['1.0', '1.1', '1.2', '1.3']).optional().describe('Also set the oldest TLS version visitors may use'),
  }),
  qField: 'zone',
  output: '{zone, mode, previous_mode, changed, always_use_https, min_tls_version, warnings} or, for sandbox keys, {dry_run, requests}',
  outputSchema: SslModeOutput,
  examples: [
    { zone: 'example.com', mode: 'strict' },
    { zone: 'example.com', mode: 'full', always_use_https: true, min_tls_version: '1.2' },
  ],
  handler: async (input, ctx) => {
    const cf = new CfClient(ctx);
    const zone = await resolveZone(cf, input.zone);
    const settings = await settingsMap(cf, zone.id);
    const writes: PlannedWrite[] = [];
    const want: Array<[string, unknown]> = [['ssl', input.mode]];
    if (input.always_use_https !== undefined) want.push(['always_use_https', input.always_use_https ? 'on' : 'off']);
    if (input.min_tls_version) want.push(['min_tls_version', input.min_tls_version]);
    for (const [id, value] of want) if (settings.get(id)?.value !== value) writes.push(settingWrite(zone.id, id, value));

    const warnings: string[] = [];
    if (input.mode === 'flexible')
      warnings.push('Flexible sends traffic from Cloudflare to your origin unencrypted; use full or strict when the origin has a certificate.');
    if (input.mode === 'off') warnings.push('With SSL off, visitors cannot reach the site over HTTPS.');

    const previous = String(settings.get('ssl')?.value ?? 'unknown');
    const applied = await applyWrites(cf, ctx, writes);
    if ('dry' in applied) return { ...applied.dry, warnings };
    return {
      zone: zoneOut(zone),
      mode: input.mode,
      previous_mode: previous,
      changed: writes.length > 0,
      always_use_https: input.always_use_https ?? settings.get('always_use_https')?.value === 'on',
      min_tls_version: input.min_tls_version ?? settings.get('min_tls_version')?.value ?? null,
      warnings,
    };
  },
});
