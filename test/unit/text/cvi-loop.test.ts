import { describe, expect, it } from 'vitest';
import { cviLoop } from '../../../src/tools/text/cvi-loop.js';
import type { ToolStore } from '../../../src/tools/types.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

/** A store like accountStore: one map per account. */
function memoryStores() {
  const maps = new Map<string, Map<string, string>>();
  return (account: string): ToolStore => {
    const m = maps.get(account) ?? new Map<string, string>();
    maps.set(account, m);
    return {
      get: async <T>(k: string) => (m.has(k) ? (JSON.parse(m.get(k)!) as T) : null),
      set: async (k, v) => void m.set(k, JSON.stringify(v)),
      delete: async (k) => void m.delete(k),
      // These rounds are sent one after another: nothing to wait for.
      exclusive: async (_k, _o, fn) => ({ value: await fn() }),
    };
  };
}

const SOURCES = [{ id: 'report', text: 'In 2023 Acme had 340 employees. Revenue rose 12% to $4.2 million in 2023. Acme does not sell outside Europe.' }];

describe('cvi_loop (handler, in-memory store)', () => {
  const stores = memoryStores();
  const ctxA = makeToolContext({ store: stores('a'), accountId: 'a' }).ctx;
  const ctxB = makeToolContext({ store: stores('b'), accountId: 'b' }).ctx;
  const run = (input: unknown, ctx = ctxA) => cviLoop.handler(cviLoop.input.parse(input), ctx);

  it('rounds increment; statuses revise → stalled → pass; fixed_since_last quotes the fixed claims', async () => {
    const first = await run({ draft: 'Acme had 340 employees in 2023. Revenue rose 15% in 2023. Acme sells outside Europe.', sources: SOURCES, max_rounds: 4 });
    expect(first).toMatchObject({ round: 1, status: 'revise', claims: 3, supported: 1, fixed_since_last: [] });
    expect(first.failing.map((f) => f.verdict)).toEqual(['conflict', 'conflict']);
    expect(cviLoop.outputSchema!.safeParse(first).success).toBe(true);
    const second = await run({ loop_id: first.loop_id, draft: 'Acme had 340 employees in 2023. Revenue rose 12% in 2023. Acme sells outside Europe.' });
    expect(second).toMatchObject({ loop_id: first.loop_id, round: 2, status: 'revise', fixed_since_last: ['Revenue rose 15% in 2023.'] });
    const third = await run({ loop_id: first.loop_id, draft: 'Acme had 340 employees in 2023. Revenue rose 12% in 2023. Acme sells outside Europe.' });
    expect(third).toMatchObject({ round: 3, status: 'stalled' });
    const fourth = await run({ loop_id: first.loop_id, draft: 'Acme had 340 employees in 2023. Revenue rose 12% in 2023. Acme does not sell outside Europe.' });
    expect(fourth).toMatchObject({ round: 4, status: 'pass', failing: [], fixed_since_last: ['Acme sells outside Europe.'] });
    await expect(run({ loop_id: first.loop_id, draft: 'x y z.' })).rejects.toMatchObject({ code: 'invalid_input' });
  });

  it('exhausts at max_rounds; another account gets not_found; the same start gives the same loop_id', async () => {
    const a = await run({ draft: 'Acme has 999 employees.', sources: SOURCES, max_rounds: 2 });
    const again = await run({ draft: 'Acme has 999 employees.', sources: SOURCES, max_rounds: 2 });
    expect(again).toEqual(a);
    const b = await run({ loop_id: a.loop_id, draft: 'Acme has 998 employees.' });
    expect(b).toMatchObject({ round: 2, status: 'exhausted' });
    await expect(run({ loop_id: a.loop_id, draft: 'Acme has 340 employees.' }, ctxB)).rejects.toMatchObject({ code: 'not_found' });
  });

  it('refuses missing sources on start, bad loop ids, and input past the caps; needs a store', async () => {
    expect(cviLoop.input.safeParse({ draft: 'a' }).success).toBe(false);
    expect(cviLoop.input.safeParse({ draft: 'a', loop_id: 'nope' }).success).toBe(false);
    expect(cviLoop.input.safeParse({ draft: 'a', sources: ['b'], max_rounds: 11 }).success).toBe(false);
    expect(cviLoop.input.safeParse({ draft: 'x'.repeat(100_001), sources: ['b'] }).success).toBe(false);
    await expect(cviLoop.handler(cviLoop.input.parse(cviLoop.examples[0]), makeToolContext().ctx)).rejects.toMatchObject({ code: 'tool_unavailable' });
  });

  it('largestInput finishes within its limits', async () => {
    const t = cpuNow();
    const r = await run(cviLoop.largestInput!());
    expect(r.claims).toBe(50);
    expect(cpuNow() - t).toBeLessThan(cviLoop.limits!.timeMs ?? 5000);
  });
});
