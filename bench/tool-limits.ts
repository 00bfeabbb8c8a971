import pino from 'pino';
import { loadConfig, type Config } from '../src/config.js';
import { resolveLimits } from '../src/sandbox/limits.js';
import { SandboxPool } from '../src/sandbox/pool.js';
import { TOOLS } from '../src/tools/index.js';

/**
 * Each tool's worst case: the largest input its caps allow (`largestInput`), run in the sandbox pool
 * the way a call runs it, timed against its time limit. A tool whose worst case does not fit its
 * limit would fail honest callers with 422 limit_exceeded: the ratio must stay under 1.
 */
export async function toolLimitRows(config: Config = loadConfig(process.env, { LOG_LEVEL: 'warn' })): Promise<string[]> {
  const tools = TOOLS.filter((t) => t.largestInput && t.isolated);
  if (!tools.length) return [];
  const pool = new SandboxPool(config, pino({ level: 'warn' }));
  const rows: string[] = [];
  try {
    for (const tool of tools) {
      const limits = resolveLimits(config, tool.limits);
      const input = tool.input.parse(tool.largestInput!());
      // A first, untimed call loads the module in a thread (what preloading does in a worker).
      const ctx = { sandbox: false, accountId: 'bench', keyId: null };
      const call = { owner: 'bench', label: tool.name, limits: tool.limits };
      await pool.runTool(tool, tool.input.parse(tool.examples[0]), ctx, call);
      const t0 = performance.now();
      let outcome = 'ok';
      try {
        await pool.runTool(tool, input, ctx, call);
      } catch (e) {
        outcome = `FAILED (${(e as Error).message.slice(0, 80)})`;
      }
      const ms = performance.now() - t0;
      rows.push(
        `${tool.name.padEnd(24)} ${ms.toFixed(0).padStart(7)} ms  limit ${String(limits.timeMs).padStart(6)} ms  ratio ${(ms / limits.timeMs).toFixed(2)}  ${outcome}`,
      );
    }
  } finally {
    await pool.close();
  }
  return rows;
}

// `npm run bench:tools`: only this section.
if (import.meta.url === `file://${process.argv[1]}`) {
  const rows = await toolLimitRows();
  process.stdout.write(`\nWorst case per tool (largestInput in the sandbox pool, against its time limit)\n${rows.join('\n')}\n`);
}
