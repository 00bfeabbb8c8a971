import type { AnyTool } from '../types.js';

/** passport_store, passport_send. */
export const passportTools: AnyTool[] = [];
