import { describe, expect, it } from 'vitest';
import { checkRequest, parseGraphql, type RecordedRequest } from '../../helpers/cf-openapi.js';

/** The checker must reject wrong requests, or the suite's "fits the description" proves nothing. */
const Z = '023e105f4ecef8ad9ca31a8372d0c353';
const R = '372e67954025e0ba6aaa6d586b9e0b59';
const req = (method: string, path: string, body?: unknown, query: Record<string, string> = {}): RecordedRequest => ({ method, path, query, headers: {}, body });

describe('cf-openapi request checker', () => {
  it.each([
    ['a record create', req('POST', `/zones/${Z}/dns_records`, { type: 'A', name: 'app.example.com', content: '203.0.113.1', ttl: 1, proxied: true })],
    ['an MX create', req('POST', `/zones/${Z}/dns_records`, { type: 'MX', name: 'example.com', content: 'mx.example.net', priority: 10, ttl: 3600 })],
    ['a record delete without body', req('DELETE', `/zones/${Z}/dns_records/${R}`)],
    ['a setting change', req('PATCH', `/zones/${Z}/settings/ssl`, { value: 'strict' })],
    ['a listed zone query', req('GET', '/zones', undefined, { name: 'example.com', page: '1', per_page: '50' })],
    [
      'a zone IP block',
      req('POST', `/zones/${Z}/firewall/access_rules/rules`, { mode: 'block', configuration: { target: 'ip', value: '198.51.100.1' }, notes: 'x' }),
    ],
    [
      'a cache rule',
      req('POST', `/zones/${Z}/rulesets/${R}/rules`, {
        action: 'set_cache_settings',
        expression: 'true',
        description: 'd',
        enabled: true,
        action_parameters: { cache: true, edge_ttl: { mode: 'override_origin', default: 60 } },
      }),
    ],
    [
      'a batch',
      req('POST', `/zones/${Z}/dns_records/batch`, { deletes: [{ id: R }], posts: [{ type: 'A', name: 'a.example.com', content: '192.0.2.1', ttl: 1 }] }),
    ],
  ])('accepts %s', (_n, r) => {
    expect(checkRequest(r)).toEqual([]);
  });

  it.each([
    ['an unknown path', req('GET', `/zones/${Z}/dns_recordz`), 'no such path'],
    ['a method the path lacks', req('DELETE', `/zones/${Z}/purge_cache`), 'has no DELETE'],
    ['an undeclared query parameter', req('GET', '/zones', undefined, { nam: 'example.com' }), "query parameter 'nam' is not declared"],
    ['per_page above the maximum', req('GET', '/zones', undefined, { per_page: '500' }), 'query.per_page: above 50'],
    ['a zone id that is too long', req('GET', `/zones/${Z}${Z}`), 'longer than 32'],
    ['an A record with an IPv6 address', req('POST', `/zones/${Z}/dns_records`, { type: 'A', name: 'a.example.com', content: '2001:db8::1' }), 'matches none'],
    [
      'an MX without priority',
      req('POST', `/zones/${Z}/dns_records`, { type: 'MX', name: 'example.com', content: 'mx.example.net' }),
      "missing required field 'priority'",
    ],
    ['a TTL out of range', req('POST', `/zones/${Z}/dns_records`, { type: 'A', name: 'a.example.com', content: '192.0.2.1', ttl: 5 }), 'matches none'],
    [
      'an undeclared body field',
      req('POST', `/zones/${Z}/dns_records`, { type: 'A', name: 'a.example.com', content: '192.0.2.1', colour: 'red' }),
      "field 'colour' is not in the API description",
    ],
    ['a setting value outside its enum', req('PATCH', `/zones/${Z}/settings/ssl`, { value: 'superstrict' }), 'matches none'],
    [
      'a zone IP block without notes',
      req('POST', `/zones/${Z}/firewall/access_rules/rules`, { mode: 'block', configuration: { target: 'ip', value: '198.51.100.1' } }),
      "missing required field 'notes'",
    ],
    [
      'a ruleset rule with an unknown action',
      req('POST', `/zones/${Z}/rulesets/${R}/rules`, { action: 'explode', expression: 'true' }),
      "'explode' is none of",
    ],
    [
      'a page rule with an unknown action',
      req('POST', `/zones/${Z}/pagerules`, {
        targets: [{ target: 'url', constraint: { operator: 'matches', value: 'example.com/*' } }],
        actions: [{ id: 'teleport' }],
      }),
      'matches none',
    ],
    ['a zone create without account', req('POST', '/zones', { name: 'example.com' }), "missing required field 'account'"],
    ['a JSON body on a GET', req('GET', '/zones', { name: 'x' }), 'takes no request body'],
    ['a batch delete with extra fields', req('POST', `/zones/${Z}/dns_records/batch`, { deletes: [{ id: R, type: 'A' }] }), 'deletes take only id'],
    [
      'a batch post with an id',
      req('POST', `/zones/${Z}/dns_records/batch`, { posts: [{ id: R, type: 'A', name: 'a.example.com', content: '192.0.2.1' }] }),
      'posts must not carry an id',
    ],
    ['a batch patch without type', req('POST', `/zones/${Z}/dns_records/batch`, { patches: [{ id: R, content: '192.0.2.1' }] }), 'give the record type'],
    ['an empty batch', req('POST', `/zones/${Z}/dns_records/batch`, {}), 'the batch is empty'],
    ['an oversized batch', req('POST', `/zones/${Z}/dns_records/batch`, { deletes: Array.from({ length: 201 }, () => ({ id: R })) }), 'exceed the 200'],
  ])('rejects %s', (_n, r, problem) => {
    expect(checkRequest(r).join('\n')).toContain(problem);
  });

  it('checks worker uploads as module uploads', () => {
    const base = { method: 'PUT', path: `/accounts/${Z}/workers/scripts/hello`, query: {}, headers: {}, body: undefined };
    const good: RecordedRequest = {
      ...base,
      multipart: [
        { name: 'metadata', type: 'application/json', text: JSON.stringify({ main_module: 'worker.js', compatibility_date: '2024-09-23' }) },
        { name: 'worker.js', filename: 'worker.js', type: 'application/javascript+module', text: 'export default {}' },
      ],
    };
    expect(checkRequest(good)).toEqual([]);
    const serviceWorker: RecordedRequest = {
      ...base,
      multipart: [
        { name: 'metadata', type: 'application/json', text: JSON.stringify({ body_part: 'script' }) },
        { name: 'script', type: 'application/javascript', text: 'addEventListener()' },
      ],
    };
    expect(checkRequest(serviceWorker).join('\n')).toContain('main_module is missing');
  });

  describe('GraphQL', () => {
    const q = (query: string, variables: Record<string, unknown> = { zoneTag: Z }) => checkRequest(req('POST', '/graphql', { query, variables }));
    const ok =
      'query Q($zoneTag: string) { viewer { zones(filter: { zoneTag: $zoneTag }) { httpRequests1dGroups(limit: 7, filter: { date_geq: "2025-01-01" }) { dimensions { date } sum { requests countryMap { clientCountryName requests } } uniq { uniques } } } } }';

    it('accepts a documented query', () => expect(q(ok)).toEqual([]));
    it.each([
      ['an unknown dataset', ok.replace('httpRequests1dGroups', 'httpRequestsEverything'), 'not a dataset'],
      ['an unknown sum field', ok.replace('sum { requests', 'sum { requestz'), 'requestz is not a field'],
      ['a missing limit', ok.replace('limit: 7, ', ''), 'needs limit'],
      ['a filter key of another dataset', ok.replace('date_geq', 'datetime_geq'), 'has no key datetime_geq'],
      ['an undeclared variable', ok.replace('$zoneTag: string', '$zone: string'), '$zoneTag is used but not declared'],
      ['a scalar with a selection', ok.replace('uniq { uniques }', 'uniq { uniques { x } }'), 'is a scalar'],
      ['a broken query', 'query { viewer { zones(', 'does not parse'],
    ])('rejects %s', (_n, query, problem) => expect(q(query).join('\n')).toContain(problem));
    it('rejects a variable without a value', () => expect(q(ok, {}).join('\n')).toContain('$zoneTag has no value'));

    it('parses aliases, arguments, variables and nested selections', () => {
      const doc = parseGraphql(
        'query X($a: Date, $b: Time!) { viewer { zones(filter: {zoneTag: "z"}) { top: firewallEventsAdaptiveGroups(limit: 5, orderBy: [count_DESC], filter: {datetime_geq: $b}) { count dimensions { clientIP } } } } }',
      );
      expect(doc.variables).toEqual([
        { name: 'a', type: 'Date' },
        { name: 'b', type: 'Time!' },
      ]);
      const ds = doc.selections[0]!.selections[0]!.selections[0]!;
      expect(ds).toMatchObject({
        alias: 'top',
        name: 'firewallEventsAdaptiveGroups',
        args: { limit: { kind: 'lit', value: 5 }, orderBy: { kind: 'list', items: [{ kind: 'enum', value: 'count_DESC' }] } },
      });
    });
  });
});
