/**
 * The TypeScript client (clients/typescript): a call, an async job (submit + wait) and an event stream.
 *   TOLLGATE_URL=http://localhost:8080 TOLLGATE_KEY=cv_... npx tsx examples/typescript.ts
 */
import { Tollgate, TollgateError } from '../clients/typescript/src/index.js';

const baseUrl = process.env.TOLLGATE_URL;
const apiKey = process.env.TOLLGATE_KEY;
if (!baseUrl || !apiKey) {
  console.error('Set TOLLGATE_URL (e.g. http://localhost:8080) and TOLLGATE_KEY (an API key, cv_...).');
  process.exit(2);
}

const tg = new Tollgate({ apiKey, baseUrl });

async function main(): Promise<void> {
  // 1. A call: the service runs the job and answers with its result, cost and the balance after it.
  const sync = await tg.call('compute', { expression: '6 * 7' });
  console.log(`call: 6 * 7 = ${sync.result.value} (cost ${sync.cost_cents} cents, ${sync.remaining_credits} credits left)`);

  // 2. An async job: submit answers at once with a job id; wait polls GET /jobs/{id} until it ends.
  const job = await tg.submit('compute', { expression: 'sqrt(2)' });
  console.log(`submit: job ${job.job_id} ${job.status}`);
  const done = await tg.wait<{ value: number }>(job.job_id, { timeoutMs: 60_000, pollMs: 250 });
  console.log(`wait: job ${job.job_id} completed: sqrt(2) = ${done.result.value} (cost ${done.cost_cents} cents)`);

  // 3. A stream: Server-Sent Events (queued, progress..., then result or error).
  let streamed: { value: unknown } | undefined;
  for await (const ev of tg.stream('compute', { expression: '2 ^ 10' })) {
    if (ev.event === 'queued') console.log(`stream: queued as ${ev.data.job_id}`);
    else if (ev.event === 'progress') console.log(`stream: progress ${JSON.stringify(ev.data)}`);
    else if (ev.event === 'result') streamed = ev.data.result;
    else if (ev.event === 'error') throw new Error(`stream ended in error: ${ev.data.error.code}: ${ev.data.error.message}`);
  }
  if (streamed === undefined) throw new Error('the stream ended without a result');
  console.log(`stream: 2 ^ 10 = ${streamed.value}`);
}

main().catch((err: unknown) => {
  if (err instanceof TollgateError) console.error(`FAILED: ${err.status} ${err.code}: ${err.message} (request ${err.requestId ?? '-'})`);
  else console.error('FAILED:', err);
  process.exit(1);
});
