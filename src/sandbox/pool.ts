/**
 * sandbox/: worker threads that run tools' CPU work on caller input, each call under its own time,
 * memory and size limits (this file: the pool; thread.ts: one thread). What runs there is tools/'.
 */
import { Worker } from 'node:worker_threads';
import pino, { type Logger } from 'pino';
import type { Config } from '../config.js';
import { AppError, ERROR_STATUS, type ErrorCode } from '../errors.js';
import type { AnyTool, ToolProgress } from '../tools/types.js';
import { limitExceeded, resolveLimits, THREAD_STACK_MB, youngGenerationMb, type ResolvedLimits, type ToolLimits } from './limits.js';
import type { FromThread, SerializedFault, ThreadData, ThreadToolContext, Work } from './protocol.js';
import { runTaskInline, TASKS, type TaskInput, type TaskName, type TaskOutput } from '../tools/tasks.js';
import { traced } from '../tracing.js';

/** One call's terms, as the runner states them. */
export interface SandboxCall {
  /** Whose work this is: the account id, or `payer:<address>` for calls paid per call. Fairness counts per owner. */
  owner: string;
  /** Names the work in limit messages: the tool's name, or `tool/task`. */
  label: string;
  limits?: ToolLimits;
  /** The job's signal: aborting it stops the work (queued or running). */
  signal?: AbortSignal;
  progress?(p: ToolProgress): Promise<void> | void;
  /** Receives the thread's log lines. */
  log?: Logger;
}

export interface SandboxOptions {
  /**
   * Modules worth having loaded before the first call (isolated tools' modules: mathjs alone takes
   * most of a second to import). When set, one thread starts with the pool and imports them, every
   * thread started later imports them too, and a thread that is terminated or dies is replaced at
   * once by one that imports what it had loaded. Without it every thread starts on first use.
   */
  preload?: readonly string[];
}

export interface SandboxStats {
  threads: number;
  busy: number;
  queued: number;
  /** Threads started since the pool was made (a terminated or dead thread is replaced by a new one). */
  started: number;
  /** Threads stopped for being idle SANDBOX_IDLE_MS. */
  stopped_idle: number;
}

/** Unexpected failures inside a thread; the runner reports them as internal_error. */
export class SandboxFault extends Error {
  override readonly name = 'SandboxFault';
}

// A thread that cannot load a module in this long is broken, whatever the call's own limit.
const LOAD_TIMEOUT_MS = 30_000;

// Built code starts thread.js; from TypeScript sources the thread first registers tsx (ts-entry.mjs).
const FROM_SOURCE = import.meta.url.endsWith('.ts');
const THREAD_ENTRY = new URL(FROM_SOURCE ? './ts-entry.mjs' : './thread.js', import.meta.url);

interface Thread {
  worker: Worker;
  memoryMb: number;
  task: Task | null;
  gone: boolean;
  /** Done importing its preload modules: only ready threads are given work. */
  ready: boolean;
  /** Modules this thread has imported (or is importing): work for them runs without a cold start. */
  modules: Set<string>;
  loadTimer?: NodeJS.Timeout;
  /** When it last finished a task (or started): past SANDBOX_IDLE_MS of this, it is stopped. */
  idleSince: number;
}

interface Task {
  id: number;
  work: Work;
  call: SandboxCall;
  limits: ResolvedLimits;
  resolve(json: string): void;
  reject(e: Error): void;
  thread?: Thread;
  timer?: NodeJS.Timeout;
  onAbort?: () => void;
  settled: boolean;
}

/**
 * A small pool of worker threads for CPU work on caller input (isolated tools, and named tasks of
 * tools that run on the event loop). Each call gets a wall-clock deadline, a heap cap (threads are
 * created with `resourceLimits` for one memory size and reused only for calls of that size) and a
 * result size cap. At most SANDBOX_THREADS threads exist, created on demand; one owner may hold at
 * most max(1, floor(SANDBOX_THREADS * FAIR_SHARE)) of them while others wait, and, alone in the queue,
 * every thread but one share's worth.
 */
export class SandboxPool {
  /** False when ISOLATION=off: work runs on the calling event loop (benchmarks only). */
  readonly isolating: boolean;
  private readonly maxThreads: number;
  private readonly ownerCap: number;
  private readonly threads: Thread[] = [];
  private readonly queue: Task[] = [];
  private readonly running = new Map<string, number>();
  private nextId = 1;
  private started = 0;
  private stoppedIdle = 0;
  private closed = false;
  private readonly sweeper?: NodeJS.Timeout;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    private readonly options: SandboxOptions = {},
  ) {
    this.isolating = config.ISOLATION === 'threads';
    this.maxThreads = config.SANDBOX_THREADS;
    this.ownerCap = Math.max(1, Math.floor(config.SANDBOX_THREADS * config.FAIR_SHARE));
    if (this.isolating && options.preload?.length) this.spawn(config.TOOL_MEMORY_MB, options.preload);
    // Threads start on demand and stop when idle, so a process that ran a burst of CPU work gives the
    // threads' heaps back instead of holding them for good.
    const idleMs = config.SANDBOX_IDLE_MS;
    if (this.isolating && idleMs > 0) {
      this.sweeper = setInterval(() => this.shrink(idleMs), Math.max(250, Math.min(60_000, Math.floor(idleMs / 2))));
      this.sweeper.unref();
    }
  }

  /**
   * Stops threads idle for `idleMs` or more. With preload one thread is kept (warm for the next call);
   * without it the pool may shrink to none, and the next call starts a thread again.
   */
  private shrink(idleMs: number): void {
    const keep = this.options.preload?.length ? 1 : 0;
    const now = Date.now();
    const stale = this.threads.filter((t) => t.ready && !t.task && !t.gone && now - t.idleSince >= idleMs).sort((a, b) => a.idleSince - b.idleSince);
    for (const t of stale) {
      if (this.threads.length <= keep) return;
      this.stoppedIdle++;
      void this.retire(t, { replace: false });
    }
  }

  /** Runs an isolated tool's handler (found by name among `tool.isolated`'s exports) in a thread. */
  async runTool(tool: AnyTool, input: unknown, context: ThreadToolContext, call: SandboxCall): Promise<{ value: unknown; usage: Record<string, number> }> {
    if (!tool.isolated) throw new SandboxFault(`${tool.name} is not an isolated tool`);
    const json = await this.submit({ kind: 'tool', module: tool.isolated, name: tool.name, input, context }, call);
    const out = JSON.parse(json) as { value?: unknown; usage: Record<string, number> };
    return { value: out.value, usage: out.usage };
  }

  /** Runs one named task from the task table (src/tools/tasks.ts). */
  async runTask<K extends TaskName>(name: K, payload: TaskInput<K>, call: SandboxCall): Promise<TaskOutput<K>> {
    if (!this.isolating) return runTaskInline(name, payload);
    const entry = TASKS[name];
    const json = await this.submit({ kind: 'task', module: entry.module, export: entry.export, input: payload }, call);
    return (JSON.parse(json) as { value: TaskOutput<K> }).value;
  }

  stats(): SandboxStats {
    return {
      threads: this.threads.length,
      busy: this.threads.filter((t) => t.task).length,
      queued: this.queue.length,
      started: this.started,
      stopped_idle: this.stoppedIdle,
    };
  }

  /** Stops every thread; queued and running work fails. */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweeper);
    for (const task of this.queue.splice(0)) this.settle(task, new AppError('service_unavailable', 'The service is shutting down'));
    await Promise.all(
      [...this.threads].map(async (t) => {
        if (t.task) this.settle(t.task, new AppError('service_unavailable', 'The service is shutting down'));
        await this.retire(t);
      }),
    );
  }

  /** A span (while tracing is on) for the work's time in the pool: its wait for a thread and its run there. */
  private submit(work: Work, call: SandboxCall): Promise<string> {
    return traced('sandbox', () => this.enqueue(work, call), { 'tollgate.sandbox.work': call.label });
  }

  private enqueue(work: Work, call: SandboxCall): Promise<string> {
    if (this.closed) return Promise.reject(new AppError('service_unavailable', 'The service is shutting down'));
    if (call.signal?.aborted) return Promise.reject(cancelled(call.label));
    return new Promise<string>((resolve, reject) => {
      const task: Task = { id: this.nextId++, work, call, limits: resolveLimits(this.config, call.limits), resolve, reject, settled: false };
      if (call.signal) {
        task.onAbort = () => {
          const queued = this.queue.indexOf(task);
          if (queued >= 0) this.queue.splice(queued, 1);
          // A running call cannot be interrupted inside its thread: the thread goes with it.
          if (task.thread) void this.retire(task.thread);
          this.settle(task, cancelled(call.label));
        };
        call.signal.addEventListener('abort', task.onAbort, { once: true });
      }
      this.queue.push(task);
      this.dispatch();
    });
  }

  /**
   * Starts queued tasks on free threads, in queue order, skipping owners at their cap. A task only
   * ever goes to a ready thread: one still loading is not given work, so a call never sits behind a
   * cold start while a warm thread frees up; new threads are started for tasks still waiting.
   */
  private dispatch(): void {
    if (this.closed) return;
    // Threads still loading, per memory size, not yet counted on by a waiting task of this pass.
    const loading = new Map<number, number>();
    for (const t of this.threads) if (!t.ready) loading.set(t.memoryMb, (loading.get(t.memoryMb) ?? 0) + 1);
    const taken = new Map<string, number>();
    // An owner alone in the queue may use more than its share, but never the last share's worth of
    // threads: those stay free for the next owner to arrive (as with the workers' fair share).
    const alone = new Set(this.queue.map((t) => t.call.owner)).size === 1;
    const cap = alone ? Math.max(this.ownerCap, this.maxThreads - this.ownerCap) : this.ownerCap;
    for (let i = 0; i < this.queue.length; i++) {
      const task = this.queue[i]!;
      const owner = task.call.owner;
      if ((this.running.get(owner) ?? 0) + (taken.get(owner) ?? 0) >= cap) continue;
      const thread = this.threadFor(task, loading);
      if (!thread) {
        // This task waits for a thread; the owner's place is held so its later tasks do not jump ahead.
        taken.set(owner, (taken.get(owner) ?? 0) + 1);
        continue;
      }
      this.queue.splice(i--, 1);
      this.start(task, thread);
    }
  }

  /**
   * Best first: a ready idle thread of the right memory size that already has the module; else wait
   * for a thread of that size that is loading, or start one while there is room; else a ready idle
   * thread of the right size (it loads the module on the spot). Memory caps are fixed when a thread
   * starts, so as a last resort an idle thread of another size makes room for a new one.
   */
  private threadFor(task: Task, loading: Map<number, number>): Thread | null {
    const size = task.limits.memoryMb;
    const idle = this.threads.filter((t) => t.ready && !t.task);
    const sized = idle.filter((t) => t.memoryMb === size);
    const warm = sized.find((t) => t.modules.has(task.work.module));
    if (warm) return warm;
    const pending = loading.get(size) ?? 0;
    if (pending > 0) {
      loading.set(size, pending - 1);
      return null;
    }
    // A new thread loads the preload modules too (after the task's own), so it is warm for them next time.
    const modules = [task.work.module, ...(this.options.preload ?? [])];
    if (this.threads.length < this.maxThreads) {
      this.spawn(size, modules);
      return null;
    }
    if (sized[0]) return sized[0];
    if (idle[0]) {
      void this.retire(idle[0], { replace: false });
      this.spawn(size, modules);
    }
    return null;
  }

  private start(task: Task, thread: Thread): void {
    // A ready thread has its modules loaded: the call's own time starts now. Otherwise the thread
    // says 'started' once it has imported the module, and only loading is timed until then.
    const warm = thread.modules.has(task.work.module);
    thread.modules.add(task.work.module);
    task.thread = thread;
    thread.task = task;
    this.running.set(task.call.owner, (this.running.get(task.call.owner) ?? 0) + 1);
    task.timer = warm ? setTimeout(() => this.expire(task, 'run'), task.limits.timeMs) : setTimeout(() => this.expire(task, 'load'), LOAD_TIMEOUT_MS);
    thread.worker.postMessage({ type: 'run', id: task.id, work: task.work, maxResultBytes: task.limits.maxResultBytes });
  }

  private expire(task: Task, phase: 'load' | 'run'): void {
    if (task.settled || !task.thread) return;
    void this.retire(task.thread);
    this.settle(
      task,
      phase === 'run'
        ? limitExceeded(task.call.label, 'time', task.limits.timeMs)
        : new SandboxFault(`sandbox thread did not load ${task.work.module} within ${LOAD_TIMEOUT_MS} ms`),
    );
  }

  private spawn(memoryMb: number, preload: Iterable<string> = []): Thread {
    const modules = new Set(preload);
    const worker = new Worker(THREAD_ENTRY, {
      workerData: { config: this.config, preload: [...modules] } satisfies ThreadData,
      resourceLimits: { maxOldGenerationSizeMb: memoryMb, maxYoungGenerationSizeMb: youngGenerationMb(memoryMb), stackSizeMb: THREAD_STACK_MB },
    });
    const thread: Thread = { worker, memoryMb, task: null, gone: false, ready: false, modules, idleSince: Date.now() };
    this.threads.push(thread);
    this.started++;
    thread.loadTimer = setTimeout(() => {
      this.log.error({ modules: [...modules] }, `sandbox thread did not load its modules within ${LOAD_TIMEOUT_MS} ms`);
      void this.retire(thread, { replace: false });
    }, LOAD_TIMEOUT_MS);
    worker.on('message', (m: FromThread) => this.onMessage(thread, m));
    worker.on('error', (err: Error & { code?: string }) => {
      const task = thread.task;
      this.forget(thread);
      if (!task) return this.log.warn({ err: err.message }, 'sandbox thread failed while idle');
      this.settle(
        task,
        err.code === 'ERR_WORKER_OUT_OF_MEMORY'
          ? limitExceeded(task.call.label, 'memory', memoryMb)
          : new SandboxFault(`sandbox thread failed: ${err.message}`),
      );
    });
    worker.on('exit', () => {
      const task = thread.task;
      this.forget(thread);
      if (task) this.settle(task, new SandboxFault('sandbox thread exited during a call'));
    });
    // An idle thread must not keep the process alive; a busy one is awaited by its caller anyway.
    worker.unref();
    return thread;
  }

  private onMessage(thread: Thread, m: FromThread): void {
    if (m.type === 'ready') {
      thread.ready = true;
      // Idle from now, not from its start: a slow cold start is not idle time.
      thread.idleSince = Date.now();
      clearTimeout(thread.loadTimer);
      this.dispatch();
      return;
    }
    const task = thread.task;
    if (!task || task.id !== m.id || task.settled) return;
    switch (m.type) {
      case 'started':
        clearTimeout(task.timer);
        task.timer = setTimeout(() => this.expire(task, 'run'), task.limits.timeMs);
        return;
      case 'progress':
        void Promise.resolve(task.call.progress?.(m.progress)).catch(() => {});
        return;
      case 'log':
        writeLog(task.call.log ?? this.log, m.line);
        return;
      case 'done':
        this.finish(thread, task);
        task.settled = true;
        task.resolve(m.json);
        return;
      case 'too_large':
        this.finish(thread, task);
        this.settle(task, limitExceeded(task.call.label, 'size', task.limits.maxResultBytes));
        return;
      case 'failed':
        this.finish(thread, task);
        this.settle(task, revive(m.error));
        return;
    }
  }

  /** The thread finished its task normally and is free for the next. */
  private finish(thread: Thread, task: Task): void {
    thread.task = null;
    thread.idleSince = Date.now();
    this.release(task);
    setImmediate(() => this.dispatch());
  }

  private settle(task: Task, err: Error): void {
    if (task.settled) return;
    task.settled = true;
    this.release(task);
    task.reject(err);
  }

  /** Undoes what start() and submit() took: the timer, the abort listener and the owner's slot. */
  private release(task: Task): void {
    clearTimeout(task.timer);
    if (task.onAbort) task.call.signal?.removeEventListener('abort', task.onAbort);
    task.onAbort = undefined;
    if (task.thread) {
      const n = (this.running.get(task.call.owner) ?? 1) - 1;
      if (n > 0) this.running.set(task.call.owner, n);
      else this.running.delete(task.call.owner);
      task.thread = undefined;
    }
  }

  private async retire(thread: Thread, o: { replace: boolean } = { replace: true }): Promise<void> {
    const task = thread.task;
    this.forget(thread, o);
    if (task) this.release(task);
    await thread.worker.terminate().catch(() => {});
  }

  /** Drops a thread from the pool (terminated or dead); its replacement is started on demand. */
  private forget(thread: Thread, { replace }: { replace: boolean } = { replace: true }): void {
    if (thread.gone) return;
    thread.gone = true;
    clearTimeout(thread.loadTimer);
    const i = this.threads.indexOf(thread);
    if (i >= 0) this.threads.splice(i, 1);
    if (thread.task) this.release(thread.task);
    thread.task = null;
    // Keep the pool warm: the replacement loads what the lost thread had, before anyone waits for it.
    // Only a thread that had loaded is replaced: one failing while loading would fail again.
    if (replace && thread.ready && this.options.preload?.length && !this.closed && this.threads.length < this.maxThreads) {
      this.spawn(thread.memoryMb, thread.modules);
    }
    setImmediate(() => this.dispatch());
  }
}

function cancelled(label: string): AppError {
  return new AppError('timeout', `${label} was cancelled before it finished`);
}

function revive(f: SerializedFault): Error {
  if (f.app) return new AppError(f.code in ERROR_STATUS ? (f.code as ErrorCode) : 'internal_error', f.message, f.details, { retryable: f.retryable });
  const err = new SandboxFault(f.message);
  err.stack = `${f.name}: ${f.message}`;
  return err;
}

/** Replays a thread's pino line through the parent's logger, at its level, with its fields. */
function writeLog(log: Logger, line: string): void {
  try {
    const { level, msg, time: _time, ...fields } = JSON.parse(line) as { level: number; msg?: string; time?: number };
    const label = pino.levels.labels[level] as pino.Level | undefined;
    if (label) log[label](fields, msg);
  } catch {
    log.info({ line }, 'sandbox thread log');
  }
}
