/**
 * A sandbox thread: runs one piece of work at a time for the pool (src/sandbox/pool.ts). It imports
 * only the module that holds the work, so a thread running compute never loads the registry, the
 * database or Redis clients. Limits are enforced from outside (the pool terminates the thread on its
 * deadline; V8 kills it on its heap cap); the one limit measured here is the result's size.
 */
import { parentPort, workerData } from 'node:worker_threads';
import pino from 'pino';
import { ERROR_STATUS } from '../errors.js';
import type { AnyTool, ToolContext } from '../tools/types.js';
import type { FromThread, SerializedFault, ThreadData, ToThread, Work } from './protocol.js';
import { runTaskInline } from '../tools/tasks.js';

const port = parentPort!;
const { config, preload } = workerData as ThreadData;
const send = (m: FromThread) => port.postMessage(m);

let current = 0;
// Log lines travel to the parent, which writes them through the call's own logger.
const log = pino({ level: config.LOG_LEVEL, base: undefined }, { write: (line: string) => send({ type: 'log', id: current, line }) });

// Each module is imported once per thread: a repeated dynamic import still goes through the module
// loader (under tsx, a round trip to its hooks thread), which cost more than a whole compute call.
const modules = new Map<string, Promise<Record<string, unknown>>>();
const load = (m: string) => {
  let mod = modules.get(m);
  if (!mod) {
    // A module whose heavy library loads on first use (src/tools/heavy.ts) loads it here, as part of
    // the module's cold start, not inside a call's time limit.
    mod = (import(m) as Promise<Record<string, unknown>>).then((loaded) => {
      if (typeof loaded.warm === 'function') (loaded.warm as () => void)();
      return loaded;
    });
    modules.set(m, mod);
    mod.catch(() => modules.delete(m));
  }
  return mod;
};

// A module that fails here fails again, visibly, when a call uses it.
for (const m of preload) await load(m).catch(() => {});
port.on('message', (m: ToThread) => void run(m));
send({ type: 'ready' });

async function run({ id, work, maxResultBytes }: ToThread): Promise<void> {
  current = id;
  try {
    const usage: Record<string, number> = {};
    const value = await execute(id, work, usage);
    const json = JSON.stringify({ value, usage });
    const bytes = Buffer.byteLength(json ?? '');
    if (bytes > maxResultBytes) send({ type: 'too_large', id, bytes });
    else send({ type: 'done', id, json });
  } catch (e) {
    send({ type: 'failed', id, error: serialise(e) });
  }
}

async function execute(id: number, work: Work, usage: Record<string, number>): Promise<unknown> {
  // The pool counts a call's time from here; for a module already loaded it started the clock itself.
  const cold = !modules.has(work.module);
  const started = () => cold && send({ type: 'started', id });
  const mod = await load(work.module);
  if (work.kind === 'task') {
    const fn = mod[work.export];
    if (typeof fn !== 'function') throw new Error(`${work.module} exports no function ${work.export}`);
    started();
    return await (fn as (input: unknown) => unknown)(work.input);
  }
  const tool = Object.values(mod).find((v): v is AnyTool => isTool(v) && v.name === work.name);
  if (!tool) throw new Error(`${work.module} exports no tool named ${work.name}`);
  const ctx: ToolContext = {
    config,
    // Made on first use: most calls never log.
    get log() {
      return log.child({ tool: tool.name });
    },
    // The pool stops a call by terminating the thread, so this signal never fires; it is here so
    // handlers written for the event loop run unchanged.
    signal: new AbortController().signal,
    progress: async (progress) => send({ type: 'progress', id, progress }),
    sandbox: work.context.sandbox,
    accountId: work.context.accountId,
    keyId: work.context.keyId,
    balance: () => Promise.reject(new Error('balance() is not available to isolated tools')),
    recordUsage: (u) => {
      for (const [k, v] of Object.entries(u)) usage[k] = (usage[k] ?? 0) + v;
    },
    // Already in a thread: nested tasks run here.
    isolate: (name, payload) => runTaskInline(name, payload),
  };
  started();
  return await tool.handler(work.input, ctx);
}

function isTool(v: unknown): v is AnyTool {
  return !!v && typeof v === 'object' && typeof (v as AnyTool).name === 'string' && typeof (v as AnyTool).handler === 'function';
}

/** AppErrors keep code, message, details and retryability; anything else stays an unexpected fault. */
function serialise(e: unknown): SerializedFault {
  const err = e as { name?: unknown; code?: unknown; message?: unknown; details?: unknown; retryable?: unknown };
  if (err && err.name === 'AppError' && typeof err.code === 'string' && err.code in ERROR_STATUS) {
    return {
      app: true,
      code: err.code,
      message: String(err.message),
      details: (err.details as Record<string, unknown>) ?? {},
      retryable: err.retryable === true,
    };
  }
  return { app: false, name: e instanceof Error ? e.name : typeof e, message: e instanceof Error ? e.message : String(e) };
}
