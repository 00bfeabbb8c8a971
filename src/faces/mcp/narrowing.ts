import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import type { KeyCaller } from '../../access/auth.js';
import { resolveNarrowing, type ToolNarrowing, type ToolSetsRepo } from '../../access/tool-sets.js';
import { input } from '../http/route-schema.js';

/** A list parameter given once (a repeated one is joined, as if sent comma-separated), length-capped. */
const list = (max: number, what: string) =>
  z
    .preprocess((v) => (Array.isArray(v) ? v.join(',') : v), z.string().max(max, `at most ${max} characters`))
    .optional()
    .describe(what);

/** /mcp's query: each parameter given narrows the tools the request offers (their intersection). */
export const McpQuery = z
  .object({
    tools: list(2_000, 'Comma-separated tool names: only these are listed and callable on this connection.'),
    families: list(200, 'Comma-separated families (core, web, llm, edge, text, math, media): only their tools.'),
    set: z.string().max(64, 'at most 64 characters').optional().describe("One of the account's tool sets by name (GET /toolsets)."),
  })
  .passthrough();

/**
 * The narrowing the request's URL asks for (null for none), read after authentication and before the
 * MCP transport: an unknown tool, family or set is 400 invalid_input in the service's envelope.
 */
export async function readNarrowing(req: FastifyRequest, caller: KeyCaller, toolSets: ToolSetsRepo): Promise<ToolNarrowing | null> {
  const q = input<typeof McpQuery>(req, 'querystring', 'The /mcp query is invalid');
  return resolveNarrowing(q, async (name) => toolSets.get(caller.accountId, name));
}
