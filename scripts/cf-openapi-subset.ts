/**
 * Cuts Cloudflare's OpenAPI description down to what the edge tools call, for the tests' request
 * checker (test/helpers/cf-openapi.ts); the full file is 4 MB (390 kB gzipped), almost all of it other products.
 *
 *   npx tsx scripts/cf-openapi-subset.ts <openapi.json or .json.gz> [out.json]
 *
 * The source is Cloudflare's published description (github.com/cloudflare/api-schemas, openapi.json
 * as of 2024-08-06; BSD-3-Clause, test/fixtures/cloudflare-openapi-LICENSE). Kept: the operations
 * below, exactly as published (the whole operation object, path-level parameters included), and
 * every component reachable from them or from EXTRA_ROOTS by `$ref` or discriminator mapping,
 * transitively. Nothing is edited; corrections live in the checker's ERRATA.
 *
 * OPERATIONS is what the edge tools send (src/tools/edge/*.ts), as matched by the checker while the
 * edge tests ran (test/unit/edge). A tool that calls a new endpoint needs it added here and the
 * subset regenerated; until then the checker reports "no such path" or "has no <METHOD>".
 * The full file used for the committed subset is in git history:
 *   git show 5c34031:test/fixtures/cloudflare-openapi-2024-08-06.json.gz > /tmp/cf.json.gz
 */
import fs from 'node:fs';
import path from 'node:path';
import { gunzipSync } from 'node:zlib';

const OPERATIONS: Array<[template: string, methods: string[]]> = [
  ['/accounts', ['get']],
  ['/accounts/{account_identifier}/firewall/access_rules/rules', ['get', 'post']],
  ['/accounts/{account_id}/workers/scripts', ['get']],
  ['/accounts/{account_id}/workers/scripts/{script_name}', ['put', 'delete']],
  ['/zones', ['get', 'post']],
  ['/zones/{zone_id}', ['get']],
  ['/zones/{zone_id}/dns_records', ['get', 'post']],
  ['/zones/{zone_id}/dns_records/{dns_record_id}', ['get', 'patch', 'delete']],
  ['/zones/{zone_id}/firewall/access_rules/rules', ['get', 'post']],
  ['/zones/{zone_id}/firewall/access_rules/rules/{identifier}', ['patch']],
  ['/zones/{zone_id}/pagerules', ['get', 'post']],
  ['/zones/{zone_id}/pagerules/{pagerule_id}', ['patch', 'delete']],
  ['/zones/{zone_id}/purge_cache', ['post']],
  ['/zones/{zone_id}/rulesets/phases/{ruleset_phase}/entrypoint', ['get', 'put']],
  ['/zones/{zone_id}/rulesets/{ruleset_id}/rules', ['post']],
  ['/zones/{zone_id}/rulesets/{ruleset_id}/rules/{rule_id}', ['patch', 'delete']],
  ['/zones/{zone_id}/settings', ['get']],
  ['/zones/{zone_id}/settings/{setting_id}', ['get', 'patch']],
  ['/zones/{zone_id}/ssl/universal/settings', ['get']],
  ['/zones/{zone_id}/ssl/verification', ['get']],
];

/** Components the checker uses directly: DNS records in POST /zones/{zone_id}/dns_records/batch (newer than the file). */
const EXTRA_ROOTS = ['#/components/schemas/dns-records_dns-record'];

const SOURCE = 'Cloudflare API description, openapi.json of github.com/cloudflare/api-schemas as of 2024-08-06';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type Obj = { [k: string]: Json };

const [input, outArg] = process.argv.slice(2);
if (!input) {
  process.stderr.write('usage: npx tsx scripts/cf-openapi-subset.ts <openapi.json[.gz]> [out.json]\n');
  process.exit(2);
}
const out = outArg ?? path.resolve(import.meta.dirname, '../test/fixtures/cloudflare-openapi-2024-08-06.subset.json');
const raw = fs.readFileSync(input);
const full = JSON.parse((raw[0] === 0x1f && raw[1] === 0x8b ? gunzipSync(raw) : raw).toString('utf8')) as Obj;
const fullPaths = full.paths as Record<string, Obj>;
const fullComponents = full.components as Record<string, Obj>;

// In the file's own order: the checker takes the first of equally specific templates that match.
const order = Object.keys(fullPaths);
const wanted = [...OPERATIONS].sort(([a], [b]) => order.indexOf(a) - order.indexOf(b));
const paths: Record<string, Obj> = {};
for (const [template, methods] of wanted) {
  const item = fullPaths[template];
  if (!item) throw new Error(`${template} is not in ${input}`);
  const kept: Obj = {};
  if (item.parameters) kept.parameters = item.parameters;
  for (const m of methods) {
    if (!item[m]) throw new Error(`${template} has no ${m.toUpperCase()} in ${input}`);
    kept[m] = item[m]!;
  }
  paths[template] = kept;
}

// Templates left out that a kept one could be mistaken for: same length, and each segment the same
// literal or a parameter on either side (e.g. /zones/{zone_id}/dns_records/export next to
// /zones/{zone_id}/dns_records/{dns_record_id}). The checker matches them too, so a request for one
// fails as "left out of the subset" instead of passing as the kept template.
const segs = (t: string) => t.split('/').filter(Boolean);
const isParam = (seg: string) => /^\{.+\}$/.test(seg);
const compatible = (a: string[], b: string[]) => a.length === b.length && a.every((x, i) => x === b[i] || isParam(x) || isParam(b[i]!));
const kept = Object.keys(paths).map(segs);
const leftOut = order.filter((t) => !paths[t] && kept.some((k) => compatible(k, segs(t))));

// Every component reachable from the kept operations: `$ref`s and discriminator mapping values alike
// are strings of the form #/components/<kind>/<name>.
const components: Record<string, Obj> = {};
const seen = new Set<string>();
const queue: string[] = [...EXTRA_ROOTS];
const collect = (node: Json): void => {
  if (typeof node === 'string') {
    if (node.startsWith('#/components/')) queue.push(node);
  } else if (Array.isArray(node)) node.forEach(collect);
  else if (node && typeof node === 'object') Object.values(node).forEach(collect);
};
collect(paths as unknown as Json);
while (queue.length) {
  const ref = queue.pop()!;
  if (seen.has(ref)) continue;
  seen.add(ref);
  const [, , kind, ...rest] = ref.split('/');
  const name = rest.join('/').replace(/~1/g, '/').replace(/~0/g, '~');
  const target = fullComponents[kind!]?.[name];
  if (target === undefined) throw new Error(`${ref} is referenced but not in ${input}`);
  (components[kind!] ??= {})[name] = target;
  collect(target);
}
for (const kind of Object.keys(components)) {
  components[kind] = Object.fromEntries(Object.entries(components[kind]!).sort(([a], [b]) => a.localeCompare(b)));
}

const subset = {
  openapi: full.openapi,
  info: full.info,
  servers: full.servers,
  'x-tollgate-subset': {
    source: SOURCE,
    license: 'BSD-3-Clause, test/fixtures/cloudflare-openapi-LICENSE',
    generated_by: 'npx tsx scripts/cf-openapi-subset.ts <openapi.json[.gz]> (full file: git show 5c34031:test/fixtures/cloudflare-openapi-2024-08-06.json.gz)',
    paths: Object.keys(paths).length,
    operations: OPERATIONS.reduce((n, [, m]) => n + m.length, 0),
    components: Object.fromEntries(Object.entries(components).map(([k, v]) => [k, Object.keys(v).length])),
    left_out_paths: leftOut,
  },
  paths,
  components,
};
fs.writeFileSync(out, JSON.stringify(subset, null, 1) + '\n');
const bytes = fs.statSync(out).size;
process.stdout.write(
  `${out}: ${Object.keys(paths).length} paths, ${subset['x-tollgate-subset'].operations} operations, ${seen.size} components, ${leftOut.length} look-alike paths left out, ${bytes} bytes\n`,
);
