import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness, type TestAccount } from '../helpers/harness.js';

/**
 * cvi_loop through the real path (HTTP, queue, event-loop handler with ctx.store, the cvi_round task
 * in the sandbox pool): rounds increment per account, and another account's loop_id is 404 not_found.
 */

let h: Harness;
let a: TestAccount;
let b: TestAccount;

beforeAll(async () => {
  h = await startHarness({}, { workers: ['text'] });
  a = await h.account('pro', 1000);
  b = await h.account('pro', 1000);
});

afterAll(async () => {
  await h?.close();
});

const sources = [{ id: 'report', text: 'In 2023 Acme had 340 employees. Revenue rose 12% to $4.2 million in 2023.' }];

describe('cvi_loop', () => {
  it('rounds increment for the owner; another account gets 404 not_found', async () => {
    const first = await h.call('cvi_loop', { draft: 'Acme had 340 employees in 2023. Revenue rose 15% in 2023.', sources, max_rounds: 3 }, a.apiKey);
    expect(first.statusCode, first.body).toBe(200);
    const r1 = json(first).result;
    expect(r1).toMatchObject({ round: 1, status: 'revise', supported: 1 });
    const second = await h.call('cvi_loop', { loop_id: r1.loop_id, draft: 'Acme had 340 employees in 2023. Revenue rose 12% in 2023.' }, a.apiKey);
    expect(second.statusCode, second.body).toBe(200);
    expect(json(second).result).toMatchObject({ loop_id: r1.loop_id, round: 2, status: 'pass', fixed_since_last: ['Revenue rose 15% in 2023.'] });

    const other = await h.call('cvi_loop', { loop_id: r1.loop_id, draft: 'Acme had 340 employees in 2023.' }, b.apiKey);
    expect(other.statusCode, other.body).toBe(404);
    expect(json(other).error).toMatchObject({ code: 'not_found' });
  });
});
