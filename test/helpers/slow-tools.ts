import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { defineTool } from '../../src/tools/types.js';
import { findTool, registerTool } from '../../src/tools/index.js';

/** When each test_sleep call started, by its tag: fairness tests read when a call got a worker. */
export const sleepStarts = new Map<string, number>();

/** Test-only: waits `ms` (on the event loop, like a tool waiting on an upstream). Free, so nothing is charged. */
export const testSleep = defineTool({
  name: 'test_sleep',
  description: 'Test only: waits ms milliseconds',
  tier: 'free',
  priceCents: 0,
  family: 'web',
  input: z.object({ ms: z.number().int().min(0).max(60_000), tag: z.string().default('') }),
  qField: 'tag',
  output: '{slept}',
  examples: [{ ms: 10 }],
  handler: async ({ ms, tag }, ctx) => {
    sleepStarts.set(tag, Date.now());
    await sleep(ms, undefined, { signal: ctx.signal }).catch(() => {});
    return { slept: ms };
  },
});

/** Test-only: kills the process it runs in, as a native crash or the kernel's OOM killer would. Paid. */
export const testCrash = defineTool({
  name: 'test_crash',
  description: 'Test only: kills its worker process',
  tier: 'free',
  priceCents: 3,
  family: 'core',
  input: z.object({}),
  qField: '',
  output: 'never answers',
  examples: [{}],
  handler: async () => {
    process.kill(process.pid, 'SIGKILL');
    await sleep(60_000);
    return {};
  },
});

/** When each test_wait_signal call started and when its signal was aborted (ms since the epoch), by tag. */
export const signalWaits = new Map<string, { started: number; aborted?: number }>();

/**
 * Test-only: waits `ms` or until its signal is aborted (as a tool waiting on an upstream that honours
 * the signal), then throws the abort; otherwise answers. Paid (2 cents), so charges can be checked.
 */
export const testWaitSignal = defineTool({
  name: 'test_wait_signal',
  description: 'Test only: waits ms milliseconds or until cancelled',
  tier: 'free',
  priceCents: 2,
  family: 'web',
  input: z.object({ ms: z.number().int().min(0).max(60_000).default(30_000), tag: z.string().default('') }),
  qField: 'tag',
  output: '{waited}',
  examples: [{ ms: 10 }],
  handler: async ({ ms, tag }, ctx) => {
    const w: { started: number; aborted?: number } = { started: Date.now() };
    signalWaits.set(tag, w);
    ctx.signal.addEventListener('abort', () => (w.aborted = Date.now()), { once: true });
    await sleep(ms, undefined, { signal: ctx.signal });
    return { waited: ms, tag };
  },
});

/**
 * Test-only: a paid call on the `edge` family, whose jobs stay queued in a harness started without
 * edge workers (so cancel tests have jobs that never start).
 */
export const testParked = defineTool({
  name: 'test_parked',
  description: 'Test only: a paid no-op on the edge family',
  tier: 'free',
  priceCents: 3,
  family: 'edge',
  input: z.object({ tag: z.string().default('') }),
  qField: 'tag',
  output: '{ok}',
  examples: [{}],
  handler: async () => ({ ok: true }),
});

/** Registers the slow tools once per process. */
export function registerSlowTools(): void {
  for (const t of [testSleep, testCrash, testWaitSignal, testParked]) if (!findTool(t.name)) registerTool(t);
}
