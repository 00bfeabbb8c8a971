import { z } from 'zod';
import { defineTool } from '../types.js';
import { checkAborted, sig } from './stats.js';
import { bad, MAX_TASKS, parseCargoLock, parsePackageLock, parsePnpmLock, parseTasks, type ParsedGraph } from './lockfiles.js';

/**
 * magnum_dependency_dag: the dependency graph of a task list or a lockfile.
 * - Edges run in execution order: dependency → dependent (it must be done first).
 * - cycles: Tarjan's strongly connected components; for each cyclic component, the shortest cycle
 *   through its first node (in input order), listed so that each node is a dependency of the next
 *   and the last a dependency of the first. A component that is one cycle is listed exactly.
 * - layers: topological levels (level 0 depends on nothing); the members of a cycle share a level.
 * - critical_path: the chain with the largest total duration (packages count 1 each); null while
 *   the graph has cycles (a longest path is not defined then: break them first).
 * - fan_in_top: the nodes most others depend on directly; duplicates: one package name at several
 *   versions; mermaid: a `graph LR` of the critical path and the busiest nodes, capped.
 * Ties are broken by input order. Listed ids are capped (see the counts beside each list).
 */

/** Listing caps, so a result stays far below TOOL_MAX_RESULT_BYTES (1 MB) even with 200-character ids. */
const LAYER_IDS = 10_000;
const LAYER_CHARS = 250_000;
const LAYER_WIDTH = 200;
const CYCLES_LISTED = 50;
const CYCLE_IDS = 5_000;
const CYCLE_CHARS = 100_000;
const PATH_IDS = 2_000;
const PATH_CHARS = 100_000;
const DUPLICATES = 500;
const DUPLICATE_VERSIONS = 50;

/** The first ids of a list that fit in `chars` characters (at least one when any is given). */
function within(ids: string[], chars: number): string[] {
  const out: string[] = [];
  let used = 0;
  for (const id of ids) {
    if (out.length && used + id.length + 3 > chars) break;
    used += id.length + 3;
    out.push(id);
  }
  return out;
}

const Task = z.object({
  id: z.union([z.string(), z.number()]).describe('Task id, unique'),
  depends_on: z
    .array(z.union([z.string(), z.number()]))
    .optional()
    .describe('Ids of the tasks this one waits for'),
  duration: z.number().optional().describe('How long it takes (any unit; default 1)'),
});

const Input = z.object({
  manifest: z
    .union([
      z.string().min(1).max(1_000_000),
      z.array(Task).max(MAX_TASKS),
      z.object({ tasks: z.array(Task).max(MAX_TASKS) }).passthrough(),
      z.object({ packages: z.record(z.unknown()) }).passthrough(),
    ])
    .describe(
      'The graph: a task list ([{id, depends_on, duration}] or {"tasks": [...]}, up to 50,000 tasks; as JSON or as its text), or the text of a package-lock.json (v2/v3), pnpm-lock.yaml or Cargo.lock (≤ 1,000,000 characters; the request body is capped at 1 MiB)',
    ),
  format: z
    .enum(['auto', 'tasks', 'package-lock', 'pnpm-lock', 'cargo-lock'])
    .default('auto')
    .describe('What the manifest is (default auto: detected from its content)'),
  top_k: z.number().int().min(1).max(100).default(10).describe('How many nodes fan_in_top lists (default 10)'),
  mermaid_max_nodes: z.number().int().min(0).max(300).default(60).describe('Most nodes drawn in the mermaid diagram (default 60; 0 leaves it out)'),
});

const Output = z.object({
  format: z.enum(['tasks', 'package-lock', 'pnpm-lock', 'cargo-lock']),
  nodes: z.number().int(),
  edges: z.number().int(),
  is_dag: z.boolean(),
  cycle_count: z.number().int(),
  cycles: z.array(z.array(z.string())),
  layer_count: z.number().int(),
  layers: z.array(z.object({ level: z.number().int(), count: z.number().int(), nodes: z.array(z.string()) })),
  critical_path: z.object({ duration: z.number(), steps: z.number().int(), nodes: z.array(z.string()) }).nullable(),
  fan_in_top: z.array(z.object({ id: z.string(), dependents: z.number().int() })),
  duplicates: z.array(z.object({ name: z.string(), versions: z.array(z.string()) })),
  mermaid: z.string(),
});
type Out = z.infer<typeof Output>;

export const dependencyDag = defineTool({
  name: 'magnum_dependency_dag',
  description:
    'Dependency graph of up to 50,000 tasks (depends_on, duration) or of a package-lock.json, pnpm-lock.yaml or Cargo.lock: cycles, topological layers, critical path, fan-in, duplicate versions, mermaid.',
  tier: 'enterprise',
  priceCents: 20,
  family: 'math',
  input: Input,
  qField: 'manifest',
  qParse: 'text',
  progress: true,
  output:
    '{format, nodes, edges, is_dag, cycle_count, cycles[[id]], layer_count, layers[{level,count,nodes}], critical_path{duration,steps,nodes}|null, fan_in_top[{id,dependents}], duplicates[{name,versions}], mermaid}',
  outputSchema: Output,
  examples: [
    {
      manifest: [
        { id: 'design', duration: 3 },
        { id: 'backend', depends_on: ['design'], duration: 5 },
        { id: 'frontend', depends_on: ['design'], duration: 4 },
        { id: 'tests', depends_on: ['backend', 'frontend'], duration: 2 },
        { id: 'release', depends_on: ['tests'], duration: 1 },
      ],
    },
    {
      manifest:
        'version = 3\n\n[[package]]\nname = "app"\nversion = "0.1.0"\ndependencies = [\n "serde 1.0.200",\n "rand",\n]\n\n[[package]]\nname = "rand"\nversion = "0.8.5"\ndependencies = [\n "serde 1.0.100",\n]\n\n[[package]]\nname = "serde"\nversion = "1.0.100"\n\n[[package]]\nname = "serde"\nversion = "1.0.200"\n',
    },
    { manifest: '[{"id":"a","depends_on":["c"]},{"id":"b","depends_on":["a"]},{"id":"c","depends_on":["b"]},{"id":"d","depends_on":["c"]}]' },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 20_000, memoryMb: 512 },
  largestInput: () => ({
    // 50,000 tasks, each waiting on up to three earlier ones: a deep, wide DAG.
    manifest: Array.from({ length: MAX_TASKS }, (_, i) => ({
      id: i,
      depends_on: i ? [...new Set([i - 1, Math.floor(i / 2), (i * 7919) % i])] : [],
      duration: (i % 13) + 1,
    })),
    top_k: 100,
    mermaid_max_nodes: 300,
  }),
  handler: async (input, ctx): Promise<Out> => {
    await ctx.progress({ stage: 'parsing' });
    const g = parse(input.manifest, input.format);
    checkAborted(ctx.signal);
    await ctx.progress({ stage: 'analysing', done: 0, total: g.ids.length, unit: 'nodes' });
    const out = analyse(g, input.top_k, input.mermaid_max_nodes, ctx.signal);
    await ctx.progress({ stage: 'done', done: g.ids.length, total: g.ids.length, unit: 'nodes' });
    return out;
  },
});

function parse(manifest: z.output<typeof Input>['manifest'], format: z.output<typeof Input>['format']): ParsedGraph {
  let value: unknown = manifest;
  let text: string | null = null;
  if (typeof manifest === 'string') {
    text = manifest;
    const t = manifest.trimStart();
    if (t.startsWith('{') || t.startsWith('[')) {
      try {
        value = JSON.parse(manifest);
      } catch {
        if (format === 'tasks' || format === 'package-lock' || t.startsWith('{')) throw bad('the manifest looks like JSON but does not parse');
        value = null; // a Cargo.lock starting with [[package]]
      }
    } else value = null;
  }
  let kind = format;
  if (kind === 'auto') {
    if (value !== null && typeof value === 'object') {
      const o = value as Record<string, unknown>;
      kind = Array.isArray(value) || Array.isArray(o.tasks) ? 'tasks' : 'lockfileVersion' in o || 'packages' in o ? 'package-lock' : 'tasks';
    } else if (text !== null && /^lockfileVersion:/m.test(text)) kind = 'pnpm-lock';
    else if (text !== null && /^\[\[package\]\]/m.test(text)) kind = 'cargo-lock';
    else throw bad('cannot tell what the manifest is: send a task list (JSON), package-lock.json, pnpm-lock.yaml or Cargo.lock, or set format');
  }
  switch (kind) {
    case 'tasks':
      return parseTasks(value);
    case 'package-lock':
      if (value === null || typeof value !== 'object') throw bad('package-lock.json must be JSON');
      return parsePackageLock(value);
    case 'pnpm-lock':
      if (text === null) throw bad('pnpm-lock.yaml must be sent as text');
      return parsePnpmLock(text);
    case 'cargo-lock':
      if (text === null) throw bad('Cargo.lock must be sent as text');
      return parseCargoLock(text);
  }
}

export function analyse(g: ParsedGraph, topK: number, mermaidMax: number, signal: AbortSignal): Out {
  const n = g.ids.length;
  // Execution edges u → v (v depends on u), deduplicated, in input order.
  const seen = new Set<number>();
  const outs: number[][] = Array.from({ length: n }, () => []);
  const ins: number[][] = Array.from({ length: n }, () => []);
  let edges = 0;
  for (const [v, u] of g.deps) {
    const key = u * n + v;
    if (seen.has(key)) continue;
    seen.add(key);
    outs[u]!.push(v);
    ins[v]!.push(u);
    edges++;
  }
  checkAborted(signal);

  // Tarjan, iterative. Components come out dependents-first; reversed, they are in execution order.
  const index = new Int32Array(n).fill(-1);
  const low = new Int32Array(n);
  const onStack = new Uint8Array(n);
  const comp = new Int32Array(n).fill(-1);
  const stack: number[] = [];
  const comps: number[][] = [];
  let counter = 0;
  for (let s = 0; s < n; s++) {
    if (index[s] !== -1) continue;
    const work: Array<[number, number]> = [[s, 0]];
    index[s] = low[s] = counter++;
    stack.push(s);
    onStack[s] = 1;
    while (work.length) {
      const top = work[work.length - 1]!;
      const [v, i] = top;
      if (i < outs[v]!.length) {
        top[1]++;
        const w = outs[v]![i]!;
        if (index[w] === -1) {
          index[w] = low[w] = counter++;
          stack.push(w);
          onStack[w] = 1;
          work.push([w, 0]);
        } else if (onStack[w]) low[v] = Math.min(low[v]!, index[w]!);
      } else {
        work.pop();
        if (work.length) {
          const p = work[work.length - 1]![0];
          low[p] = Math.min(low[p]!, low[v]!);
        }
        if (low[v] === index[v]) {
          const c: number[] = [];
          let w: number;
          do {
            w = stack.pop()!;
            onStack[w] = 0;
            comp[w] = comps.length;
            c.push(w);
          } while (w !== v);
          comps.push(c);
        }
      }
    }
    if (s % 4096 === 0) checkAborted(signal);
  }
  const order = comps.map((_, i) => comps.length - 1 - i); // components in execution order

  // Cycles.
  const cyclic = comps
    .map((c, ci) => ({ c, ci }))
    .filter(({ c }) => c.length > 1 || outs[c[0]!]!.includes(c[0]!))
    .map(({ c, ci }) => ({ first: Math.min(...c), ci }))
    .sort((a, b) => a.first - b.first);
  const cycles: string[][] = [];
  let cycleIds = 0;
  let cycleChars = 0;
  for (const { first, ci } of cyclic) {
    if (cycles.length >= CYCLES_LISTED || cycleIds >= CYCLE_IDS || cycleChars >= CYCLE_CHARS) break;
    const cyc = shortestCycle(first, ci, comp, outs);
    const listed = within(
      cyc.slice(0, CYCLE_IDS - cycleIds).map((i) => g.ids[i]!),
      CYCLE_CHARS - cycleChars,
    );
    cycleIds += listed.length;
    cycleChars += listed.reduce((a, id) => a + id.length + 3, 0);
    cycles.push(listed);
  }

  // Layers over the condensation.
  const level = new Int32Array(comps.length);
  for (const ci of order) {
    for (const u of comps[ci]!) for (const v of outs[u]!) if (comp[v] !== ci && level[comp[v]!]! < level[ci]! + 1) level[comp[v]!] = level[ci]! + 1;
  }
  let layerCount = 0;
  for (let ci = 0; ci < comps.length; ci++) layerCount = Math.max(layerCount, level[ci]! + 1);
  if (n === 0) layerCount = 0;
  const byLevel: number[][] = Array.from({ length: layerCount }, () => []);
  for (let v = 0; v < n; v++) byLevel[level[comp[v]!]!]!.push(v);
  const layers: Out['layers'] = [];
  let layerIds = 0;
  let layerChars = 0;
  for (let l = 0; l < layerCount && layerIds < LAYER_IDS && layerChars < LAYER_CHARS; l++) {
    const ids = within(
      byLevel[l]!.slice(0, Math.min(LAYER_WIDTH, LAYER_IDS - layerIds)).map((i) => g.ids[i]!),
      LAYER_CHARS - layerChars,
    );
    layerIds += ids.length;
    layerChars += ids.reduce((a, id) => a + id.length + 3, 0) + 30;
    layers.push({ level: l, count: byLevel[l]!.length, nodes: ids });
  }
  checkAborted(signal);

  // Critical path (DAG only).
  const dur = (v: number) => g.durations?.[v] ?? 1;
  let critical: Out['critical_path'] = null;
  let pathNodes: number[] = [];
  if (!cyclic.length && n > 0) {
    const start = new Float64Array(n);
    const pred = new Int32Array(n).fill(-1);
    let best = -1;
    let bestFinish = -Infinity;
    for (const ci of order) {
      const u = comps[ci]![0]!;
      const finish = start[u]! + dur(u);
      if (finish > bestFinish || (finish === bestFinish && u < best)) {
        bestFinish = finish;
        best = u;
      }
      for (const v of outs[u]!) {
        if (finish > start[v]! || (finish === start[v]! && pred[v] !== -1 && u < pred[v]!)) {
          start[v] = finish;
          pred[v] = u;
        }
      }
    }
    for (let v = best; v !== -1; v = pred[v]!) pathNodes.push(v);
    pathNodes = pathNodes.reverse();
    critical = {
      duration: sig(bestFinish, 12),
      steps: pathNodes.length,
      nodes: within(
        pathNodes.slice(0, PATH_IDS).map((i) => g.ids[i]!),
        PATH_CHARS,
      ),
    };
  }

  // Fan-in.
  const byFan = Array.from({ length: n }, (_, i) => i)
    .filter((i) => outs[i]!.length > 0)
    .sort((a, b) => outs[b]!.length - outs[a]!.length || a - b)
    .slice(0, topK);
  const fan_in_top = byFan.map((i) => ({ id: g.ids[i]!, dependents: outs[i]!.length }));

  // Duplicates.
  const duplicates: Out['duplicates'] = [];
  if (g.names) {
    const versions = new Map<string, string[]>();
    g.ids.forEach((id, i) => {
      const name = g.names![i]!;
      if (name.startsWith('importer:')) return;
      const v = id.slice(name.length + 1);
      versions.set(name, [...(versions.get(name) ?? []), v]);
    });
    for (const [name, vs] of versions)
      if (vs.length > 1 && duplicates.length < DUPLICATES) duplicates.push({ name, versions: vs.slice(0, DUPLICATE_VERSIONS) });
  }

  // Mermaid: cycles' nodes, the critical path, then the busiest nodes, then input order.
  let mermaid = '';
  if (mermaidMax > 0 && n > 0) {
    const chosen: number[] = [];
    const inSet = new Uint8Array(n);
    const add = (v: number) => {
      if (chosen.length < mermaidMax && !inSet[v]) {
        inSet[v] = 1;
        chosen.push(v);
      }
    };
    for (const { first, ci } of cyclic) for (const v of shortestCycle(first, ci, comp, outs)) add(v);
    for (const v of pathNodes) add(v);
    for (const v of byFan) add(v);
    for (let v = 0; v < n && chosen.length < mermaidMax; v++) add(v);
    chosen.sort((a, b) => a - b);
    const lines = ['graph LR'];
    for (const v of chosen)
      lines.push(
        `  n${v}["${g.ids[v]!.replace(/["\\]/g, "'")
          .replace(/[\r\n]/g, ' ')
          .slice(0, 80)}"]`,
      );
    let drawn = 0;
    for (const u of chosen)
      for (const v of outs[u]!)
        if (inSet[v]) {
          lines.push(`  n${u} --> n${v}`);
          drawn++;
        }
    if (chosen.length < n || drawn < edges) lines.push(`  %% showing ${chosen.length} of ${n} nodes and ${drawn} of ${edges} edges`);
    mermaid = lines.join('\n');
  }

  return {
    format: g.format,
    nodes: n,
    edges,
    is_dag: cyclic.length === 0,
    cycle_count: cyclic.length,
    cycles,
    layer_count: layerCount,
    layers,
    critical_path: critical,
    fan_in_top,
    duplicates,
    mermaid,
  };
}

/** The shortest cycle through `s` inside its component (BFS along execution edges), starting at s. */
function shortestCycle(s: number, ci: number, comp: Int32Array, outs: number[][]): number[] {
  if (outs[s]!.includes(s)) return [s];
  const prev = new Map<number, number>([[s, -1]]);
  const queue = [s];
  for (let h = 0; h < queue.length; h++) {
    const u = queue[h]!;
    for (const v of outs[u]!) {
      if (comp[v] !== ci) continue;
      if (v === s) {
        const path: number[] = [];
        for (let w = u; w !== -1; w = prev.get(w)!) path.push(w);
        return path.reverse();
      }
      if (!prev.has(v)) {
        prev.set(v, u);
        queue.push(v);
      }
    }
  }
  return [s];
}
