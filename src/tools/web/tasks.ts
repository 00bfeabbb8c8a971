/**
 * The web family's CPU tasks for the sandbox pool (see src/sandbox/tasks.ts): parsing caller-chosen
 * content runs in a thread, never on the worker's event loop. Add `name: { input; output }` here and the
 * module that exports the function below; a thread imports only that module.
 */
// eslint-disable-next-line @typescript-eslint/no-empty-interface
export interface WebTaskTypes {}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
export const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;

export const WEB_TASKS: { [K in keyof WebTaskTypes]: { module: string; export: string } } = {};
