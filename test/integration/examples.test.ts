import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startFakeFacilitator, type FakeFacilitator } from '../helpers/fake-facilitator.js';
import { startFakeOpenAI, type FakeOpenAI } from '../helpers/fake-openai.js';
import { startHarness, type Harness, type TestAccount } from '../helpers/harness.js';
import { PAY_TO } from '../helpers/x402-sign.js';

/**
 * Every script in examples/ run as a child process, as a user would run it, against a live service
 * listening on a free port: workers for the tool families they call, a fake model upstream for the
 * chat completion, and x402 settled through a local fake facilitator. Each must exit 0 and print its
 * key line. The scripts run one after another.
 */

const ROOT = join(import.meta.dirname, '../..');
const EXAMPLES = join(ROOT, 'examples');

let h: Harness;
let llm: FakeOpenAI;
let facilitator: FakeFacilitator;
let baseUrl: string;
let acct: TestAccount;

beforeAll(async () => {
  llm = await startFakeOpenAI();
  facilitator = await startFakeFacilitator();
  h = await startHarness(
    { LLM_BASE_URL: llm.baseURL, X402_ENABLED: 'true', X402_PAY_TO: PAY_TO, X402_FACILITATOR_URL: facilitator.url },
    { workers: ['core', 'llm'] },
  );
  baseUrl = await h.app.listen({ port: 0, host: '127.0.0.1' });
  acct = await h.account('enterprise', 10_000);
});
afterAll(async () => {
  await h?.close();
  await llm?.close();
  await facilitator?.close();
});

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(file: string, args: string[], extraEnv: Record<string, string> = {}): Promise<Run> {
  const env: NodeJS.ProcessEnv = {
    ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('TOLLGATE_') && !k.startsWith('X402_'))),
    TOLLGATE_URL: baseUrl,
    TOLLGATE_KEY: acct.apiKey,
    NO_COLOR: '1',
    ...extraEnv,
  };
  return new Promise((resolve) => {
    execFile(file, args, { cwd: ROOT, env, timeout: 30_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      resolve({ code, stdout: String(stdout), stderr: String(stderr) });
    });
  });
}

/** `npx tsx <script>`, without npx's start-up: node with tsx's loader. */
const tsx = (script: string, env?: Record<string, string>) => run(process.execPath, ['--import', 'tsx', join(EXAMPLES, script)], env);

function ok(r: Run): string {
  expect(r.code, `exit ${r.code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`).toBe(0);
  return r.stdout;
}

describe('examples/', () => {
  it('curl.sh: a sync call, an async job polled to completion, and the balance', async () => {
    const out = ok(await run('sh', [join(EXAMPLES, 'curl.sh')]));
    expect(out).toMatch(/^sync: 6 \* 7 = 42 \(cost 2 cents, 9998 credits left\)$/m);
    expect(out).toMatch(/^async: job \S+ completed: sqrt\(2\) = 1\.414213562\d* \(cost 2 cents\)$/m);
    expect(out).toMatch(/^balance: 9996 credits on plan enterprise$/m);
  });

  it('typescript.ts: call, submit + wait, stream with the TypeScript client', async () => {
    const out = ok(await tsx('typescript.ts'));
    expect(out).toMatch(/^call: 6 \* 7 = 42 \(cost 2 cents, \d+ credits left\)$/m);
    expect(out).toMatch(/^wait: job \S+ completed: sqrt\(2\) = 1\.414213562\d* \(cost 2 cents\)$/m);
    expect(out).toMatch(/^stream: queued as \S+$/m);
    expect(out).toMatch(/^stream: 2 \^ 10 = 1024$/m);
  });

  it('python.py: call, submit + wait, stream with the Python client', async () => {
    const out = ok(await run('python3', [join(EXAMPLES, 'python.py')], { PYTHONPATH: join(ROOT, 'clients/python'), PYTHONDONTWRITEBYTECODE: '1' }));
    expect(out).toMatch(/^call: 6 \* 7 = 42 \(cost 2 cents, \d+ credits left\)$/m);
    expect(out).toMatch(/^wait: job \S+ completed: sqrt\(2\) = 1\.414213562\d* \(cost 2 cents\)$/m);
    expect(out).toMatch(/^stream: queued as \S+$/m);
    expect(out).toMatch(/^stream: 2 \^ 10 = 1024$/m);
  });

  it('mcp.ts: tools/list and a charged tools/call over Streamable HTTP', async () => {
    const out = ok(await tsx('mcp.ts'));
    expect(out).toMatch(/^tools: \d+ \(/m);
    expect(out).toMatch(/^compute: 6 \* 7 = 42 \(cost 2 cents, \d+ credits left\)$/m);
  });

  it('openai.ts: the models and one chat completion from the fake model upstream', async () => {
    llm.enqueue({ type: 'tokens', tokens: ['Walk ', 'it ', 'with ', 'three ', 'pointers.'] });
    const out = ok(await tsx('openai.ts'));
    expect(out).toMatch(/^models: .*svc-hints/m);
    expect(out).toMatch(/^svc-hints: Walk it with three pointers\.$/m);
    expect(out).toMatch(/cost 5 cents/);
  });

  it('x402.ts: the 402, a signed v2 payment settled through the facilitator, the paid result', async () => {
    const key = generatePrivateKey();
    const before = await h.credits(acct.accountId);
    const out = ok(await tsx('x402.ts', { TOLLGATE_KEY: '', X402_PAYER_KEY: key }));
    expect(out).toMatch(/^402: 0\.02 USDC on base-sepolia \(20000 atomic units of 0x\S+ to 0x\S+, network eip155:84532\)$/m);
    expect(out).toMatch(/^paid: 6 \* 7 = 42 \(cost 2 cents, paid per call\)$/m);
    expect(out).toMatch(/^settlement: success=true transaction=0x[0-9a-f]{64} network=eip155:84532$/m);
    // The facilitator verified and settled this payer's payment; no account was charged.
    const payer = privateKeyToAccount(key).address;
    const paths = facilitator.requests.filter((r) => r.body.paymentPayload.payload.authorization.from === payer).map((r) => r.path);
    expect(paths).toEqual(['/verify', '/settle']);
    expect(await h.credits(acct.accountId)).toBe(before);
  });
});
