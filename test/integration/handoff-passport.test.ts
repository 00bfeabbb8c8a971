import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness } from '../helpers/harness.js';

/** handoff with store: the brief computed in the pool is kept as a passport of the account afterwards. */

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ PASSPORT_KEY: 'ab'.repeat(32) }, { workers: ['text', 'core'] });
});
afterAll(async () => {
  await h?.close();
});

const transcript = 'user: Move the billing job to the new queue.\nassistant: We decided to keep retries at 3. TODO: update the runbook.';

describe('handoff store', () => {
  it('keeps brief_markdown as a passport the account can get, byte for byte', async () => {
    const acct = await h.account('enterprise', 0);
    const res = await h.call('handoff', { transcript, budget_tokens: 300, store: true, store_ttl_s: 3600 }, acct.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const { brief_markdown, passport } = json(res).result;
    expect(passport).toMatchObject({ handle: expect.stringMatching(/^pp_/), bytes: Buffer.byteLength(brief_markdown) });
    expect(passport.sha256).toBe(createHash('sha256').update(brief_markdown).digest('hex'));
    const expires = Date.parse(passport.expires_at) - Date.now();
    expect(expires).toBeGreaterThan(3500_000);
    expect(expires).toBeLessThanOrEqual(3600_000);
    const got = await h.call('passport_store', { action: 'get', handle: passport.handle }, acct.apiKey);
    expect(got.statusCode, got.body).toBe(200);
    expect(json(got).result.content).toBe(brief_markdown);
    // Another account cannot read it.
    const other = await h.account('enterprise', 0);
    expect((await h.call('passport_store', { action: 'get', handle: passport.handle }, other.apiKey)).statusCode).toBe(404);
  });

  it('without store, no passport is kept', async () => {
    const acct = await h.account('enterprise', 0);
    const res = await h.call('handoff', { transcript, budget_tokens: 300 }, acct.apiKey);
    expect(json(res).result.passport).toBeUndefined();
    const list = await h.call('passport_store', { action: 'list' }, acct.apiKey);
    expect(json(list).result.passports).toEqual([]);
  });
});
