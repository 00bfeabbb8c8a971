/**
 * Test-only tools that run in the sandbox pool. They live in their own module, apart from the test
 * files, because a pool thread imports the module named by `isolated` and a test file cannot be
 * imported outside the test runner.
 */
import { threadId } from 'node:worker_threads';
import { z } from 'zod';
import { AppError } from '../../../src/errors.js';
import { defineTool } from '../../../src/tools/types.js';

const base = { tier: 'free', priceCents: 1, family: 'core', qField: 'q', output: 'test only', isolated: import.meta.url } as const;

/** Allocates until the heap cap stops it. */
export const hog = defineTool({
  ...base,
  name: 'test_sandbox_hog',
  description: 'Allocates without bound',
  input: z.object({ q: z.string().optional() }),
  examples: [{}],
  limits: { memoryMb: 64, timeMs: 20_000 },
  handler: async () => {
    const keep: number[][] = [];
    for (;;) keep.push(Array.from({ length: 100_000 }, (_, i) => i * Math.random()));
  },
});

/** Never returns: only the deadline stops it. */
export const spin = defineTool({
  ...base,
  name: 'test_sandbox_spin',
  description: 'Spins forever',
  input: z.object({ q: z.string().optional() }),
  examples: [{}],
  limits: { timeMs: 300 },
  handler: async () => {
    for (;;);
  },
});

/** Echoes its input with where it ran; reports progress and usage; waits `ms` first. */
export const echo = defineTool({
  ...base,
  name: 'test_sandbox_echo',
  description: 'Echoes its input',
  input: z.object({ q: z.string().optional(), ms: z.number().optional(), bytes: z.number().optional(), fail: z.enum(['app', 'plain']).optional() }),
  examples: [{ q: 'hi' }],
  handler: async ({ q, ms, bytes, fail }, ctx) => {
    await ctx.progress({ stage: 'echoing', done: 1, total: 1 });
    ctx.recordUsage({ echoes: 1 });
    ctx.log.info({ q }, 'echo from a thread');
    if (ms) await new Promise((r) => setTimeout(r, ms));
    if (fail === 'app') throw new AppError('tool_failed', 'echo was told to fail', { reason: 'asked' });
    if (fail === 'plain') throw new TypeError('echo broke');
    return { q: q ?? null, threadId, accountId: ctx.accountId, sandbox: ctx.sandbox, padding: bytes ? 'x'.repeat(bytes) : '' };
  },
});

export const testTools = [hog, spin, echo];
