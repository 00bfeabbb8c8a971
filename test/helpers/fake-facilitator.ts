import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { SettleRequestSchema, VerifyRequestSchema } from 'x402/types';
import { PaymentPayloadV2Schema, PaymentRequirementsV2Schema } from '@x402/core/schemas';

/**
 * A local x402 facilitator speaking the real wire format of both protocol versions: GET /supported
 * ({kinds, extensions, signers}), POST /verify and POST /settle with {x402Version, paymentPayload,
 * paymentRequirements}. v1 bodies are checked with the `x402` package's schemas, v2 bodies with
 * `@x402/core`'s, so a test passing here means a real facilitator would parse them too.
 * By default it accepts everything and "settles" with a transaction hash derived from the nonce;
 * tests script refusals, failures, garbage and silence.
 */

export interface SupportedKind {
  x402Version: number;
  scheme: string;
  network: string;
}

/** What the fake lists on /supported unless told otherwise: exact on Base Sepolia, both versions. */
export const DEFAULT_KINDS: SupportedKind[] = [
  { x402Version: 2, scheme: 'exact', network: 'eip155:84532' },
  { x402Version: 1, scheme: 'exact', network: 'base-sepolia' },
];

export type Scripted = { status?: number; body: unknown } | { raw: string; status: number; contentType?: string } | 'hang';

type Body = {
  x402Version: number;
  paymentPayload: { network?: string; payload: { authorization: { from: string; nonce: string } } };
  paymentRequirements: { network: string };
};

export interface FakeFacilitator {
  url: string;
  /** Every request, parsed, in arrival order. */
  requests: Array<{ path: string; body: Body }>;
  /** Next answers of /verify or /settle (used once each, in order); then the defaults again. */
  script(path: '/verify' | '/settle', ...answers: Scripted[]): void;
  close(): Promise<void>;
}

export function fakeTxHash(nonce: string): string {
  return `0x${createHash('sha256').update(nonce).digest('hex')}`;
}

function defaults(path: string, body: Body): Scripted {
  const auth = body.paymentPayload.payload.authorization;
  if (path === '/verify') return { body: { isValid: true, payer: auth.from } };
  return { body: { success: true, transaction: fakeTxHash(auth.nonce), network: body.paymentRequirements.network, payer: auth.from } };
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

const V2RequestSchema = {
  safeParse(body: unknown) {
    const b = body as { paymentPayload?: unknown; paymentRequirements?: unknown };
    const payload = PaymentPayloadV2Schema.safeParse(b?.paymentPayload);
    if (!payload.success) return payload;
    return PaymentRequirementsV2Schema.safeParse(b?.paymentRequirements);
  },
};

export async function startFakeFacilitator(opts: { kinds?: SupportedKind[] } = {}): Promise<FakeFacilitator> {
  const queues: Record<string, Scripted[]> = { '/verify': [], '/settle': [] };
  const requests: FakeFacilitator['requests'] = [];
  const hanging = new Set<ServerResponse>();

  const server = createServer(async (req, res) => {
    const path = req.url ?? '';
    if (req.method === 'GET' && path === '/supported') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ kinds: opts.kinds ?? DEFAULT_KINDS, extensions: [], signers: {} }));
      return;
    }
    if (req.method !== 'POST' || !(path in queues)) {
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'not found' }));
      return;
    }
    let body: unknown;
    try {
      body = await readJson(req);
    } catch {
      res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'body is not JSON' }));
      return;
    }
    const version = (body as { x402Version?: unknown })?.x402Version;
    const schema = version === 2 ? V2RequestSchema : path === '/verify' ? VerifyRequestSchema : SettleRequestSchema;
    const parsed = schema.safeParse(body);
    if (!parsed.success || (version !== 1 && version !== 2)) {
      res
        .writeHead(400, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: 'invalid request', issues: parsed.success ? ['x402Version must be 1 or 2'] : parsed.error.issues }));
      return;
    }
    requests.push({ path, body: body as Body });
    const answer = queues[path]!.shift() ?? defaults(path, body as Body);
    if (answer === 'hang') {
      hanging.add(res);
      return;
    }
    if ('raw' in answer) {
      res.writeHead(answer.status, { 'content-type': answer.contentType ?? 'text/html' }).end(answer.raw);
      return;
    }
    res.writeHead(answer.status ?? 200, { 'content-type': 'application/json' }).end(JSON.stringify(answer.body));
  });

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    script(path, ...answers) {
      queues[path]!.push(...answers);
    },
    async close() {
      for (const res of hanging) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
