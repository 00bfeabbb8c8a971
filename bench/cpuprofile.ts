/**
 * Reads the .cpuprofile files `node --cpu-prof` writes and sums self time by function, only over the
 * samples inside a time window (the measured calls, not start-up): V8's profile timestamps and
 * process.hrtime in the bench are both CLOCK_MONOTONIC microseconds.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

interface ProfileNode {
  id: number;
  children?: number[];
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  hitCount?: number;
}
interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

export interface SelfTime {
  key: string;
  fn: string;
  where: string;
  area: string;
  ms: number;
}
export interface ProfileSummary {
  file: string;
  pid: number;
  thread: number;
  windowMs: number;
  /** Sampled ms inside the window, without (idle). */
  busyMs: number;
  idleMs: number;
  inWindow: boolean;
  top: SelfTime[];
  areas: Array<[string, number]>;
}

/** Files of `pid` in `dir`: CPU.<date>.<time>.<pid>.<thread>.<seq>.cpuprofile. */
export function profilesOf(dir: string, pid: number): Array<{ file: string; thread: number }> {
  return readdirSync(dir)
    .map((f) => ({ f, m: /^CPU\.\d+\.\d+\.(\d+)\.(\d+)\.\d+\.cpuprofile$/.exec(f) }))
    .filter((x) => x.m && Number(x.m[1]) === pid)
    .map((x) => ({ file: join(dir, x.f), thread: Number(x.m![2]) }))
    .sort((a, b) => a.thread - b.thread);
}

const ROOT = '/work/main/';
function shorten(url: string): string {
  let u = url.replace(/^file:\/\//, '');
  const nm = u.lastIndexOf('/node_modules/');
  if (nm >= 0) u = u.slice(nm + '/node_modules/'.length);
  else {
    const cwd = process.cwd() + '/';
    if (u.startsWith(cwd)) u = u.slice(cwd.length);
    else if (u.startsWith(ROOT)) u = u.slice(ROOT.length);
  }
  return u;
}

/** What part of the stack a frame is in: a package, a folder of src/, node's internals, V8. */
function areaOf(fn: string, url: string): string {
  if (!url) return fn.startsWith('(') ? fn : '(native/V8 builtins)';
  if (url.startsWith('node:')) return `node:${url.slice(5).split('/')[0]}`;
  const nm = url.lastIndexOf('/node_modules/');
  if (nm >= 0) {
    const rest = url.slice(nm + '/node_modules/'.length).split('/');
    return rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  const s = shorten(url);
  const parts = s.split('/');
  return parts.length > 2 ? `${parts[0]}/${parts[1]}` : parts[0]!;
}

export function summarise(file: string, pid: number, thread: number, window: [number, number] | null, topN = 25): ProfileSummary {
  const p = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, ProfileNode>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n);
  const at = (n: ProfileNode) => {
    const { url, lineNumber, columnNumber } = n.callFrame;
    // tsx's output of a src file is one line: the column says where.
    return url ? `${shorten(url)}:${lineNumber + 1}${lineNumber === 0 ? `:${columnNumber + 1}` : ''}` : '';
  };
  let [from, to] = window ?? [p.startTime, p.endTime];
  const inWindow = !window || (from < p.endTime && to > p.startTime);
  if (!inWindow) [from, to] = [p.startTime, p.endTime];
  const self = new Map<string, SelfTime>();
  const areas = new Map<string, number>();
  let t = p.startTime;
  let busy = 0;
  let idle = 0;
  for (let i = 0; i < p.samples.length; i++) {
    t += p.timeDeltas[i] ?? 0;
    if (t < from || t > to) continue;
    // A sample stands for the time until the next one.
    const dt = (p.timeDeltas[i + 1] ?? 0) / 1000;
    const node = byId.get(p.samples[i]!);
    if (!node) continue;
    const { functionName, url } = node.callFrame;
    const fn = functionName || '(anonymous)';
    if (fn === '(idle)') {
      idle += dt;
      continue;
    }
    busy += dt;
    // A native (writev, writeUtf8String...) says little alone: name the first caller outside node itself.
    let where = at(node);
    if (!url && !fn.startsWith('(')) {
      let up = parent.get(node.id);
      // Past node's own stream and socket layers, to the package or src code that wrote.
      while (up && (!up.callFrame.url || up.callFrame.url.startsWith('node:'))) up = parent.get(up.id);
      if (up) where = `<- ${up.callFrame.functionName || '(anonymous)'} ${at(up)}`;
    }
    const key = `${fn} ${where}`;
    const e = self.get(key) ?? { key, fn, where, area: areaOf(fn, url), ms: 0 };
    e.ms += dt;
    self.set(key, e);
    areas.set(e.area, (areas.get(e.area) ?? 0) + dt);
  }
  return {
    file,
    pid,
    thread,
    windowMs: (to - from) / 1000,
    busyMs: busy,
    idleMs: idle,
    inWindow,
    top: [...self.values()].sort((a, b) => b.ms - a.ms).slice(0, topN),
    areas: [...areas.entries()].sort((a, b) => b[1] - a[1]),
  };
}

/** A compact table: self ms, share of the busy time, per call, function, file:line. */
export function formatSummary(label: string, s: ProfileSummary, calls: number, topN = 25): string[] {
  const rows = [
    `${label}: pid ${s.pid} thread ${s.thread}, ${s.windowMs.toFixed(0)} ms window${s.inWindow ? '' : ' (window outside the profile: whole profile shown)'}, ` +
      `busy ${s.busyMs.toFixed(0)} ms (${(s.busyMs / calls).toFixed(3)} ms/call), idle ${s.idleMs.toFixed(0)} ms`,
    `  by area: ${s.areas
      .slice(0, 12)
      .map(([a, ms]) => `${a} ${((100 * ms) / s.busyMs).toFixed(1)}%`)
      .join(', ')}`,
    `  ${'self ms'.padStart(8)} ${'%busy'.padStart(6)} ${'us/call'.padStart(8)}  function  (file:line)`,
  ];
  for (const e of s.top.slice(0, topN)) {
    rows.push(
      `  ${e.ms.toFixed(1).padStart(8)} ${((100 * e.ms) / s.busyMs).toFixed(1).padStart(6)} ${((1000 * e.ms) / calls).toFixed(1).padStart(8)}  ${e.fn.slice(0, 48)}  ${e.where}`,
    );
  }
  return rows;
}
