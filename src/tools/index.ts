/**
 * tools/: the catalogue. Each tool's definition (input and output schemas, price, tier, family,
 * limits) and handler, the families' CPU tasks, and the registry (this file). Tools see the world only
 * through their ToolContext; they import nothing above them.
 */
import type { Config, Family } from '../config.js';
import { AppError } from '../errors.js';
import type { AnyTool, Need, Plan } from './types.js';
import { coreTools } from './core/index.js';
import { webTools } from './web/index.js';
import { llmTools } from './llm/index.js';
import { edgeTools } from './edge/index.js';
import { textTools } from './text/index.js';
import { mathTools } from './math/index.js';
import { mediaTools } from './media/index.js';

/**
 * The registry: the single source of truth for every tool. Routes, workers, the catalogue, MCP and
 * the manifest all read it.
 */
const registry: AnyTool[] = [...coreTools, ...webTools, ...llmTools, ...edgeTools, ...textTools, ...mathTools, ...mediaTools];
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
  if (tool) return tool;
  const near = similarToolNames(name);
  const hint = near.length ? ` Did you mean ${near.map((n) => `'${n}'`).join(' or ')}?` : '';
  throw new AppError('tool_not_found', `No tool named '${name}'.${hint} GET /tools lists them.`, {
    tool: name,
    ...(near.length ? { did_you_mean: near } : {}),
  });
}

/** Edit distance (insertions, deletions, substitutions, adjacent swaps), stopping early past `max`. */
function distance(a: string, b: string, max: number): number {
  if (Math.abs(a.length - b.length) > max) return max + 1;
  let prev2: number[] = [];
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    let best = i;
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, prev2[j - 2]! + 1);
      row.push(d);
      best = Math.min(best, d);
    }
    if (best > max) return max + 1;
    prev2 = prev;
    prev = row;
  }
  return prev[b.length]!;
}

/**
 * Up to three catalogue names close to `name`, closest first: a few typing slips away (case, `-` for
 * `_` and spaces ignored), or one that contains the other. None for a name unlike any tool (or a long one).
 */
export function similarToolNames(name: string): string[] {
  if (name.length > 64) return [];
  const norm = (s: string) => s.toLowerCase().replace(/[-\s.]+/g, '_');
  const wanted = norm(name);
  if (!wanted) return [];
  const max = Math.max(1, Math.min(3, Math.floor(wanted.length / 3)));
  return TOOLS.map((t) => {
    const d = distance(wanted, t.name, max);
    const contains = wanted.length >= 4 && (t.name.includes(wanted) || wanted.includes(t.name));
    return { name: t.name, score: d <= max ? d : contains ? max + 0.5 : Number.POSITIVE_INFINITY };
  })
    .filter((c) => Number.isFinite(c.score))
    .sort((x, y) => x.score - y.score || x.name.localeCompare(y.name))
    .slice(0, 3)
    .map((c) => c.name);
}

/** Whether every upstream `tool` needs is configured here (see assertNeedsMet). */
export function needsMet(tool: AnyTool, config: Config): boolean {
  return (tool.needs ?? []).every((n) => NEED_SETTINGS[n].configured(config));
}

/**
 * The tools this configuration cannot offer, by missing setting: what start-up reports, once, so an
 * operator knows why they answer 503 tool_unavailable.
 */
export function unavailableTools(config: Config): { setting: string; need: Need; tools: string[] }[] {
  return (Object.keys(NEED_SETTINGS) as Need[])
    .filter((need) => !NEED_SETTINGS[need].configured(config))
    .map((need) => ({ need, setting: NEED_SETTINGS[need].setting, tools: TOOLS.filter((t) => t.needs?.includes(need)).map((t) => t.name) }))
    .filter((u) => u.tools.length > 0);
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

/** What each need is configured by: the setting an operator sets to offer the tools that need it. */
const NEED_SETTINGS: Record<Need, { setting: string; configured(config: Config): boolean }> = {
  llm: { setting: 'LLM_BASE_URL', configured: (c) => !!c.LLM_BASE_URL },
  search: { setting: 'SEARCH_BASE_URL', configured: (c) => !!c.SEARCH_BASE_URL },
  wayback: { setting: 'WAYBACK_CDX_URL', configured: (c) => !!c.WAYBACK_CDX_URL },
  youtube: { setting: 'YOUTUBE_BASE_URL', configured: (c) => !!c.YOUTUBE_BASE_URL },
};

/** 503 tool_unavailable when a need of the tool is not configured here: checked at admission, so nothing is held or charged. */
export function assertNeedsMet(tool: AnyTool, config: Config): void {
  const unmet = (tool.needs ?? []).filter((n) => !NEED_SETTINGS[n].configured(config));
  if (!unmet.length) return;
  const settings = unmet.map((n) => NEED_SETTINGS[n].setting);
  throw new AppError(
    'tool_unavailable',
    `${tool.name} is not available on this service: it needs ${unmet.join(' and ')}, which is not configured (${settings.join(', ')}). Nothing was charged.`,
    {
      tool: tool.name,
      needs: unmet,
    },
  );
}

const BIG = 2n ** 53n;

/**
 * The input the root protocol's `q` gives a tool: `{[qField]: value}`, the value parsed as the
 * tool's `qParse` says. A q that does not parse is 400 invalid_input naming q.
 */
export function qInput(tool: AnyTool, q: string): Record<string, unknown> {
  const bad = (message: string) => new AppError('invalid_input', `q for ${tool.name} ${message}`, { issues: [{ path: ['q'], message }] });
  switch (tool.qParse ?? 'text') {
    case 'text':
      return { [tool.qField]: q };
    case 'lines':
      return {
        [tool.qField]: q
          .split(/\r?\n/)
          .map((l) => l.trim())
          .filter(Boolean),
      };
    case 'numbers': {
      const tokens = q.split(/[\s,;]+/).filter(Boolean);
      const values = tokens.map((t) => {
        if (/^[-+]?\d+$/.test(t)) {
          const n = BigInt(t);
          return n > BIG || n < -BIG ? n.toString() : Number(n);
        }
        const n = Number(t);
        if (!Number.isFinite(n)) throw bad(`must be numbers separated by commas, spaces or new lines ("${t.slice(0, 40)}" is not one)`);
        return n;
      });
      return { [tool.qField]: values };
    }
    case 'json':
      try {
        return { [tool.qField]: JSON.parse(q) };
      } catch {
        throw bad('must be JSON');
      }
  }
}
