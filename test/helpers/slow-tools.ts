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

/** Registers the slow tools once per process. */
export function registerSlowTools(): void {
  for (const t of [testSleep, testCrash]) if (!findTool(t.name)) registerTool(t);
}
