import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { dependencyDag } from '../../../src/tools/math/dependency-dag.js';
import { parseYamlSubset } from '../../../src/tools/math/lockfiles.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const run = async (input: unknown) => {
  const { ctx } = makeToolContext();
  const result = await dependencyDag.handler(dependencyDag.input.parse(input), ctx);
  const parsed = dependencyDag.outputSchema!.safeParse(result);
  expect(parsed.success, parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 3))).toBe(true);
  return result;
};

const chain = (ids: string[]) => ids.map((id, i) => ({ id, depends_on: i ? [ids[i - 1]!] : [] }));

describe('magnum_dependency_dag: tasks', () => {
  it('layers, critical path by duration and fan-in of a small plan', async () => {
    const r = await run(dependencyDag.examples[0]);
    expect(r.is_dag).toBe(true);
    expect(r.layers.map((l) => l.nodes)).toEqual([['design'], ['backend', 'frontend'], ['tests'], ['release']]);
    expect(r.critical_path).toEqual({ duration: 11, steps: 4, nodes: ['design', 'backend', 'tests', 'release'] });
    expect(r.fan_in_top[0]).toEqual({ id: 'design', dependents: 2 });
    expect(r.mermaid.split('\n')[0]).toBe('graph LR');
  });

  it('closing a cycle lists exactly that cycle, in order (each a dependency of the next)', async () => {
    const ids = ['t1', 't2', 't3', 't4', 't5'];
    const open = await run({ manifest: [...chain(ids), { id: 'x', depends_on: ['t3'] }] });
    expect(open.is_dag).toBe(true);
    const tasks = chain(ids);
    tasks[1]!.depends_on.push('t4'); // t2 waits for t4, which waits (via t3) for t2
    const closed = await run({ manifest: [...tasks, { id: 'x', depends_on: ['t3'] }] });
    expect(closed.is_dag).toBe(false);
    expect(closed.cycle_count).toBe(1);
    expect(closed.cycles).toEqual([['t2', 't3', 't4']]);
    expect(closed.critical_path).toBeNull();
    // Members of the cycle share a layer; t1 comes before, t5 and x after.
    expect(closed.layers.map((l) => l.nodes)).toEqual([['t1'], ['t2', 't3', 't4'], ['t5', 'x']]);
    // A self-dependency is a cycle of one.
    expect((await run({ manifest: [{ id: 'a', depends_on: ['a'] }] })).cycles).toEqual([['a']]);
  });

  it('property: a random cycle closed in a random DAG is listed exactly', () => {
    return fc.assert(
      fc.asyncProperty(fc.integer({ min: 2, max: 12 }), fc.integer({ min: 0, max: 10 }), async (k, extra) => {
        const cyc = Array.from({ length: k }, (_, i) => `c${i}`);
        const tasks: Array<{ id: string; depends_on: string[] }> = cyc.map((id, i) => ({ id, depends_on: [cyc[(i + k - 1) % k]!] }));
        for (let e = 0; e < extra; e++) tasks.push({ id: `e${e}`, depends_on: [cyc[e % k]!] });
        const r = await run({ manifest: tasks });
        expect(r.cycles).toEqual([cyc]);
      }),
      { numRuns: 30, seed: 42 },
    );
  });

  it('unknown dependencies, duplicate ids and too many tasks are refused', async () => {
    await expect(run({ manifest: [{ id: 'a', depends_on: ['zz'] }] })).rejects.toMatchObject({ code: 'invalid_input' });
    await expect(run({ manifest: [{ id: 'a' }, { id: 'a' }] })).rejects.toMatchObject({ code: 'invalid_input' });
    expect(dependencyDag.input.safeParse({ manifest: Array.from({ length: 50_001 }, (_, i) => ({ id: i })) }).success).toBe(false);
    expect(dependencyDag.input.safeParse({ manifest: 'x'.repeat(1_000_001) }).success).toBe(false);
    await expect(run({ manifest: JSON.stringify(Array.from({ length: 50_001 }, (_, i) => ({ id: i }))) })).rejects.toMatchObject({ code: 'invalid_input' });
    await expect(run({ manifest: 'hello world' })).rejects.toMatchObject({ code: 'invalid_input' });
  });
});

describe('magnum_dependency_dag: lockfiles', () => {
  it('package-lock.json v3: nested node_modules resolve, duplicates are listed', async () => {
    const lock = {
      name: 'app',
      version: '1.0.0',
      lockfileVersion: 3,
      packages: {
        '': { name: 'app', version: '1.0.0', dependencies: { a: '^1', b: '^1' }, devDependencies: { c: '^2' } },
        'node_modules/a': { version: '1.0.0', dependencies: { c: '^1' } },
        'node_modules/a/node_modules/c': { version: '1.5.0' },
        'node_modules/b': { version: '1.2.0', dependencies: { c: '^2', missing: '*' } },
        'node_modules/c': { version: '2.0.0' },
      },
    };
    const r = await run({ manifest: JSON.stringify(lock) });
    expect(r.format).toBe('package-lock');
    expect(r.nodes).toBe(5);
    expect(r.edges).toBe(5); // app→a, app→b, app→c (dev), a→c@1.5.0, b→c@2.0.0; the missing optional one is skipped
    expect(r.duplicates).toEqual([{ name: 'c', versions: ['1.5.0', '2.0.0'] }]);
    expect(r.layers[0]!.nodes).toEqual(['c@1.5.0', 'c@2.0.0']);
    expect(r.critical_path!.nodes.at(-1)).toBe('app@1.0.0');
    expect(r.fan_in_top[0]).toEqual({ id: 'c@2.0.0', dependents: 2 });
    await expect(run({ manifest: JSON.stringify({ lockfileVersion: 1, dependencies: {} }) })).rejects.toMatchObject({ code: 'invalid_input' });
  });

  it('pnpm-lock.yaml v9 (importers + snapshots, peer suffixes), v6 and v5', async () => {
    const v9 = `lockfileVersion: '9.0'

settings:
  autoInstallPeers: true

importers:

  .:
    dependencies:
      react-dom:
        specifier: ^18.2.0
        version: 18.2.0(react@18.2.0)
      '@scope/util':
        specifier: 1.0.0
        version: 1.0.0

packages:

  '@scope/util@1.0.0':
    resolution: {integrity: sha512-abc}

  loose-envify@1.4.0:
    resolution: {integrity: sha512-def}
    hasBin: true

  react-dom@18.2.0:
    resolution: {integrity: sha512-ghi}
    peerDependencies:
      react: ^18.2.0

  react@18.2.0:
    resolution: {integrity: sha512-jkl}

  react@17.0.2:
    resolution: {integrity: sha512-mno}

snapshots:

  '@scope/util@1.0.0':
    dependencies:
      react: 17.0.2

  loose-envify@1.4.0: {}

  react-dom@18.2.0(react@18.2.0):
    dependencies:
      loose-envify: 1.4.0
      react: 18.2.0

  react@18.2.0:
    dependencies:
      loose-envify: 1.4.0

  react@17.0.2: {}
`;
    const r = await run({ manifest: v9 });
    expect(r.format).toBe('pnpm-lock');
    expect(r.nodes).toBe(6);
    expect(r.duplicates).toEqual([{ name: 'react', versions: ['18.2.0', '17.0.2'] }]);
    expect(r.critical_path!.nodes).toEqual(['loose-envify@1.4.0', 'react@18.2.0', 'react-dom@18.2.0', 'importer:.']);
    const v6 = `lockfileVersion: '6.0'

dependencies:
  left-pad:
    specifier: ^1.3.0
    version: 1.3.0

packages:

  /left-pad@1.3.0:
    resolution: {integrity: sha512-x}
    dependencies:
      tiny: 0.1.0
    dev: false

  /tiny@0.1.0:
    resolution: {integrity: sha512-y}
    dev: false
`;
    const r6 = await run({ manifest: v6 });
    expect(r6.critical_path!.nodes).toEqual(['tiny@0.1.0', 'left-pad@1.3.0', 'importer:.']);
    const v5 = `lockfileVersion: 5.4

specifiers:
  '@babel/core': ^7.0.0

dependencies:
  '@babel/core': 7.20.0

packages:

  /@babel/core/7.20.0:
    resolution: {integrity: sha512-x}
    dependencies:
      debug: 4.3.4_supports-color@8.1.1
    dev: false

  /debug/4.3.4_supports-color@8.1.1:
    resolution: {integrity: sha512-y}
    dev: false
`;
    expect((await run({ manifest: v5 })).critical_path!.nodes).toEqual(['debug@4.3.4', '@babel/core@7.20.0', 'importer:.']);
    expect(parseYamlSubset("a:\n  b: 'x: y'\n  c:\n    - one\n    - two\n")).toEqual({ a: { b: 'x: y', c: ['one', 'two'] } });
  });

  it('Cargo.lock: name-only and name-version references, duplicate versions', async () => {
    const r = await run(dependencyDag.examples[1]);
    expect(r.format).toBe('cargo-lock');
    expect(r.duplicates).toEqual([{ name: 'serde', versions: ['1.0.100', '1.0.200'] }]);
    expect(r.critical_path!.nodes).toEqual(['serde@1.0.100', 'rand@0.8.5', 'app@0.1.0']);
  });
});

describe('magnum_dependency_dag: limits and determinism', () => {
  it('the largest input (50,000 tasks, ~150,000 edges) finishes inside its limits with a bounded result', async () => {
    const start = cpuNow();
    const r = await run(dependencyDag.largestInput!());
    expect(cpuNow() - start).toBeLessThan(dependencyDag.limits!.timeMs!);
    expect(r.nodes).toBe(50_000);
    expect(JSON.stringify(r).length).toBeLessThan(1_000_000);
    expect(r.mermaid.split('\n').filter((l) => l.includes('["')).length).toBe(300);
  });

  it('examples repeat byte for byte', async () => {
    for (const ex of dependencyDag.examples) expect(JSON.stringify(await run(ex))).toBe(JSON.stringify(await run(ex)));
  });
});
