import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { isIPv4, isIPv6 } from 'node:net';
import type { AddressInfo } from 'node:net';
import { gqlValue, parseGraphql, type GqlField, type RecordedRequest } from './cf-openapi.js';

/**
 * A local stand-in for Cloudflare's API v4 on 127.0.0.1. It speaks the v4 envelope
 * ({success, errors, messages, result, result_info}) and the GraphQL Analytics response shape
 * ({data, errors}), keeps zones, DNS records, settings, rulesets, page rules, IP access rules,
 * Workers and analytics in memory, paginates lists, records every request, and can be told to fail.
 */

export const FAKE_TOKEN = 'cf-test-token';
const BASE = '/client/v4';

type Json = Record<string, unknown>;
const id32 = () => randomBytes(16).toString('hex');
const now = () => new Date().toISOString();

export interface FakeRecord {
  id: string;
  zone_id: string;
  zone_name: string;
  type: string;
  name: string;
  content: string;
  ttl: number;
  proxied: boolean;
  proxiable: boolean;
  priority?: number;
  data?: Json;
  comment?: string | null;
  tags: string[];
  created_on: string;
  modified_on: string;
}

export interface FakeRule {
  id: string;
  version: string;
  action: string;
  expression: string;
  description: string;
  enabled: boolean;
  action_parameters?: Json;
  ref: string;
  last_updated: string;
}

export interface FakeRuleset {
  id: string;
  name: string;
  kind: 'zone';
  phase: string;
  version: string;
  rules: FakeRule[];
  last_updated: string;
}

export interface DayStats {
  requests: number;
  cachedRequests: number;
  bytes: number;
  cachedBytes: number;
  encryptedBytes: number;
  encryptedRequests: number;
  threats: number;
  pageViews: number;
  uniques: number;
  status: Record<string, number>;
  countries: Record<string, { requests: number; bytes: number; threats: number }>;
  contentTypes: Record<string, { requests: number; bytes: number }>;
}

export interface FirewallEvent {
  datetime: string;
  action: string;
  source: string;
  clientIP: string;
  clientCountryName: string;
  clientAsn: string;
  clientRequestPath: string;
  clientRequestHTTPHost?: string;
  ruleId?: string;
}

export interface FakeZone {
  id: string;
  name: string;
  status: string;
  paused: boolean;
  type: string;
  account: { id: string; name: string };
  name_servers: string[];
  original_name_servers: string[];
  plan: { id: string; name: string };
  created_on: string;
  modified_on: string;
  activated_on: string | null;
  records: FakeRecord[];
  settings: Map<string, unknown>;
  devModeUntil: number;
  universalSsl: boolean;
  certificateStatus: string;
  rulesets: Map<string, FakeRuleset>;
  pagerules: Json[];
  accessRules: Json[];
  purges: Json[];
  daily: Map<string, DayStats>;
  firewallEvents: FirewallEvent[];
}

export interface Failure {
  status: number;
  errors?: Array<{ code: number; message: string }>;
  headers?: Record<string, string>;
  /** A raw body instead of the envelope (e.g. an HTML error page). */
  raw?: string;
  method?: string;
  path?: RegExp;
  times?: number;
}

interface Reply {
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
  raw?: string;
}

class CfError extends Error {
  constructor(
    readonly status: number,
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

const SETTING_VALUES: Record<string, unknown[] | 'number'> = {
  ssl: ['off', 'flexible', 'full', 'strict'],
  security_level: ['off', 'essentially_off', 'low', 'medium', 'high', 'under_attack'],
  development_mode: ['on', 'off'],
  always_use_https: ['on', 'off'],
  automatic_https_rewrites: ['on', 'off'],
  min_tls_version: ['1.0', '1.1', '1.2', '1.3'],
  tls_1_3: ['on', 'off', 'zrt'],
  cache_level: ['aggressive', 'basic', 'simplified'],
  browser_cache_ttl: 'number',
  always_online: ['on', 'off'],
  brotli: ['on', 'off'],
};

const DEFAULT_SETTINGS: Record<string, unknown> = {
  ssl: 'full',
  security_level: 'medium',
  development_mode: 'off',
  always_use_https: 'off',
  automatic_https_rewrites: 'on',
  min_tls_version: '1.0',
  tls_1_3: 'on',
  cache_level: 'aggressive',
  browser_cache_ttl: 14400,
  always_online: 'off',
  brotli: 'on',
};

const PER_PAGE_MAX: Record<string, number> = { zones: 50, accounts: 50, dns: 5000, access: 1000 };

export class FakeCloudflare {
  readonly requests: RecordedRequest[] = [];
  readonly accounts: Array<{ id: string; name: string }>;
  readonly zones = new Map<string, FakeZone>();
  readonly workers = new Map<string, Map<string, Json & { modules: Array<{ name: string; type: string; text: string }>; metadata: Json }>>();
  readonly accountAccessRules = new Map<string, Json[]>();
  private failures: Failure[] = [];
  private server!: Server;
  url = '';

  constructor(
    readonly token = FAKE_TOKEN,
    accounts = [{ id: id32(), name: 'Acme Corp' }],
  ) {
    this.accounts = accounts;
  }

  async start(): Promise<this> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}${BASE}`;
    return this;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Requests that change something (everything but GET and the read-only GraphQL endpoint). */
  writes(): RecordedRequest[] {
    return this.requests.filter((r) => r.method !== 'GET' && r.path !== '/graphql');
  }

  clearRequests(): void {
    this.requests.length = 0;
  }

  /** The next matching request gets this answer instead (`times` requests, default 1). */
  failNext(f: Failure): void {
    this.failures.push({ times: 1, ...f });
  }

  addZone(name: string, opts: { status?: string; account?: { id: string; name: string }; plan?: string } = {}): FakeZone {
    const account = opts.account ?? this.accounts[0]!;
    const zone: FakeZone = {
      id: id32(),
      name,
      status: opts.status ?? 'active',
      paused: false,
      type: 'full',
      account,
      name_servers: ['ada.ns.cloudflare.com', 'bob.ns.cloudflare.com'],
      original_name_servers: ['ns1.registrar.example', 'ns2.registrar.example'],
      plan: { id: 'free', name: opts.plan ?? 'Free Website' },
      created_on: now(),
      modified_on: now(),
      activated_on: opts.status === 'pending' ? null : now(),
      records: [],
      settings: new Map(Object.entries(DEFAULT_SETTINGS)),
      devModeUntil: 0,
      universalSsl: true,
      certificateStatus: 'active',
      rulesets: new Map(),
      pagerules: [],
      accessRules: [],
      purges: [],
      daily: new Map(),
      firewallEvents: [],
    };
    this.zones.set(zone.id, zone);
    return zone;
  }

  addRecord(
    zone: FakeZone,
    r: { type: string; name: string; content?: string; ttl?: number; proxied?: boolean; priority?: number; data?: Json; comment?: string },
  ): FakeRecord {
    const rec = this.makeRecord(zone, r as Json);
    zone.records.push(rec);
    return rec;
  }

  seedDay(zone: FakeZone, date: string, stats: Partial<DayStats>): void {
    zone.daily.set(date, {
      requests: 0,
      cachedRequests: 0,
      bytes: 0,
      cachedBytes: 0,
      encryptedBytes: 0,
      encryptedRequests: 0,
      threats: 0,
      pageViews: 0,
      uniques: 0,
      status: {},
      countries: {},
      contentTypes: {},
      ...stats,
    });
  }

  // ------------------------------------------------------------------------------------------

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks);
    const url = new URL(req.url ?? '/', 'http://127.0.0.1');
    const path = url.pathname.startsWith(BASE) ? url.pathname.slice(BASE.length) || '/' : url.pathname;
    const headers = Object.fromEntries(Object.entries(req.headers).map(([k, v]) => [k, Array.isArray(v) ? v.join(', ') : (v ?? '')]));
    const contentType = headers['content-type'] ?? '';
    const recorded: RecordedRequest = { method: req.method ?? 'GET', path, query: Object.fromEntries(url.searchParams), headers, body: undefined };
    this.requests.push(recorded);

    let reply: Reply;
    try {
      if (raw.length && contentType.startsWith('multipart/form-data')) {
        const form = await new Request('http://127.0.0.1/', { method: 'POST', headers: { 'content-type': contentType }, body: raw }).formData();
        recorded.multipart = [];
        for (const [name, v] of form.entries()) {
          if (typeof v === 'string') recorded.multipart.push({ name, type: 'text/plain', text: v });
          else recorded.multipart.push({ name, filename: v.name, type: v.type, text: await v.text() });
        }
      } else if (raw.length) {
        try {
          recorded.body = JSON.parse(raw.toString('utf8'));
        } catch {
          throw new CfError(400, 6007, 'Malformed JSON in request body');
        }
      }
      reply = this.injected(recorded) ?? this.authorize(headers) ?? this.route(recorded);
    } catch (e) {
      if (e instanceof CfError) reply = fail(e.status, e.code, e.message);
      else reply = fail(500, 10001, `fake internal error: ${(e as Error).message}`);
    }
    res.writeHead(reply.status, { 'content-type': reply.raw !== undefined ? 'text/html' : 'application/json', ...(reply.headers ?? {}) });
    res.end(reply.raw ?? JSON.stringify(reply.body));
  }

  private injected(r: RecordedRequest): Reply | null {
    const i = this.failures.findIndex((f) => (!f.method || f.method === r.method) && (!f.path || f.path.test(r.path)));
    if (i === -1) return null;
    const f = this.failures[i]!;
    f.times = (f.times ?? 1) - 1;
    if (f.times <= 0) this.failures.splice(i, 1);
    if (f.raw !== undefined) return { status: f.status, raw: f.raw, headers: f.headers };
    return {
      status: f.status,
      headers: f.headers,
      body: { success: false, errors: f.errors ?? [{ code: 10000, message: 'Failure' }], messages: [], result: null },
    };
  }

  private authorize(h: Record<string, string>): Reply | null {
    const auth = h.authorization;
    if (!auth) {
      return {
        status: 400,
        body: {
          success: false,
          errors: [
            { code: 9106, message: 'Missing X-Auth-Email header' },
            { code: 9107, message: 'Missing X-Auth-Key header' },
          ],
          messages: [],
          result: null,
        },
      };
    }
    const m = /^Bearer ([A-Za-z0-9_-]+)$/.exec(auth);
    if (!m) {
      return {
        status: 400,
        body: {
          success: false,
          errors: [{ code: 6003, message: 'Invalid request headers', error_chain: [{ code: 6111, message: 'Invalid format for Authorization header' }] }],
          messages: [],
          result: null,
        },
      };
    }
    if (m[1] !== this.token) return fail(403, 9109, 'Invalid access token');
    return null;
  }

  private route(r: RecordedRequest): Reply {
    const { method: M, path: P } = r;
    const seg = P.split('/').filter(Boolean).map(decodeURIComponent);
    const body = (r.body ?? {}) as Json;
    const q = r.query;

    if (P === '/graphql' && M === 'POST') return this.graphql(body);
    if (P === '/accounts' && M === 'GET') return paginate(this.accounts, q, 'accounts');
    if (P === '/zones' && M === 'GET') return this.listZones(q);
    if (P === '/zones' && M === 'POST') return this.createZone(body);

    if (seg[0] === 'zones' && seg[1]) {
      const zone = this.zones.get(seg[1]);
      if (!zone) throw new CfError(404, 7003, `Could not route to /zones/${seg[1]}, perhaps your object identifier is invalid?`);
      const rest = seg.slice(2);
      return this.zoneRoute(zone, M, rest, body, q);
    }
    if (seg[0] === 'accounts' && seg[1]) {
      const account = this.accounts.find((a) => a.id === seg[1]);
      if (!account) throw new CfError(403, 10000, 'Authentication error');
      const rest = seg.slice(2);
      if (rest[0] === 'workers' && rest[1] === 'scripts') return this.workersRoute(account.id, M, rest.slice(2), r);
      if (rest.join('/') === 'firewall/access_rules/rules' || (rest.slice(0, 3).join('/') === 'firewall/access_rules/rules' && rest.length === 4)) {
        if (!this.accountAccessRules.has(account.id)) this.accountAccessRules.set(account.id, []);
        return this.accessRules(this.accountAccessRules.get(account.id)!, M, rest[3], body, q, { type: 'account', id: account.id });
      }
    }
    throw new CfError(404, 7000, `No route for that URI`);
  }

  private listZones(q: Record<string, string>): Reply {
    let zones = [...this.zones.values()];
    if (q.name) {
      const [op, v] = q.name.includes(':') ? (q.name.split(/:(.*)/s) as [string, string]) : ['equal', q.name];
      zones = zones.filter((z) =>
        op === 'contains' ? z.name.includes(v) : op === 'starts_with' ? z.name.startsWith(v) : op === 'ends_with' ? z.name.endsWith(v) : z.name === v,
      );
    }
    if (q.status) zones = zones.filter((z) => z.status === q.status);
    if (q['account.id']) zones = zones.filter((z) => z.account.id === q['account.id']);
    return paginate(zones.map(zoneView), q, 'zones');
  }

  private createZone(body: Json): Reply {
    const name = String(body.name ?? '');
    const account = (body.account as { id?: string } | undefined)?.id;
    if (!/^([a-z0-9][-a-z0-9]*\.)+[-a-z0-9]{2,20}$/.test(name)) throw new CfError(400, 1097, 'Invalid domain name');
    const acct = this.accounts.find((a) => a.id === account);
    if (!acct) throw new CfError(400, 1099, 'Invalid or missing account');
    if ([...this.zones.values()].some((z) => z.name === name)) throw new CfError(400, 1061, `${name} already exists`);
    const zone = this.addZone(name, { status: 'pending', account: acct });
    zone.type = String(body.type ?? 'full');
    return ok(zoneView(zone));
  }

  private zoneRoute(zone: FakeZone, M: string, rest: string[], body: Json, q: Record<string, string>): Reply {
    const key = rest.join('/');
    if (key === '' && M === 'GET') return ok(zoneView(zone));
    if (key === 'settings' && M === 'GET') return ok([...zone.settings.keys()].map((k) => this.setting(zone, k)));
    if (rest[0] === 'settings' && rest.length === 2) {
      const sid = rest[1]!;
      if (!zone.settings.has(sid)) throw new CfError(404, 1003, `Invalid or missing zone setting ${sid}`);
      if (M === 'GET') return ok(this.setting(zone, sid));
      if (M === 'PATCH') {
        if (!('value' in body)) throw new CfError(400, 1007, 'Invalid value for zone setting: value missing');
        const allowed = SETTING_VALUES[sid];
        if (allowed === 'number' ? typeof body.value !== 'number' : !allowed?.includes(body.value)) {
          throw new CfError(400, 1007, `Invalid value for zone setting ${sid}`);
        }
        zone.settings.set(sid, body.value);
        if (sid === 'development_mode') zone.devModeUntil = body.value === 'on' ? Date.now() + 3 * 3600_000 : 0;
        return ok(this.setting(zone, sid));
      }
    }
    if (key === 'ssl/verification' && M === 'GET') {
      return ok([
        {
          certificate_status: zone.certificateStatus,
          cert_pack_uuid: '8a9f3b2c-0000-4000-8000-000000000001',
          validation_method: 'txt',
          verification_status: zone.certificateStatus === 'active',
          verification_type: 'cname',
          signature: 'ECDSAWithSHA256',
          brand_check: false,
        },
      ]);
    }
    if (key === 'ssl/universal/settings') {
      if (M === 'GET') return ok({ enabled: zone.universalSsl });
      if (M === 'PATCH') {
        zone.universalSsl = Boolean(body.enabled);
        return ok({ enabled: zone.universalSsl });
      }
    }
    if (key === 'purge_cache' && M === 'POST') {
      const kinds = ['files', 'tags', 'hosts', 'prefixes', 'purge_everything'].filter((k) => k in body);
      if (kinds.length !== 1) throw new CfError(400, 1012, 'Request must contain one of "purge_everything", "files", "tags", "hosts" or "prefixes"');
      const list = body[kinds[0]!];
      if (Array.isArray(list) && list.length > 30) throw new CfError(400, 1015, 'Only 30 items may be purged per request');
      zone.purges.push(body);
      return ok({ id: zone.id });
    }
    if (rest[0] === 'dns_records') return this.dnsRoute(zone, M, rest.slice(1), body, q);
    if (rest[0] === 'rulesets') return this.rulesetsRoute(zone, M, rest.slice(1), body);
    if (rest[0] === 'pagerules') return this.pagerulesRoute(zone, M, rest[1], body, q);
    if (rest.slice(0, 3).join('/') === 'firewall/access_rules/rules')
      return this.accessRules(zone.accessRules, M, rest[3], body, q, { type: 'zone', id: zone.id });
    throw new CfError(404, 7000, 'No route for that URI');
  }

  private setting(zone: FakeZone, id: string): Json {
    const s: Json = { id, value: zone.settings.get(id), editable: true, modified_on: zone.modified_on };
    if (id === 'development_mode') {
      if (zone.devModeUntil && zone.devModeUntil < Date.now()) {
        zone.settings.set(id, 'off');
        zone.devModeUntil = 0;
      }
      s.value = zone.settings.get(id);
      s.time_remaining = zone.devModeUntil ? Math.round((zone.devModeUntil - Date.now()) / 1000) : 0;
    }
    return s;
  }

  // --- DNS -----------------------------------------------------------------------------------

  private makeRecord(zone: FakeZone, b: Json, id = id32()): FakeRecord {
    const type = String(b.type ?? '');
    if (!type) throw new CfError(400, 9000, 'DNS record type is invalid');
    let name = String(b.name ?? '')
      .toLowerCase()
      .replace(/\.$/, '');
    if (!name) throw new CfError(400, 9000, 'DNS name is invalid');
    if (name === '@') name = zone.name;
    else if (name !== zone.name && !name.endsWith(`.${zone.name}`)) name = `${name}.${zone.name}`;
    const content = typeof b.content === 'string' ? b.content : '';
    if (type === 'A' && !isIPv4(content)) throw new CfError(400, 9005, 'Content for A record must be a valid IPv4 address.');
    if (type === 'AAAA' && !isIPv6(content)) throw new CfError(400, 9005, 'Content for AAAA record must be a valid IPv6 address.');
    if (['CNAME', 'MX', 'NS'].includes(type) && !/^[a-z0-9_.-]+\.[a-z0-9-]+\.?$/i.test(content))
      throw new CfError(400, 9005, `Content for ${type} record is invalid.`);
    if (type === 'MX' && typeof b.priority !== 'number') throw new CfError(400, 9100, 'MX records require a priority.');
    if (['CAA', 'SRV'].includes(type) && (!b.data || typeof b.data !== 'object')) throw new CfError(400, 9101, `${type} records require data.`);
    const proxiable = ['A', 'AAAA', 'CNAME'].includes(type);
    if (b.proxied === true && !proxiable) throw new CfError(400, 9004, 'This record type cannot be proxied.');
    const ttl = typeof b.ttl === 'number' ? b.ttl : 1;
    if (ttl !== 1 && (ttl < 60 || ttl > 86400)) throw new CfError(400, 9003, 'Invalid TTL. Must be between 60 and 86400 seconds, or 1 for Automatic.');
    const data = b.data as Json | undefined;
    const rec: FakeRecord = {
      id,
      zone_id: zone.id,
      zone_name: zone.name,
      type,
      name,
      content:
        type === 'CAA' && data
          ? `${data.flags ?? 0} ${data.tag} "${data.value}"`
          : type === 'SRV' && data
            ? `${data.weight} ${data.port} ${data.target}`
            : type === 'TXT'
              ? content
              : content.toLowerCase().replace(/\.$/, ''),
      ttl: b.proxied ? 1 : ttl,
      proxied: b.proxied === true,
      proxiable,
      ...(type === 'MX' ? { priority: b.priority as number } : {}),
      ...(type === 'SRV' && data ? { priority: data.priority as number } : {}),
      ...(data ? { data } : {}),
      comment: (b.comment as string | undefined) ?? null,
      tags: [],
      created_on: now(),
      modified_on: now(),
    };
    return rec;
  }

  /** Cloudflare's rules for a record next to the others: CNAME stands alone, no identical twins. */
  private checkConflicts(records: FakeRecord[], rec: FakeRecord): void {
    const same = records.filter((o) => o.id !== rec.id && o.name === rec.name);
    if (rec.type === 'CNAME' && same.some((o) => ['A', 'AAAA', 'CNAME'].includes(o.type))) {
      throw new CfError(400, 81053, 'An A, AAAA, or CNAME record with that host already exists.');
    }
    if (['A', 'AAAA'].includes(rec.type) && same.some((o) => o.type === 'CNAME')) {
      throw new CfError(400, 81053, 'An A, AAAA, or CNAME record with that host already exists.');
    }
    if (same.some((o) => o.type === rec.type && o.content === rec.content && (o.priority ?? null) === (rec.priority ?? null))) {
      throw new CfError(400, 81058, 'An identical record already exists.');
    }
  }

  private dnsRoute(zone: FakeZone, M: string, rest: string[], body: Json, q: Record<string, string>): Reply {
    if (rest.length === 0 && M === 'GET') {
      let rows = zone.records;
      if (q.type) rows = rows.filter((r) => r.type === q.type);
      if (q.name) rows = rows.filter((r) => r.name === q.name!.toLowerCase());
      if (q.content) rows = rows.filter((r) => r.content === q.content);
      return paginate(rows, q, 'dns', 100);
    }
    if (rest.length === 0 && M === 'POST') {
      const rec = this.makeRecord(zone, body);
      this.checkConflicts(zone.records, rec);
      zone.records.push(rec);
      return ok(rec);
    }
    if (rest[0] === 'batch' && M === 'POST') return this.batch(zone, body);
    if (rest.length === 1) {
      const i = zone.records.findIndex((r) => r.id === rest[0]);
      if (i === -1) throw new CfError(404, 81044, 'Record does not exist.');
      const existing = zone.records[i]!;
      if (M === 'GET') return ok(existing);
      if (M === 'DELETE') {
        zone.records.splice(i, 1);
        return ok({ id: existing.id });
      }
      if (M === 'PATCH' || M === 'PUT') {
        const merged = M === 'PATCH' ? { ...existing, ...body } : { ...body };
        const rec = { ...this.makeRecord(zone, merged as Json, existing.id), created_on: existing.created_on };
        if (rec.type !== existing.type) throw new CfError(400, 9000, 'The record type cannot be changed');
        this.checkConflicts(zone.records, rec);
        zone.records[i] = rec;
        return ok(rec);
      }
    }
    throw new CfError(405, 10405, 'Method not allowed');
  }

  /** Runs deletes, patches, puts, posts in that order on a copy; any failure leaves the zone as it was. */
  private batch(zone: FakeZone, body: Json): Reply {
    const records = zone.records.map((r) => ({ ...r }));
    const result: Record<string, FakeRecord[]> = { deletes: [], patches: [], puts: [], posts: [] };
    const find = (id: unknown) => {
      const i = records.findIndex((r) => r.id === id);
      if (i === -1) throw new CfError(400, 81044, `Record ${String(id)} does not exist.`);
      return i;
    };
    for (const d of (body.deletes as Json[] | undefined) ?? []) {
      const i = find(d.id);
      result.deletes!.push(records[i]!);
      records.splice(i, 1);
    }
    for (const kind of ['patches', 'puts'] as const) {
      for (const p of (body[kind] as Json[] | undefined) ?? []) {
        const i = find(p.id);
        const existing = records[i]!;
        const merged = kind === 'patches' ? { ...existing, ...p } : p;
        const rec = { ...this.makeRecord(zone, merged, existing.id), created_on: existing.created_on };
        this.checkConflicts(records, rec);
        records[i] = rec;
        result[kind]!.push(rec);
      }
    }
    for (const p of (body.posts as Json[] | undefined) ?? []) {
      const rec = this.makeRecord(zone, p);
      this.checkConflicts(records, rec);
      records.push(rec);
      result.posts!.push(rec);
    }
    zone.records = records;
    return ok(result);
  }

  // --- rulesets ------------------------------------------------------------------------------

  private makeRule(b: Json, existing?: FakeRule): FakeRule {
    if (typeof b.expression !== 'string' || !b.expression) throw new CfError(400, 20021, "'expression' is a required field");
    if (typeof b.action !== 'string') throw new CfError(400, 20021, "'action' is a required field");
    const ruleId = existing?.id ?? id32();
    return {
      id: ruleId,
      version: String(Number(existing?.version ?? 0) + 1),
      action: b.action,
      expression: b.expression,
      description: String(b.description ?? ''),
      enabled: b.enabled !== false,
      ...(b.action_parameters ? { action_parameters: b.action_parameters as Json } : {}),
      ref: String(b.ref ?? existing?.ref ?? ruleId),
      last_updated: now(),
    };
  }

  private rulesetsRoute(zone: FakeZone, M: string, rest: string[], body: Json): Reply {
    if (rest[0] === 'phases' && rest[2] === 'entrypoint' && rest.length === 3) {
      const phase = rest[1]!;
      const rs = zone.rulesets.get(phase);
      if (M === 'GET') {
        if (!rs) throw new CfError(404, 10003, `could not find entrypoint ruleset in the '${phase}' phase`);
        return ok(rs);
      }
      if (M === 'PUT') {
        const rules = ((body.rules as Json[] | undefined) ?? []).map((r) =>
          this.makeRule(
            r,
            rs?.rules.find((x) => x.id === r.id),
          ),
        );
        const next: FakeRuleset = {
          id: rs?.id ?? id32(),
          name: String(body.name ?? rs?.name ?? 'default'),
          kind: 'zone',
          phase,
          version: String(Number(rs?.version ?? 0) + 1),
          rules,
          last_updated: now(),
        };
        zone.rulesets.set(phase, next);
        return ok(next);
      }
    }
    const rs = [...zone.rulesets.values()].find((x) => x.id === rest[0]);
    if (!rs) throw new CfError(404, 10003, 'ruleset not found');
    const bump = () => {
      rs.version = String(Number(rs.version) + 1);
      rs.last_updated = now();
      return ok(rs);
    };
    if (rest[1] === 'rules' && rest.length === 2 && M === 'POST') {
      rs.rules.push(this.makeRule(body));
      return bump();
    }
    if (rest[1] === 'rules' && rest.length === 3) {
      const i = rs.rules.findIndex((r) => r.id === rest[2]);
      if (i === -1) throw new CfError(404, 10004, 'rule not found');
      if (M === 'PATCH') {
        rs.rules[i] = this.makeRule({ ...rs.rules[i], ...body }, rs.rules[i]);
        return bump();
      }
      if (M === 'DELETE') {
        rs.rules.splice(i, 1);
        return bump();
      }
    }
    throw new CfError(405, 10405, 'Method not allowed');
  }

  // --- page rules, access rules, workers ---------------------------------------------------

  private pagerulesRoute(zone: FakeZone, M: string, ruleId: string | undefined, body: Json, q: Record<string, string>): Reply {
    if (!ruleId && M === 'GET') {
      let rows = zone.pagerules;
      if (q.status) rows = rows.filter((r) => r.status === q.status);
      rows = [...rows].sort((a, b) => (q.direction === 'asc' ? 1 : -1) * ((a.priority as number) - (b.priority as number)));
      return ok(rows);
    }
    if (!ruleId && M === 'POST') {
      if (!Array.isArray(body.targets) || !Array.isArray(body.actions))
        throw new CfError(400, 1004, 'Page Rule validation failed: targets and actions are required');
      const rule = {
        id: id32(),
        targets: body.targets,
        actions: body.actions,
        priority: body.priority ?? zone.pagerules.length + 1,
        status: body.status ?? 'disabled',
        created_on: now(),
        modified_on: now(),
      };
      zone.pagerules.push(rule);
      return ok(rule);
    }
    const i = zone.pagerules.findIndex((r) => r.id === ruleId);
    if (i === -1) throw new CfError(404, 1002, 'Invalid Page Rule identifier');
    if (M === 'GET') return ok(zone.pagerules[i]);
    if (M === 'PATCH' || M === 'PUT') {
      zone.pagerules[i] = { ...(M === 'PATCH' ? zone.pagerules[i] : { id: ruleId, created_on: zone.pagerules[i]!.created_on }), ...body, modified_on: now() };
      return ok(zone.pagerules[i]);
    }
    if (M === 'DELETE') {
      zone.pagerules.splice(i, 1);
      return ok({ id: ruleId });
    }
    throw new CfError(405, 10405, 'Method not allowed');
  }

  private accessRules(list: Json[], M: string, ruleId: string | undefined, body: Json, q: Record<string, string>, scope: { type: string; id: string }): Reply {
    if (!ruleId && M === 'GET') {
      let rows = list;
      if (q.mode) rows = rows.filter((r) => r.mode === q.mode);
      if (q['configuration.target']) rows = rows.filter((r) => (r.configuration as Json).target === q['configuration.target']);
      if (q['configuration.value']) rows = rows.filter((r) => (r.configuration as Json).value === q['configuration.value']);
      return paginate(rows, q, 'access', 20);
    }
    if (!ruleId && M === 'POST') {
      const c = body.configuration as { target?: string; value?: string } | undefined;
      if (!c?.target || !c.value) throw new CfError(400, 10014, 'firewallaccessrules.api.validation_error:configuration is required');
      if (list.some((r) => (r.configuration as Json).value === c.value && (r.configuration as Json).target === c.target)) {
        throw new CfError(400, 10009, 'firewallaccessrules.api.duplicate_of_existing');
      }
      const rule = {
        id: id32(),
        mode: body.mode,
        notes: body.notes ?? '',
        configuration: c,
        allowed_modes: ['block', 'challenge', 'whitelist', 'js_challenge', 'managed_challenge'],
        scope,
        created_on: now(),
        modified_on: now(),
      };
      list.push(rule);
      return ok(rule);
    }
    const i = list.findIndex((r) => r.id === ruleId);
    if (i === -1) throw new CfError(404, 10001, 'firewallaccessrules.api.not_found');
    if (M === 'PATCH') {
      list[i] = { ...list[i], ...body, modified_on: now() };
      return ok(list[i]);
    }
    if (M === 'DELETE') {
      list.splice(i, 1);
      return ok({ id: ruleId });
    }
    throw new CfError(405, 10405, 'Method not allowed');
  }

  private workersRoute(accountId: string, M: string, rest: string[], r: RecordedRequest): Reply {
    if (!this.workers.has(accountId)) this.workers.set(accountId, new Map());
    const scripts = this.workers.get(accountId)!;
    const view = (s: Json) => {
      const { modules: _m, metadata: _md, ...rest2 } = s;
      return rest2;
    };
    if (rest.length === 0 && M === 'GET') return ok([...scripts.values()].map(view));
    const name = rest[0];
    if (!name || rest.length !== 1) throw new CfError(404, 7000, 'No route for that URI');
    if (M === 'PUT') {
      const parts = r.multipart;
      if (!parts) throw new CfError(400, 10021, 'Uploads must be multipart/form-data with a metadata part');
      const metaPart = parts.find((p) => p.name === 'metadata');
      if (!metaPart) throw new CfError(400, 10021, 'No metadata part');
      const metadata = JSON.parse(metaPart.text) as Json;
      const main = metadata.main_module as string | undefined;
      if (!main) throw new CfError(400, 10021, 'Uncaught SyntaxError: Unexpected token export (no main_module: the upload is treated as a service worker)');
      const module = parts.find((p) => p.name === main);
      if (!module) throw new CfError(400, 10021, `No such module "${main}"`);
      if (!/export\s+default/.test(module.text)) throw new CfError(400, 10021, `Uncaught Error: No event handlers were registered. This script does nothing.`);
      const prev = scripts.get(name);
      const script = {
        id: name,
        etag: id32(),
        handlers: ['fetch'],
        created_on: (prev?.created_on as string | undefined) ?? now(),
        modified_on: now(),
        compatibility_date: metadata.compatibility_date,
        usage_model: 'standard',
        last_deployed_from: 'api',
        modules: parts.filter((p) => p.name !== 'metadata').map((p) => ({ name: p.name, type: p.type, text: p.text })),
        metadata,
      };
      scripts.set(name, script);
      return ok(view(script));
    }
    if (M === 'DELETE') {
      if (!scripts.has(name)) throw new CfError(404, 10007, 'This Worker does not exist on your account.');
      scripts.delete(name);
      return ok(null);
    }
    throw new CfError(405, 10405, 'Method not allowed');
  }

  // --- GraphQL Analytics ---------------------------------------------------------------------

  private graphql(body: Json): Reply {
    const gqlError = (message: string, code: string) => ({
      status: 200,
      body: { data: null, errors: [{ message, path: null, extensions: { code, timestamp: now() } }] },
    });
    if (typeof body.query !== 'string') return gqlError('query is required', 'parse');
    let doc;
    try {
      doc = parseGraphql(body.query);
    } catch (e) {
      return gqlError(`error parsing query: ${(e as Error).message}`, 'parse');
    }
    const vars = (body.variables ?? {}) as Record<string, unknown>;
    const viewer = doc.selections.find((s) => s.name === 'viewer');
    if (!viewer) return gqlError('unknown field', 'parse');
    const zonesSel = viewer.selections.find((s) => s.name === 'zones');
    if (!zonesSel) return gqlError('only zones are served by this fake', 'parse');
    const filter = gqlValue(zonesSel.args.filter ?? { kind: 'lit', value: null }, vars) as { zoneTag?: string } | null;
    const zone = filter?.zoneTag ? this.zones.get(filter.zoneTag) : undefined;
    if (!zone) return gqlError(`zone '${String(filter?.zoneTag)}' does not exist or is not accessible`, 'authz');
    const out: Json = {};
    for (const ds of zonesSel.selections) {
      const args = {
        limit: gqlValue(ds.args.limit ?? { kind: 'lit', value: 100 }, vars) as number,
        filter: (gqlValue(ds.args.filter ?? { kind: 'lit', value: null }, vars) ?? {}) as Record<string, string>,
        orderBy: (gqlValue(ds.args.orderBy ?? { kind: 'list', items: [] }, vars) ?? []) as string[],
      };
      const key = ds.alias ?? ds.name;
      if (ds.name === 'httpRequests1dGroups') out[key] = this.dailyRows(zone, ds, args);
      else if (ds.name === 'firewallEventsAdaptiveGroups') out[key] = this.eventGroups(zone, ds, args);
      else return gqlError(`unknown field "${ds.name}"`, 'parse');
    }
    return { status: 200, body: { data: { viewer: { zones: [out] } }, errors: null } };
  }

  private dailyRows(zone: FakeZone, ds: GqlField, a: { limit: number; filter: Record<string, string>; orderBy: string[] }): Json[] {
    const f = a.filter;
    let days = [...zone.daily.entries()]
      .filter(
        ([d]) =>
          (!f.date_geq || d >= f.date_geq) &&
          (!f.date_leq || d <= f.date_leq) &&
          (!f.date_lt || d < f.date_lt) &&
          (!f.date_gt || d > f.date_gt) &&
          (!f.date || d === f.date),
      )
      .sort(([x], [y]) => x.localeCompare(y));
    if (a.orderBy.includes('date_DESC')) days = days.reverse();
    const maps: Record<string, (s: DayStats) => Json[]> = {
      countryMap: (s) => Object.entries(s.countries).map(([c, v]) => ({ clientCountryName: c, ...v })),
      responseStatusMap: (s) => Object.entries(s.status).map(([c, n]) => ({ edgeResponseStatus: Number(c), requests: n })),
      contentTypeMap: (s) => Object.entries(s.contentTypes).map(([c, v]) => ({ edgeResponseContentTypeName: c, ...v })),
    };
    return days.slice(0, a.limit).map(([date, s]) =>
      project(ds.selections, {
        dimensions: { date },
        sum: Object.fromEntries(
          Object.entries(s)
            .filter(([k]) => typeof (s as unknown as Json)[k] === 'number')
            .concat(Object.entries(maps).map(([k, fn]) => [k, fn(s)])),
        ),
        uniq: { uniques: s.uniques },
      }),
    );
  }

  private eventGroups(zone: FakeZone, ds: GqlField, a: { limit: number; filter: Record<string, string> }): Json[] {
    const f = a.filter;
    const events = zone.firewallEvents.filter(
      (e) =>
        (!f.datetime_geq || e.datetime >= f.datetime_geq) &&
        (!f.datetime_lt || e.datetime < f.datetime_lt) &&
        (!f.datetime_leq || e.datetime <= f.datetime_leq),
    );
    const dims = ds.selections.find((s) => s.name === 'dimensions')?.selections.map((s) => s.name) ?? [];
    const groups = new Map<string, { dims: Json; count: number }>();
    for (const e of events) {
      const d = Object.fromEntries(dims.map((k) => [k, (e as unknown as Json)[k] ?? '']));
      const k = JSON.stringify(d);
      const g = groups.get(k) ?? { dims: d, count: 0 };
      g.count++;
      groups.set(k, g);
    }
    return [...groups.values()]
      .sort((x, y) => y.count - x.count)
      .slice(0, a.limit)
      .map((g) => project(ds.selections, { count: g.count, dimensions: g.dims }));
  }
}

/** Keeps only the selected fields, as a GraphQL server answers. */
function project(sel: GqlField[], value: unknown): Json {
  const out: Json = {};
  for (const s of sel) {
    const v = (value as Json | undefined)?.[s.name];
    const key = s.alias ?? s.name;
    if (!s.selections.length) out[key] = v ?? 0;
    else if (Array.isArray(v)) out[key] = v.map((x) => project(s.selections, x));
    else out[key] = project(s.selections, v ?? {});
  }
  return out;
}

function zoneView(z: FakeZone): Json {
  return {
    id: z.id,
    name: z.name,
    status: z.status,
    paused: z.paused,
    type: z.type,
    development_mode: z.devModeUntil ? Math.round((z.devModeUntil - Date.now()) / 1000) : 0,
    name_servers: z.name_servers,
    original_name_servers: z.original_name_servers,
    account: z.account,
    owner: { id: z.account.id, type: 'organization', name: z.account.name },
    permissions: ['#zone:read', '#zone:edit'],
    plan: z.plan,
    meta: { step: 2, phishing_detected: false },
    created_on: z.created_on,
    modified_on: z.modified_on,
    activated_on: z.activated_on,
  };
}

function ok(result: unknown, result_info?: Json): Reply {
  return { status: 200, body: { success: true, errors: [], messages: [], result, ...(result_info ? { result_info } : {}) } };
}

function fail(status: number, code: number, message: string): Reply {
  return { status, body: { success: false, errors: [{ code, message }], messages: [], result: null } };
}

function paginate<T>(rows: T[], q: Record<string, string>, kind: keyof typeof PER_PAGE_MAX, defaultPerPage = 20): Reply {
  const page = Math.max(1, parseInt(q.page ?? '1', 10) || 1);
  const perPage = Math.min(PER_PAGE_MAX[kind]!, Math.max(1, parseInt(q.per_page ?? String(defaultPerPage), 10) || defaultPerPage));
  const slice = rows.slice((page - 1) * perPage, page * perPage);
  return ok(slice, { page, per_page: perPage, count: slice.length, total_count: rows.length, total_pages: Math.max(1, Math.ceil(rows.length / perPage)) });
}

export async function startFakeCloudflare(opts: { token?: string; accounts?: Array<{ id: string; name: string }> } = {}): Promise<FakeCloudflare> {
  return new FakeCloudflare(opts.token, opts.accounts).start();
}
