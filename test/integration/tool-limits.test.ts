import pino from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.js';
import { SandboxPool } from '../../src/sandbox/pool.js';
import { TOOLS } from '../../src/tools/index.js';
import { testEnv } from '../helpers/harness.js';

/**
 * Every tool's worst case (`largestInput`: the largest input its caps allow) runs in the sandbox
 * pool inside the tool's own time and memory limits, so an honest caller at the caps is answered,
 * never refused with 422 limit_exceeded. (`npm run bench` prints how close each comes.)
 */

const tools = TOOLS.filter((t) => t.largestInput && t.isolated);
const pool = new SandboxPool(loadConfig({}, testEnv({ LOG_LEVEL: 'warn' })), pino({ level: 'warn' }));

afterAll(async () => {
  await pool.close();
});

describe.skipIf(!tools.length)('largest allowed inputs', () => {
  it.each(tools.map((t) => [t.name, t] as const))(
    '%s finishes inside its limits',
    async (_name, tool) => {
      const input = tool.input.parse(tool.largestInput!());
      const out = await pool.runTool(
        tool,
        input,
        { sandbox: false, accountId: 'limits', keyId: null },
        { owner: 'limits', label: tool.name, limits: tool.limits },
      );
      if (tool.outputSchema) expect(tool.outputSchema.safeParse(out.value).success).toBe(true);
    },
    120_000,
  );
});
