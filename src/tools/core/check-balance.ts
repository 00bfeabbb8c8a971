import { z } from 'zod';
import { defineTool } from '../types.js';

export const checkBalance = defineTool({
  name: 'check_balance',
  description: "Returns the caller's credits (cents), plan and this month's use.",
  tier: 'free',
  priceCents: 0,
  family: 'core',
  input: z.object({ q: z.string().max(1000).optional().describe('Ignored; lets check_balance sit in a chain') }).strict(),
  qField: 'q',
  output: '{credits, plan, used_this_month}',
  examples: [{}],
  handler: async (_input, ctx) => ctx.balance(),
});
