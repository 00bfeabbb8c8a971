import type { Family } from '../config.js';
import { AppError } from '../errors.js';
import type { AnyTool, Plan } from './types.js';
import { coreTools } from './core/index.js';
import { webTools } from './web/index.js';
import { llmTools } from './llm/index.js';
import { edgeTools } from './edge/index.js';

/**
 * The registry: the single source of truth for every tool. Routes, workers, the catalogue, MCP and
 * the manifest all read it.
 */
const registry: AnyTool[] = [...coreTools, ...webTools, ...llmTools, ...edgeTools];
export const TOOLS: readonly AnyTool[] = registry;

const byName = new Map(TOOLS.map((t) => [t.name, t]));
if (byName.size !== TOOLS.length) throw new Error('duplicate tool names in the registry');

/**
 * Adds a tool after start-up: tests register test-only tools this way. Register before the service
 * serves calls for it; views built once at start-up (MCP's list, the manifest) may not show it.
 */
export function registerTool(def: AnyTool): void {
  if (byName.has(def.name)) throw new Error(`a tool named ${def.name} is already registered`);
  registry.push(def);
  byName.set(def.name, def);
}

export function findTool(name: string): AnyTool | undefined {
  return byName.get(name);
}

export function getTool(name: string): AnyTool {
  const tool = byName.get(name);
  if (!tool) throw new AppError('tool_not_found', `No tool named '${name}'. GET /tools lists them.`, { tool: name });
  return tool;
}

export function toolsOfFamily(family: Family): AnyTool[] {
  return TOOLS.filter((t) => t.family === family);
}

/** Modules of the isolated tools of these families: what a process running their workers preloads in its sandbox threads. */
export function isolatedModules(families: readonly Family[]): string[] {
  return [...new Set(TOOLS.filter((t) => t.isolated && families.includes(t.family)).map((t) => t.isolated!))];
}

export function toolsByTier(): Record<Plan, AnyTool[]> {
  const out: Record<Plan, AnyTool[]> = { free: [], starter: [], pro: [], enterprise: [] };
  for (const t of TOOLS) out[t.tier].push(t);
  return out;
}

/** "0.05" for 5 cents: the dollar string the spec uses wherever it shows a `cost`. */
export function dollars(cents: number): string {
  return (cents / 100).toFixed(2);
}
