import { AppError } from '../../errors.js';

/**
 * Parsers for magnum_dependency_dag: a task list (JSON), package-lock.json v2/v3 (the `packages`
 * map), pnpm-lock.yaml (v5 to v9, the block-mapping subset pnpm writes, parsed by hand: no YAML
 * library is installed) and Cargo.lock (the TOML subset cargo writes). Each gives nodes in
 * first-seen order and "depends on" pairs.
 */

export interface ParsedGraph {
  format: 'tasks' | 'package-lock' | 'pnpm-lock' | 'cargo-lock';
  /** Node ids in first-seen order. */
  ids: string[];
  /** Package name of each node (packages only), for duplicates. */
  names?: string[];
  durations?: number[];
  /** [node, dependency] index pairs: node depends on dependency. */
  deps: Array<[number, number]>;
}

export const MAX_TASKS = 50_000;
export const MAX_NODES = 100_000;

export function bad(message: string, path: Array<string | number> = ['manifest']): AppError {
  return new AppError('invalid_input', message, { issues: [{ path, message }] });
}

class Builder {
  ids: string[] = [];
  names: string[] = [];
  index = new Map<string, number>();
  deps: Array<[number, number]> = [];
  node(id: string, name = id): number {
    let i = this.index.get(id);
    if (i === undefined) {
      if (this.ids.length >= MAX_NODES) throw bad(`the manifest has more than ${MAX_NODES.toLocaleString('en')} packages`);
      i = this.ids.length;
      this.ids.push(id);
      this.names.push(name);
      this.index.set(id, i);
    }
    return i;
  }
}

// ---- tasks -------------------------------------------------------------------------------------

export function parseTasks(value: unknown): ParsedGraph {
  const list = Array.isArray(value) ? value : (value as { tasks?: unknown })?.tasks;
  if (!Array.isArray(list)) throw bad('a task manifest is a JSON array of {id, depends_on, duration} or {"tasks": [...]}');
  if (list.length > MAX_TASKS) throw bad(`at most ${MAX_TASKS.toLocaleString('en')} tasks (got ${list.length.toLocaleString('en')})`);
  const ids: string[] = [];
  const index = new Map<string, number>();
  const durations: number[] = [];
  list.forEach((t, i) => {
    if (!t || typeof t !== 'object') throw bad(`task ${i} is not an object`, ['manifest', i]);
    const id = (t as { id?: unknown }).id;
    if (typeof id !== 'string' && typeof id !== 'number') throw bad(`task ${i} has no id (a string or number)`, ['manifest', i, 'id']);
    const key = String(id);
    if (key.length > 200) throw bad(`task ${i}: ids are at most 200 characters`, ['manifest', i, 'id']);
    if (index.has(key)) throw bad(`task id "${key}" appears twice`, ['manifest', i, 'id']);
    const d = (t as { duration?: unknown }).duration ?? 1;
    if (typeof d !== 'number' || !Number.isFinite(d) || d < 0 || d > 1e12)
      throw bad(`task "${key}": duration must be a number from 0 to 10^12`, ['manifest', i, 'duration']);
    index.set(key, ids.length);
    ids.push(key);
    durations.push(d);
  });
  const deps: Array<[number, number]> = [];
  const missing: string[] = [];
  list.forEach((t, i) => {
    const on = (t as { depends_on?: unknown }).depends_on ?? [];
    if (!Array.isArray(on)) throw bad(`task "${ids[i]}": depends_on must be an array of ids`, ['manifest', i, 'depends_on']);
    for (const d of on) {
      const j = index.get(String(d));
      if (j === undefined) {
        if (missing.length < 10) missing.push(`${ids[i]} → ${String(d)}`);
        continue;
      }
      deps.push([i, j]);
    }
  });
  if (missing.length) throw bad(`depends_on names unknown tasks: ${missing.join(', ')}`);
  return { format: 'tasks', ids, durations, deps };
}

// ---- package-lock.json v2/v3 -----------------------------------------------------------------

interface LockEntry {
  name?: string;
  version?: string;
  link?: boolean;
  resolved?: string;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
  devDependencies?: Record<string, string>;
}

function nameFromPath(path: string): string {
  const at = path.lastIndexOf('node_modules/');
  return at < 0 ? path : path.slice(at + 'node_modules/'.length);
}

export function parsePackageLock(value: unknown): ParsedGraph {
  const lock = value as { lockfileVersion?: unknown; packages?: unknown; name?: string; version?: string };
  if (!lock.packages || typeof lock.packages !== 'object') {
    throw bad('package-lock.json needs the `packages` map (lockfileVersion 2 or 3); regenerate a v1 lockfile with npm 7 or later');
  }
  const packages = lock.packages as Record<string, LockEntry>;
  const b = new Builder();
  const idOf = (path: string, seen = 0): number | null => {
    const e = packages[path];
    if (!e) return null;
    if (e.link && typeof e.resolved === 'string' && seen < 8)
      return idOf(e.resolved, seen + 1) ?? b.node(`${nameFromPath(path)}@link:${e.resolved}`, nameFromPath(path));
    const name = e.name ?? (path === '' ? (lock.name ?? 'root') : nameFromPath(path));
    return b.node(`${name}@${e.version ?? (path === '' ? (lock.version ?? '0.0.0') : 'unknown')}`, name);
  };
  const resolve = (from: string, dep: string): string | null => {
    let base = from;
    for (;;) {
      const cand = `${base ? `${base}/` : ''}node_modules/${dep}`;
      if (packages[cand]) return cand;
      if (base === '') return null;
      const at = base.lastIndexOf('/node_modules/');
      base = at >= 0 ? base.slice(0, at) : '';
    }
  };
  const paths = Object.keys(packages);
  for (const path of paths) idOf(path);
  for (const path of paths) {
    const e = packages[path]!;
    if (e.link) continue;
    const from = idOf(path)!;
    const groups = [e.dependencies, e.optionalDependencies, e.peerDependencies, path === '' || !path.includes('node_modules/') ? e.devDependencies : undefined];
    for (const g of groups) {
      if (!g || typeof g !== 'object') continue;
      for (const dep of Object.keys(g)) {
        const target = resolve(path, dep);
        if (target === null) continue; // optional or peer dependency that is not installed
        const to = idOf(target);
        if (to !== null && to !== from) b.deps.push([from, to]);
      }
    }
  }
  return { format: 'package-lock', ids: b.ids, names: b.names, deps: b.deps };
}

// ---- pnpm-lock.yaml ----------------------------------------------------------------------------

type Yaml = { [k: string]: Yaml | string | string[] };

function unquote(s: string): string {
  s = s.trim();
  if ((s.startsWith("'") && s.endsWith("'")) || (s.startsWith('"') && s.endsWith('"'))) return s.slice(1, -1).replace(/''/g, "'");
  return s;
}

/** The block-mapping subset of YAML: `key: value`, nested by indentation, `- item` lists; flow values stay strings. */
export function parseYamlSubset(text: string): Yaml {
  const root: Yaml = {};
  const stack: Array<{ indent: number; node: Yaml; key?: string }> = [{ indent: -1, node: root }];
  const lines = text.split(/\r?\n/);
  for (const raw of lines) {
    if (!raw.trim() || raw.trimStart().startsWith('#')) continue;
    const indent = raw.length - raw.trimStart().length;
    const line = raw.trim();
    while (stack.length > 1 && indent <= stack[stack.length - 1]!.indent) stack.pop();
    const top = stack[stack.length - 1]!;
    if (line.startsWith('- ')) {
      // A list item of the key that opened this block.
      const parent = stack[stack.length - 1]!;
      const owner = stack[stack.length - 2];
      if (owner && parent.key !== undefined) {
        const cur = owner.node[parent.key];
        if (!Array.isArray(cur)) owner.node[parent.key] = [];
        (owner.node[parent.key] as string[]).push(unquote(line.slice(2)));
      }
      continue;
    }
    const m = /^((?:'[^']*'|"[^"]*"|[^:'"]+?)):(?:\s+(.*))?$/.exec(line);
    if (!m) continue;
    const key = unquote(m[1]!);
    const value = m[2]?.trim();
    if (value === undefined || value === '') {
      const child: Yaml = {};
      top.node[key] = child;
      stack.push({ indent, node: child, key });
    } else {
      top.node[key] = unquote(value);
    }
  }
  return root;
}

/** "name@1.2.3(peer@1)" (v6+, optional leading /) or "/name/1.2.3_peer@1" (v5) → [name, version]. */
function splitPnpmKey(key: string): [string, string] | null {
  let k = key.replace(/\(.*$/, '');
  const v5 = /^\/((?:@[^/]+\/)?[^/@]+)\/([^/]+)$/.exec(k);
  if (v5) return [v5[1]!, cleanVersion(v5[2]!)];
  if (k.startsWith('/')) k = k.slice(1);
  const at = k.lastIndexOf('@');
  if (at <= 0) return null;
  return [k.slice(0, at), cleanVersion(k.slice(at + 1))];
}

/** Drops peer suffixes: "(react@18.2.0)" (v6+) and "_react@18.2.0" (v5); semver has no "_". */
function cleanVersion(v: string): string {
  return v.replace(/\(.*$/, '').replace(/_.*$/, '').trim();
}

export function parsePnpmLock(text: string): ParsedGraph {
  const y = parseYamlSubset(text);
  if (!('lockfileVersion' in y)) throw bad('not a pnpm-lock.yaml (no lockfileVersion)');
  const b = new Builder();
  const pkgNode = (name: string, version: string): number => {
    const v = cleanVersion(version);
    // v5 references are "/name/version" and aliases "npm:..." are kept as written.
    const asKey = v.startsWith('/') ? splitPnpmKey(v) : null;
    if (asKey) return b.node(`${asKey[0]}@${asKey[1]}`, asKey[0]);
    return b.node(`${name}@${v}`, name);
  };
  const sections = [y.snapshots, y.packages].filter((s): s is Yaml => !!s && typeof s === 'object' && !Array.isArray(s));
  // Nodes for every package first (stable order), then edges from snapshots (v9) or packages.
  for (const s of sections)
    for (const key of Object.keys(s)) {
      const nv = splitPnpmKey(key);
      if (nv) pkgNode(nv[0], nv[1]);
    }
  const edgeSource = sections[0];
  const addDeps = (from: number, entry: Yaml | string | string[] | undefined) => {
    if (!entry || typeof entry !== 'object' || Array.isArray(entry)) return;
    for (const group of ['dependencies', 'optionalDependencies', 'devDependencies']) {
      const g = entry[group];
      if (!g || typeof g !== 'object' || Array.isArray(g)) continue;
      for (const [name, ref] of Object.entries(g)) {
        const version = typeof ref === 'string' ? ref : typeof ref === 'object' && !Array.isArray(ref) && typeof ref.version === 'string' ? ref.version : null;
        if (!version) continue;
        const to = version.startsWith('link:') ? b.node(`${name}@${version}`, name) : pkgNode(name, version);
        if (to !== from) b.deps.push([from, to]);
      }
    }
  };
  const importers = y.importers;
  if (importers && typeof importers === 'object' && !Array.isArray(importers)) {
    for (const [path, entry] of Object.entries(importers)) addDeps(b.node(`importer:${path}`, `importer:${path}`), entry);
  } else if (y.dependencies || y.devDependencies || y.optionalDependencies) {
    addDeps(b.node('importer:.', 'importer:.'), y);
  }
  if (edgeSource) {
    for (const [key, entry] of Object.entries(edgeSource)) {
      const nv = splitPnpmKey(key);
      if (nv) addDeps(pkgNode(nv[0], nv[1]), entry);
    }
  }
  return { format: 'pnpm-lock', ids: b.ids, names: b.names, deps: b.deps };
}

// ---- Cargo.lock --------------------------------------------------------------------------------

export function parseCargoLock(text: string): ParsedGraph {
  const packages: Array<{ name: string; version: string; deps: string[] }> = [];
  let cur: { name: string; version: string; deps: string[] } | null = null;
  let inArray = false;
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    if (inArray && cur) {
      for (const m of line.matchAll(/"([^"]*)"/g)) cur.deps.push(m[1]!);
      if (line.includes(']')) inArray = false;
      continue;
    }
    if (line === '[[package]]') {
      cur = { name: '', version: '', deps: [] };
      packages.push(cur);
      continue;
    }
    if (line.startsWith('[')) {
      cur = null; // [metadata] and other tables
      continue;
    }
    if (!cur) continue;
    const m = /^([A-Za-z0-9_-]+)\s*=\s*(.*)$/.exec(line);
    if (!m) continue;
    const [, key, value] = m as unknown as [string, string, string];
    if (key === 'name' || key === 'version') cur[key] = value.replace(/^"|"$/g, '');
    if (key === 'dependencies') {
      for (const q of value.matchAll(/"([^"]*)"/g)) cur.deps.push(q[1]!);
      inArray = value.startsWith('[') && !value.includes(']');
    }
  }
  if (!packages.length) throw bad('not a Cargo.lock (no [[package]] tables)');
  const b = new Builder();
  const byName = new Map<string, string[]>();
  for (const p of packages) {
    if (!p.name) throw bad('a [[package]] in Cargo.lock has no name');
    b.node(`${p.name}@${p.version}`, p.name);
    byName.set(p.name, [...(byName.get(p.name) ?? []), p.version]);
  }
  for (const p of packages) {
    const from = b.index.get(`${p.name}@${p.version}`)!;
    for (const d of p.deps) {
      const [name, version] = d.split(' ');
      const versions = byName.get(name!) ?? [];
      const v = version ?? (versions.length === 1 ? versions[0] : undefined);
      if (v === undefined) throw bad(`Cargo.lock: dependency "${d}" of ${p.name} is ambiguous or missing`);
      const to = b.index.get(`${name}@${v}`);
      if (to === undefined) throw bad(`Cargo.lock: dependency "${d}" of ${p.name} is not a listed package`);
      if (to !== from) b.deps.push([from, to]);
    }
  }
  return { format: 'cargo-lock', ids: b.ids, names: b.names, deps: b.deps };
}
