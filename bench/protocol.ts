/**
 * Root-protocol rows for `npm run bench` (bench/run.ts calls this against the inline service): a
 * chain of three and a parallel of three compute calls, each one POST /, next to the same three
 * calls made one after another with POST /tools/compute. Every call is a real 2-cent charge.
 */
import type { Pool } from 'undici';

interface Stats {
  rps: number;
  p50: number;
  p99: number;
  n: number;
}

interface BenchDeps {
  http: Pool;
  headers: Record<string, string>;
  drive: (inFlight: number, total: number, op: (i: number) => Promise<void>) => Promise<Stats>;
  fmt: (s: Stats) => string;
}

const LEVELS = [1, 10];
const COUNT: Record<number, number> = { 1: 200, 10: 1000 };
const Q = '2 * (3 + 4)';

export async function protocolBench({ http, headers, drive, fmt }: BenchDeps): Promise<string[]> {
  const post = async (path: string, body: unknown, check: (b: any) => boolean) => {
    const r = await http.request({ path, method: 'POST', headers, body: JSON.stringify(body) });
    const text = await r.body.text();
    if (r.statusCode !== 200 || !check(JSON.parse(text))) throw new Error(`${path} answered ${r.statusCode}: ${text.slice(0, 300)}`);
  };
  const ops: Array<[string, () => Promise<void>]> = [
    [
      '3 single calls, one after another',
      async () => {
        for (let i = 0; i < 3; i++) await post('/tools/compute', { expression: Q }, (b) => b.result?.result === '14');
      },
    ],
    ['chain of 3 (POST /)              ', () => post('/', { chain: ['compute', 'compute', 'compute'], q: Q }, (b) => b.steps?.length === 3 && b.cost_cents === 6)],
    ['parallel of 3 (POST /)           ', () => post('/', { parallel: ['compute', 'compute', 'compute'], q: Q }, (b) => b.cost_cents === 6)],
  ];

  for (const [, op] of ops) await drive(5, 50, op); // warm-up: connections, JIT, flow producer
  const rows = ['', 'Root protocol: three compute calls per operation (latency is per operation, req/s = operations/s)'];
  for (const level of LEVELS) {
    for (const [i, [label, op]] of ops.entries()) {
      const s = await drive(level, COUNT[level]!, op);
      rows.push(`${i === 0 ? `in flight ${String(level).padStart(2)}` : '            '}  ${label} ${fmt(s)}`);
    }
  }
  return rows;
}
