import { WEB_TASKS_A, type WebTaskTypesA } from './tasks-a.js';
import { WEB_TASKS_B, type WebTaskTypesB } from './tasks-b.js';

/**
 * The web family's CPU tasks for the sandbox pool (see src/sandbox/tasks.ts): parsing caller-chosen
 * content runs in a thread, never on the worker's event loop. Each group keeps its own table.
 */
export interface WebTaskTypes extends WebTaskTypesA, WebTaskTypesB {}

export const WEB_TASKS: { [K in keyof WebTaskTypes]: { module: string; export: string } } = { ...WEB_TASKS_A, ...WEB_TASKS_B };
