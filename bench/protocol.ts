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

export interface ProtocolResult {
  rows: string[];
  /** p50 at 1 in flight of one POST /tools/compute and of a chain of three (POST /), same window. */
  singleP50: number;
  chainP50: number;
}

export async function protocolBench({ http, headers, drive, fmt }: BenchDeps): Promise<ProtocolResult> {
  const post = async (path: string, body: unknown, check: (b: any) => boolean) => {
    const r = await http.request({ path, method: 'POST', headers, body: JSON.stringify(body) });
    const text = await r.body.text();
    if (r.statusCode !== 200 || !check(JSON.parse(text))) throw new Error(`${path} answered ${r.statusCode}: ${text.slice(0, 300)}`);
  };
  const ops: Array<[string, () => Promise<void>]> = [
    ['1 single call (reference)        ', () => post('/tools/compute', { expression: Q }, (b) => b.result?.result === '14')],
    [
      '3 single calls, one after another',
      async () => {
        for (let i = 0; i < 3; i++) await post('/tools/compute', { expression: Q }, (b) => b.result?.result === '14');
      },
    ],
    [
      'chain of 3 (POST /)              ',
      () => post('/', { chain: ['compute', 'compute', 'compute'], q: Q }, (b) => b.steps?.length === 3 && b.cost_cents === 6),
    ],
    ['parallel of 3 (POST /)           ', () => post('/', { parallel: ['compute', 'compute', 'compute'], q: Q }, (b) => b.cost_cents === 6)],
  ];

  for (const [, op] of ops) await drive(5, 50, op); // warm-up: connections, JIT, flow producer
  const rows = ['', 'Root protocol: three compute calls per operation (latency is per operation, req/s = operations/s)'];
  let singleP50 = NaN;
  let chainP50 = NaN;
  for (const level of LEVELS) {
    for (const [i, [label, op]] of ops.entries()) {
      const s = await drive(level, COUNT[level]!, op);
      if (level === 1 && i === 0) singleP50 = s.p50;
      if (level === 1 && label.startsWith('chain')) chainP50 = s.p50;
      rows.push(`${i === 0 ? `in flight ${String(level).padStart(2)}` : '            '}  ${label} ${fmt(s)}`);
    }
  }
  return { rows, singleP50, chainP50 };
}
