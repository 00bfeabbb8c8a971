import { randomBytes } from 'node:crypto';
import { createServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, inject } from 'vitest';
import { z } from 'zod';
import type { Address } from 'viem';
import { decodeXPaymentResponse } from 'x402-fetch';
import { openPool, sql, type DatabasePool } from '../../src/db/pool.js';
import type { PaymentRequirements } from '../../src/pay/x402/requirements.js';
import { TEST_USDC_ABI, startChain, type Chain, type Wallet } from '../helpers/chain.js';
import { signPayment, toHeader } from '../helpers/x402-sign.js';
import { RedisServer, ServiceProcess, dropDatabase, freePort, freshDatabase, waitForHttp } from './rig.js';

/**
 * x402 payments across an API crash (issue 31). The API (self-settling on anvil, through a JSON-RPC
 * proxy of this test's) and a core worker run as processes; the proxy SIGKILLs the API at a chosen
 * moment of a paid call:
 *
 * - after the settlement transaction was sent and mined, before the API saw its receipt (so before it
 *   recorded the payment or answered): the reconciler must find the transfer and mark the payment
 *   settled once, and the payer's retry must get the result with the settlement's X-PAYMENT-RESPONSE;
 * - right after the payment was reserved, at its verification (the call never ran): released;
 * - after the answer was kept, as the transfer was about to be sent (never sent): still valid, so the
 *   reconciler settles it, once, and the retry gets the result.
 *
 * Then, per row: transfers on chain, the payment row, the ledger entries, what the retry got.
 */

const GRACE_SECONDS = 10;
const PRICE_ATOMIC = 20_000n;

let redis: RedisServer;
let dbUrl: string;
let pool: DatabasePool;
let chain: Chain;
let proxy: RpcProxy;
let api: ServiceProcess;
let worker: ServiceProcess;
let apiEnv: NodeJS.ProcessEnv;
let base: string;
let payTo: Address;
const rows: string[] = [];

type KillAt = 'after_sent' | 'at_verify' | 'before_send';

/**
 * Forwards JSON-RPC to anvil. Armed with a moment, it SIGKILLs the API there and drops the request:
 * `at_verify` on the first eth_call (verification, after the nonce was reserved), `before_send` on
 * eth_sendRawTransaction (not forwarded), `after_sent` on the first request after
 * eth_sendRawTransaction was forwarded and answered (the transfer is mined: anvil automines).
 */
class RpcProxy {
  private server!: Server;
  url = '';
  private armed: { at: KillAt; sent: boolean; kill: () => Promise<void>; fired: () => void } | null = null;

  constructor(private readonly target: string) {}

  async start(): Promise<void> {
    this.server = createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const body = Buffer.concat(chunks);
      const methods = [JSON.parse(body.toString('utf8'))].flat().map((m: { method: string }) => m.method);
      const a = this.armed;
      const fire =
        a &&
        ((a.at === 'at_verify' && methods.includes('eth_call')) ||
          (a.at === 'before_send' && methods.includes('eth_sendRawTransaction')) ||
          (a.at === 'after_sent' && a.sent));
      if (a && fire) {
        this.armed = null;
        await a.kill();
        a.fired();
        res.destroy();
        return;
      }
      const answer = await forward(this.target, body);
      if (a?.at === 'after_sent' && methods.includes('eth_sendRawTransaction')) a.sent = true;
      res.writeHead(answer.status, { 'content-type': 'application/json' }).end(answer.body);
    });
    this.server.listen(0, '127.0.0.1');
    await new Promise((r) => this.server.once('listening', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** Resolves once the API was killed at `at`. */
  arm(at: KillAt, kill: () => Promise<void>): Promise<void> {
    return new Promise((fired) => {
      this.armed = { at, sent: false, kill, fired };
    });
  }

  close(): Promise<void> {
    return new Promise((r) => this.server.close(() => r()));
  }
}

function forward(target: string, body: Buffer): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const r = httpRequest(target, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 502, body: Buffer.concat(chunks) }));
    });
    r.on('error', reject);
    r.end(body);
  });
}

beforeAll(async () => {
  redis = new RedisServer(await freePort());
  await redis.start();
  const [db, c] = await Promise.all([freshDatabase(inject('databaseUrl'), 'payreconcile'), startChain()]);
  dbUrl = db;
  chain = c;
  pool = await openPool(dbUrl, { maximumPoolSize: 2 });
  proxy = new RpcProxy(chain.rpcUrl);
  await proxy.start();
  const settler = await chain.newWallet();
  payTo = (await chain.newWallet()).address;
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  apiEnv = {
    ...process.env,
    REDIS_URL: redis.url,
    DATABASE_URL: dbUrl,
    REDIS_PREFIX: 'payreconcile',
    PORT: String(port),
    HOST: '127.0.0.1',
    EDGE_TOKEN_KEY: randomBytes(32).toString('hex'),
    WORKER_LOCK_MS: '2000',
    SYNC_TIMEOUT_MS: '10000',
    RECONCILE_SECONDS: '1',
    X402_ENABLED: 'true',
    X402_PAY_TO: payTo,
    X402_RPC_URL: proxy.url,
    X402_SETTLER_PRIVATE_KEY: settler.privateKey,
    X402_SETTLE_TIMEOUT_MS: '5000',
    // Authorizations stay valid well past the grace period and a restart, so "settle now" is the decision.
    X402_MAX_TIMEOUT_SECONDS: '600',
    X402_RECONCILE_GRACE_SECONDS: String(GRACE_SECONDS),
    LOG_LEVEL: 'error',
  };
  worker = new ServiceProcess('worker', ['workers/index.ts', '--family', 'core'], apiEnv);
  worker.start();
  await startApi();
}, 180_000);

afterAll(async () => {
  process.stdout.write(`\n${HEADER}\n${rows.join('\n')}\n`);
  for (const p of [api, worker]) await p?.kill();
  await proxy?.close();
  await pool?.end();
  await chain?.stop();
  await redis?.stop();
  if (dbUrl) await dropDatabase(dbUrl);
}, 60_000);

async function startApi(): Promise<void> {
  api = new ServiceProcess('api', ['src/server.ts'], { ...apiEnv, WORKERS: 'off' });
  api.start();
  await waitForHttp(base, false, 120_000);
}

const HEADER = 'fault                                          transfers  payment   ledger  retry                       payTo +atomic';

type Answer = { status: number; headers: Headers | null; body: Record<string, any> | null };

async function post(body: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  try {
    const r = await fetch(`${base}/tools/compute`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
    return { status: r.status, headers: r.headers, body: (await r.json().catch(() => null)) as Record<string, any> | null };
  } catch {
    return { status: 0, headers: null, body: null };
  }
}

async function paymentHeader(payer: Wallet, body: unknown): Promise<string> {
  const offer = await post(body);
  expect(offer.status).toBe(402);
  return toHeader(await signPayment(offer.body!.accepts[0] as PaymentRequirements, { privateKey: payer.privateKey }));
}

const Row = z.object({ id: z.string(), status: z.string(), tx_hash: z.string().nullable(), error: z.string().nullable() });
const rowsOf = (payer: Address) =>
  pool.any(sql.type(Row)`SELECT id, status, tx_hash, error FROM x402_payments WHERE payer = ${payer.toLowerCase()} ORDER BY created_at`);
const ledgerOf = (payer: Address) =>
  pool.any(sql.type(z.object({ delta_cents: z.number() }))`SELECT delta_cents::int AS delta_cents FROM ledger WHERE payer = ${payer.toLowerCase()}`);

/** Token transfers out of `payer`'s address, on chain. */
async function transfersFrom(payer: Address): Promise<number> {
  const logs = await chain.publicClient.getLogs({
    address: chain.usdc,
    event: TEST_USDC_ABI.find((x) => x.type === 'event' && x.name === 'Transfer') as Extract<
      (typeof TEST_USDC_ABI)[number],
      { type: 'event'; name: 'Transfer' }
    >,
    args: { from: payer },
    fromBlock: 0n,
  });
  return logs.length;
}

/** A paid call during which the proxy kills the API at `at`; the caller's connection drops. */
async function crashedCall(at: KillAt, body: unknown): Promise<{ payer: Wallet; header: string }> {
  const payer = await chain.newWallet();
  await chain.mint(payer.address, 1_000_000n);
  const header = await paymentHeader(payer, body);
  const killed = proxy.arm(at, () => api.kill('SIGKILL'));
  const res = await post(body, { 'X-PAYMENT': header });
  await killed;
  expect(res.status).toBe(0);
  return { payer, header };
}

/** Retries the same request with the same payment until it is not 409 (the settlement still open). */
async function retry(body: unknown, header: string, deadline: number): Promise<Answer> {
  for (;;) {
    const r = await post(body, { 'X-PAYMENT': header });
    if (r.status !== 409 || Date.now() > deadline) return r;
    await sleep(1_000);
  }
}

/** Waits until the payment is no longer reserved (the restarted API's reconciler decided). */
async function decided(payer: Address, deadline: number) {
  for (;;) {
    const [row] = await rowsOf(payer);
    if (row && row.status !== 'reserved') return row;
    if (Date.now() > deadline) throw new Error(`payment of ${payer} still reserved`);
    await sleep(500);
  }
}

describe('the API is killed in the middle of a paid call', () => {
  it('mined but unrecorded, never settled, kept but unsent: each ends settled once or released, and the retry gets the result', async () => {
    const payToBefore = await chain.balanceOf(payTo);

    const mined = await crashedCall('after_sent', { expression: '6*7' });
    // Killed after the transfer: it is on chain, the row is still reserved with its transaction.
    expect(await transfersFrom(mined.payer.address)).toBe(1);
    expect(await rowsOf(mined.payer.address)).toMatchObject([{ status: 'reserved', tx_hash: expect.stringMatching(/^0x[0-9a-f]{64}$/) }]);
    await startApi();

    const never = await crashedCall('at_verify', { expression: '2+3' });
    expect(await rowsOf(never.payer.address)).toMatchObject([{ status: 'reserved', tx_hash: null }]);
    await startApi();

    const unsent = await crashedCall('before_send', { expression: '9*9' });
    expect(await transfersFrom(unsent.payer.address)).toBe(0);
    await startApi();

    const deadline = Date.now() + 60_000;
    const results: Array<{ label: string; payer: Address; header: string; body: unknown; expect: 'settled' | 'failed'; value?: number }> = [
      {
        label: 'SIGKILL after the transfer was mined',
        payer: mined.payer.address,
        header: mined.header,
        body: { expression: '6*7' },
        expect: 'settled',
        value: 42,
      },
      { label: 'SIGKILL at verification (never ran)', payer: never.payer.address, header: never.header, body: { expression: '2+3' }, expect: 'failed' },
      {
        label: 'SIGKILL before the transfer was sent',
        payer: unsent.payer.address,
        header: unsent.header,
        body: { expression: '9*9' },
        expect: 'settled',
        value: 81,
      },
    ];
    for (const r of results) {
      const row = await decided(r.payer, deadline);
      const again = await retry(r.body, r.header, deadline);
      const transfers = await transfersFrom(r.payer);
      const ledger = await ledgerOf(r.payer);
      rows.push(
        `${r.label.padEnd(46)} ${String(transfers).padStart(9)}  ${row.status.padEnd(8)} ${String(ledger.length).padStart(7)}  ` +
          `${`${again.status} ${again.body?.code ?? (again.body?.result?.value !== undefined ? `value ${again.body.result.value}` : '')}`.padEnd(27)} ${r.expect === 'settled' ? PRICE_ATOMIC : 0n}`,
      );
      expect(row.status).toBe(r.expect);
      if (r.expect === 'settled') {
        // Exactly once: one transfer, one settled row, one ledger entry; the retry gets the result and the transaction.
        expect(transfers).toBe(1);
        expect(await rowsOf(r.payer)).toHaveLength(1);
        expect(ledger).toEqual([{ delta_cents: -2 }]);
        expect(await chain.balanceOf(r.payer)).toBe(1_000_000n - PRICE_ATOMIC);
        expect(again.status).toBe(200);
        expect(again.body!.result.value).toBe(r.value);
        expect(decodeXPaymentResponse(again.headers!.get('X-PAYMENT-RESPONSE')!)).toMatchObject({ success: true, transaction: row.tx_hash });
      } else {
        expect(transfers).toBe(0);
        expect(ledger).toEqual([]);
        expect(row.error).toBe('reconcile: released, the call never reached settlement (its API process stopped)');
        expect(await chain.balanceOf(r.payer)).toBe(1_000_000n);
        expect(again.status).toBe(402);
        expect(again.body!.code).toBe('payment_already_used');
      }
    }
    // The payee got two prices: nothing twice, nothing for the call that never ran.
    expect(await chain.balanceOf(payTo)).toBe(payToBefore + 2n * PRICE_ATOMIC);
  });
});
