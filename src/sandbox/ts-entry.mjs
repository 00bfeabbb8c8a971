// Thread entry when the service runs from its TypeScript sources (tsx, vitest): a worker thread does
// not inherit the parent's loader, so it registers tsx itself before importing the real entry.
// Built code (dist/) starts thread.js directly and never loads this file.
import { register } from 'tsx/esm/api';

register();
await import(new URL('./thread.ts', import.meta.url).href);
