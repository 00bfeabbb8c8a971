import type { ExtractHtmlInput, ExtractHtmlOutput } from './web/extract.js';
import type { CviRoundInput, CviRoundOutput } from './text/cvi-core.js';
import { WEB_TASKS, type WebTaskTypes } from './web/tasks.js';
import { MEDIA_TASKS, type MediaTaskTypes } from './media/tasks.js';
import { LLM_TASKS, type LlmTaskTypes } from './llm/tasks.js';
import type { TaskInput, TaskName, TaskOutput, TaskTypes } from './types.js';

/**
 * Named CPU tasks that handlers running on the worker's event loop hand to the sandbox pool
 * (`ctx.isolate(name, payload)`). A thread imports only the task's own module, never this table's
 * neighbours, so each entry names a module URL and the function it exports. Payloads and results are
 * copied between threads: keep them plain data (strings, numbers, arrays, objects, Uint8Array).
 */
declare module './types.js' {
  interface TaskTypes extends WebTaskTypes, MediaTaskTypes, LlmTaskTypes {
    /** page_fetch: parse fetched HTML within node and depth caps and extract its readable text. */
    extract_html: { input: ExtractHtmlInput; output: ExtractHtmlOutput };
    /** cvi_loop: one verification round of a draft against its sources (the loop's state stays on the event loop). */
    cvi_round: { input: CviRoundInput; output: CviRoundOutput };
  }
}

export type { TaskInput, TaskName, TaskOutput, TaskTypes };

// Sibling modules share this file's extension: .ts when run from source (tsx, vitest), .js once built.
const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;

export const TASKS: Record<TaskName, { module: string; export: string }> = {
  extract_html: { module: moduleUrl('./web/extract'), export: 'extractHtmlTask' },
  cvi_round: { module: moduleUrl('./text/cvi-core'), export: 'cviRoundTask' },
  ...WEB_TASKS,
  ...MEDIA_TASKS,
  ...LLM_TASKS,
};

/** Runs a task on the calling event loop (ISOLATION=off, or a handler called outside the runner). */
export async function runTaskInline<K extends TaskName>(name: K, payload: TaskInput<K>): Promise<TaskOutput<K>> {
  const entry = TASKS[name];
  const mod = (await import(entry.module)) as Record<string, (input: unknown) => unknown>;
  return (await mod[entry.export]!(payload)) as TaskOutput<K>;
}

/** A handler's way to run a task: in the pool when the runner provides one, inline otherwise. */
export function runTask<K extends TaskName>(
  ctx: { isolate?<T extends TaskName>(task: T, payload: TaskInput<T>): Promise<TaskOutput<T>> },
  name: K,
  payload: TaskInput<K>,
): Promise<TaskOutput<K>> {
  return ctx.isolate ? ctx.isolate(name, payload) : runTaskInline(name, payload);
}
