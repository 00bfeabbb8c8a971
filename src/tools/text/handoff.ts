import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import { bigConversation } from './context-health.js';
import { extractItems, type ExtractItem } from './context-extract.js';
import { checkSignal, conversationFields, conversationOf, refineConversation, ROLES, tokensOf, truncateTokens, type Message } from './conversation.js';

/**
 * handoff: a brief another agent can continue from, within budget_tokens (o200k_base count of
 * brief_markdown). Goal = the first user message; state = the last assistant reply; decisions, todos,
 * open questions and constraints come from context_extract's cue table (the most recent first kept);
 * last_turns = the last 4 user/assistant messages (tool calls shown as name(arguments)). To fit, it cuts
 * turns to 60 tokens, then drops the oldest items of the longest list, then the oldest turns, then
 * shortens goal and state. With `store: true` the brief's markdown is kept as a passport of the
 * account (after the pool work, on the event loop: `finish`), and the result names its handle.
 */

const LIST_CAP = 20;
const ITEM_TOKENS = 80;

const Input = z
  .object({
    ...conversationFields,
    budget_tokens: z.number().int().min(200).max(8000).default(1500).describe('The most tokens the brief may take (200-8,000, default 1,500; o200k_base)'),
    store: z
      .boolean()
      .default(false)
      .describe('Also keep brief_markdown as a passport of your account (passport_store get, passport_send), and return its handle'),
    store_ttl_s: z
      .number()
      .int()
      .min(60)
      .max(30 * 86400)
      .optional()
      .describe('Lifetime of that passport in seconds (60 s to 30 days, default 1 day)'),
  })
  .superRefine(refineConversation);

const Turn = z.object({ i: z.number().int(), role: z.enum(ROLES), text: z.string() });
const Brief = z.object({
  goal: z.string(),
  state: z.string(),
  decisions: z.array(z.string()),
  todos: z.array(z.string()),
  open_questions: z.array(z.string()),
  constraints: z.array(z.string()),
  last_turns: z.array(Turn),
});
const Passport = z.object({ handle: z.string(), bytes: z.number().int(), sha256: z.string(), expires_at: z.string() });
const Output = z.object({ brief_markdown: z.string(), brief: Brief, tokens: z.number().int(), budget_tokens: z.number().int(), passport: Passport.optional() });
type BriefT = z.infer<typeof Brief>;

export const handoff = defineTool({
  name: 'handoff',
  // Not idempotent though it changes nothing outside: each call keeps its brief as a new passport.
  idempotent: false,
  // The transcript and its brief are a passport's content.
  sensitive: true,
  description: 'A brief another agent can continue from (goal, state, decisions, todos, open questions, last turns) within a token budget.',
  tier: 'enterprise',
  priceCents: 0,
  family: 'text',
  input: Input,
  qField: 'transcript',
  qParse: 'text',
  output:
    '{brief_markdown, brief{goal,state,decisions,todos,open_questions,constraints,last_turns[{i,role,text}]}, tokens, budget_tokens, passport?{handle,bytes,sha256,expires_at}}',
  outputSchema: Output,
  examples: [
    {
      transcript:
        'system: You are a coding assistant. Never push to main directly.\nuser: Add rate limiting to the public API.\nassistant: We decided to use a token bucket per API key, stored in Redis. I wrote src/limits.ts.\nuser: Good. Should the limit be per minute or per second?\nassistant: Per minute is simpler to explain. TODO: add tests for burst traffic.',
      budget_tokens: 300,
    },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 10_000, memoryMb: 384 },
  largestInput: () => ({ messages: bigConversation(), budget_tokens: 8000 }),
  handler: async (input, ctx) => makeHandoff(conversationOf(input), input.budget_tokens, ctx.signal),
  finish: async (result, input, ctx) => {
    if (!input.store) return result;
    if (!ctx.passports)
      throw new AppError('invalid_input', 'store keeps the brief as a passport of an account: call with an API key', {
        issues: [{ path: ['store'], message: 'needs an account' }],
      });
    const p = await ctx.passports.put({ content: result.brief_markdown, label: 'handoff', ...(input.store_ttl_s ? { ttl_s: input.store_ttl_s } : {}) });
    return { ...result, passport: { handle: p.handle, bytes: p.bytes, sha256: p.sha256, expires_at: p.expires_at } };
  },
});

export function makeHandoff(messages: Message[], budget: number, signal: AbortSignal) {
  const { items } = extractItems(messages, ['decision', 'todo', 'open_question', 'constraint'], 100_000, signal);
  const recent = (kind: ExtractItem['kind']) =>
    items
      .filter((it) => it.kind === kind)
      .slice(-LIST_CAP)
      .map((it) => truncateTokens(it.text.replace(/\s+/g, ' '), ITEM_TOKENS));
  const firstUser = messages.find((m) => m.role === 'user' && (m.content ?? '').trim());
  const lastAssistant = [...messages].reverse().find((m) => m.role === 'assistant' && (m.content ?? '').trim());
  let goalTokens = Math.floor(budget / 5);
  let stateTokens = Math.floor(budget / 5);
  const goalText = (firstUser?.content ?? '').replace(/\s+/g, ' ').trim();
  const stateText = (lastAssistant?.content ?? '').replace(/\s+/g, ' ').trim();
  const turns = messages
    .map((m, i) => ({ m, i }))
    .filter(({ m }) => m.role === 'user' || m.role === 'assistant')
    .slice(-4)
    .map(({ m, i }) => ({ i, role: m.role, text: turnText(m) }));

  const brief: BriefT = {
    goal: truncateTokens(goalText, goalTokens) || '(no user message)',
    state: truncateTokens(stateText, stateTokens) || '(no assistant reply yet)',
    decisions: recent('decision'),
    todos: recent('todo'),
    open_questions: recent('open_question'),
    constraints: recent('constraint'),
    last_turns: turns.map((t) => ({ ...t, text: truncateTokens(t.text, 200) })),
  };

  let markdown = render(brief);
  let tokens = tokensOf(markdown);
  let turnsCut = false;
  while (tokens > budget) {
    checkSignal(signal);
    const lists = (['decisions', 'todos', 'open_questions', 'constraints'] as const).filter((k) => brief[k].length);
    if (!turnsCut) {
      brief.last_turns = brief.last_turns.map((t) => ({ ...t, text: truncateTokens(t.text, 60) }));
      turnsCut = true;
    } else if (lists.length) {
      // The longest list loses its oldest item (ties: the list named first).
      const longest = lists.reduce((a, b) => (brief[b].length > brief[a].length ? b : a));
      brief[longest].shift();
    } else if (brief.last_turns.length) {
      brief.last_turns.shift();
    } else if (goalTokens > 8 || stateTokens > 8) {
      goalTokens = Math.max(8, Math.floor(goalTokens / 2));
      stateTokens = Math.max(8, Math.floor(stateTokens / 2));
      brief.goal = truncateTokens(goalText, goalTokens) || '(no user message)';
      brief.state = truncateTokens(stateText, stateTokens) || '(no assistant reply yet)';
    } else {
      break;
    }
    markdown = render(brief);
    tokens = tokensOf(markdown);
  }
  return { brief_markdown: markdown, brief, tokens, budget_tokens: budget };
}

function turnText(m: Message): string {
  const parts: string[] = [];
  if (m.content?.trim()) parts.push(m.content.replace(/\s+/g, ' ').trim());
  for (const c of m.tool_calls ?? []) parts.push(`${c.function.name}(${c.function.arguments.replace(/\s+/g, ' ').slice(0, 400)})`);
  return parts.join(' ');
}

function render(b: BriefT): string {
  const list = (title: string, xs: string[]) => (xs.length ? `\n## ${title}\n${xs.map((x) => `- ${x}`).join('\n')}\n` : '');
  return (
    `# Handoff\n\n## Goal\n${b.goal}\n\n## State\n${b.state}\n` +
    list('Decisions', b.decisions) +
    list('Todos', b.todos) +
    list('Open questions', b.open_questions) +
    list('Constraints', b.constraints) +
    (b.last_turns.length ? `\n## Last turns\n${b.last_turns.map((t) => `- [${t.i}] ${t.role}: ${t.text}`).join('\n')}\n` : '')
  );
}
