import { z } from 'zod';
import { PLANS, defineTool } from '../types.js';

const BalanceOutput = z.object({
  credits: z.number().int().describe("The account's balance, in cents"),
  plan: z.enum(PLANS),
  used_this_month: z.number().int().describe("Cents charged this calendar month (UTC): the account's, or the sub-key's own when called with a sub-key"),
});

export const checkBalance = defineTool({
  name: 'check_balance',
  description: "Returns the caller's credits (cents), plan and this month's use.",
  tier: 'free',
  priceCents: 0,
  family: 'core',
  input: z.object({ q: z.string().max(1000).optional().describe('Ignored; lets check_balance sit in a chain') }).strict(),
  qField: 'q',
  output: '{credits, plan, used_this_month}',
  outputSchema: BalanceOutput,
  examples: [{}],
  handler: async (_input, ctx) => ctx.balance(),
});
