/**
 * Which room may import which (`npm run deps`; CI runs it). Imports point down only:
 *
 *   roof (server, app, container, bootstrap, cli/, workers/)
 *   faces/   HTTP routes, MCP, chat completions, SSE: adapters that only translate
 *   ops/     operators' pieces: admin actions, dashboard, embedded start-up, client package, sealed-key checks
 *   calls/   admission, runner, protocol flows, job watch, idempotency, cancel, webhooks, worker pool
 *   pay/     x402 and top-ups
 *   money/   holds, settlement, results, partners, reconciler
 *   access/  keys, auth, accounts, rate and concurrency limits, passports' access rules, edge tokens
 *   queue/ db/ sandbox/   Redis and BullMQ, Postgres, worker threads
 *   tools/   the catalogue's tools and their types
 *   errors.ts config.ts tracing.ts   the ground floor (tracing: the one API every room's spans go through)
 *
 * Exceptions, each with its reason:
 * - ops/metrics.ts may be imported from anywhere below faces: metrics are instrumentation every room
 *   reports to, and the file itself imports only the ground floor.
 * - faces/ and ops/ may name the Container type (src/container.ts): Fastify hands it to them as
 *   app.container; importing its code is still forbidden.
 * Type-only imports count like any other: a type that two rooms share lives in the lower one.
 */
const ROOF = '^(src/(server|app|container|bootstrap)\\.ts|src/cli/|workers/)';
const rooms = ['faces', 'ops', 'calls', 'pay', 'money', 'access', 'infra', 'tools', 'ground'];
const path = {
  faces: '^src/faces/',
  ops: '^src/ops/(?!metrics\\.ts$)',
  calls: '^src/calls/',
  pay: '^src/pay/',
  money: '^src/money/',
  access: '^src/access/',
  infra: '^src/(queue|db|sandbox)/',
  tools: '^src/tools/',
  ground: '^src/(errors|config|tracing)\\.ts$',
};
const above = (room) => rooms.slice(0, rooms.indexOf(room));

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'An import circle: one of its arrows points up. Move what both sides need into the lower room.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'not-to-roof',
      severity: 'error',
      comment: 'The roof (server, app, container, bootstrap, cli, workers) composes the rooms; no room imports it.',
      from: { pathNot: ROOF },
      to: { path: ROOF, pathNot: '^src/container\\.ts$' },
    },
    {
      name: 'container-type-only',
      severity: 'error',
      comment: 'Fastify carries the container as app.container: faces and ops may name its type, never import its code.',
      from: { pathNot: ROOF },
      to: { path: '^src/container\\.ts$', dependencyTypesNot: ['type-only'] },
    },
    ...rooms
      .filter((r) => above(r).length)
      .map((r) => ({
        name: `${r}-imports-down-only`,
        severity: 'error',
        comment: `${r} may import only the rooms below it (${rooms.slice(rooms.indexOf(r) + 1).join(', ') || 'none'}).`,
        from: { path: path[r] },
        to: { path: `(${above(r).map((a) => path[a]).join('|')})` },
      })),
    {
      name: 'infra-rooms-stay-apart',
      severity: 'error',
      comment: 'queue/, db/ and sandbox/ are side by side: none of them imports another, so each can change alone.',
      from: { path: '^src/(queue|db|sandbox)/' },
      to: { path: '^src/(queue|db|sandbox)/', pathNot: '^src/$1/' },
    },
    {
      name: 'no-unresolvable',
      severity: 'error',
      comment: 'An import that resolves to nothing.',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '(^|/)(node_modules|dist)/' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default', 'types'] },
    reporterOptions: { text: { highlightFocused: true } },
  },
};
