import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness } from '../helpers/harness.js';

/** The root protocol with text group A's tools: a chain that compresses then reads the tone, and a parallel of three. */

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(async () => {
  await h.close();
});

const root = (payload: unknown, key: string) =>
  h.request({ method: 'POST', url: '/', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, payload: JSON.stringify(payload) });

const LONG = Array.from(
  { length: 120 },
  (_, i) =>
    `Release ${i} of the service shipped on time. The team loves how fast the new queue is! Some users found the setup confusing at first. ` +
    `Support answered every ticket within an hour, which customers praised.`,
).join('\n');

describe('text tools through the root protocol', () => {
  it("chain beacon_compress → quick_vibe: the compressed text is the tone read's input; 2 + 5 = 7 cents", async () => {
    const acct = await h.account('pro', 1_000);
    const res = await root({ chain: ['beacon_compress', 'quick_vibe'], q: LONG }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const body = json(res);
    expect(body.steps.map((s: any) => [s.tool, s.cost_cents])).toEqual([
      ['beacon_compress', 2],
      ['quick_vibe', 5],
    ]);
    const compressed = body.steps[0].result;
    expect(compressed.tokens_before).toBeGreaterThan(512);
    expect(compressed.tokens_after).toBeLessThanOrEqual(512);
    expect(compressed.text.length).toBeLessThan(LONG.length);
    expect(LONG).toContain(compressed.text.split('\n')[0]);
    const vibe = body.result;
    expect(body.steps[1].result).toEqual(vibe);
    expect(vibe.language).toBe('eng');
    expect(['upbeat', 'positive', 'mixed']).toContain(vibe.vibe);
    // quick_vibe read the compressed text, not the original.
    expect(vibe.readability.words).toBeLessThan(LONG.split(/\s+/).length / 2);
    expect(body.cost_cents).toBe(7);
    expect(await h.credits(acct.accountId)).toBe(1_000 - 7);
  }, 60_000);

  it('parallel beacon_scan, quick_vibe, beacon_extract on one q: every result, charged the sum of list prices', async () => {
    const acct = await h.account('pro', 1_000);
    const q = 'I love this release! Write to ops@example.com or see https://example.com/docs before 2026-01-15.';
    const res = await root({ parallel: ['beacon_scan', 'quick_vibe', 'beacon_extract'], q }, acct.apiKey);
    expect(res.statusCode).toBe(200);
    const body = json(res);
    expect(Object.keys(body.results)).toEqual(['beacon_scan', 'quick_vibe', 'beacon_extract']);
    expect(body.results.beacon_scan.cost_cents).toBe(1);
    expect(body.results.quick_vibe.cost_cents).toBe(5);
    expect(body.results.beacon_extract.cost_cents).toBe(1);
    expect(body.results.beacon_scan.result.characters).toBe(q.length);
    // One excited sentence among plain ones: positive (upbeat needs a comparative of 0.2 or more).
    expect(body.results.quick_vibe.result).toMatchObject({ vibe: 'positive', language: 'eng', sentiment: { positive: ['love'] } });
    const entities = body.results.beacon_extract.result.entities;
    expect(entities.map((e: any) => e.type)).toEqual(expect.arrayContaining(['email', 'url', 'date']));
    for (const e of entities) expect(q.slice(e.start, e.end)).toBe(e.text);
    expect(body.cost_cents).toBe(1 + 5 + 1);
    expect(await h.credits(acct.accountId)).toBe(1_000 - 7);
  }, 60_000);
});
