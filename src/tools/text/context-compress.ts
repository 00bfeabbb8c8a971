import { z } from 'zod';
import { AppError } from '../../errors.js';
import { defineTool } from '../types.js';
import { bigConversation } from './context-health.js';
import {
  checkSignal,
  conversationFields,
  conversationOf,
  conversationTokens,
  lastUserIndex,
  messageTokens,
  MessageOut,
  refineConversation,
  sentences,
  tokensOf,
  truncateTokens,
  type Message,
} from './conversation.js';

/**
 * context_compress: a conversation shrunk to budget_tokens (o200k_base + 4 per message, as
 * context_health counts), changing as little as it must. Stages, each oldest first and each stopping
 * as soon as the conversation fits:
 *   1. dedupe: a user/assistant message repeating an earlier one (same role, same text) is dropped; a
 *      repeated tool output is replaced by "[duplicate of message j]" (the tool message stays, so its call keeps its answer);
 *   2. trim tool outputs older than the last keep_last_turns turns (to 256, then 64 tokens);
 *   3. compress old turns: user/assistant text outside those turns is cut to its first sentences (64 tokens);
 *   4. drop middle turns: whole turns, oldest first, the first turn (the task) last;
 *   5. then the same inside the kept turns, as a last resort.
 * Never touched: system messages and the last user message (verbatim). An assistant message with
 * tool_calls and the tool messages answering it are kept or dropped together, so the result stays a
 * valid chat transcript, in the original order. If even the protected messages do not fit, 400.
 */

const Input = z
  .object({
    ...conversationFields,
    budget_tokens: z.number().int().min(50).max(2_000_000).describe('The token budget for the result (o200k_base, 4 framing tokens per message)'),
    keep_last_turns: z
      .number()
      .int()
      .min(1)
      .max(20)
      .default(3)
      .describe('Turns (a user message and the replies after it) kept verbatim where possible (1-20, default 3)'),
  })
  .superRefine(refineConversation);

const ACTIONS = ['dedupe', 'trim_tool_output', 'compress_turn', 'drop'] as const;

const Output = z.object({
  messages: z.array(MessageOut),
  tokens_before: z.number().int(),
  tokens_after: z.number().int(),
  budget_tokens: z.number().int(),
  actions: z.array(z.object({ i: z.number().int(), action: z.enum(ACTIONS), tokens_before: z.number().int(), tokens_after: z.number().int() })),
  kept: z.array(z.number().int()),
});

type Action = z.infer<typeof Output>['actions'][number];

export const contextCompress = defineTool({
  name: 'context_compress',
  description:
    'Shrinks a conversation to a token budget (dedupe, trim tool outputs, compress old turns, drop middle turns), keeping it a valid chat transcript.',
  tier: 'pro',
  priceCents: 2,
  family: 'text',
  input: Input,
  qField: 'transcript',
  qParse: 'text',
  progress: true,
  output:
    '{messages (OpenAI chat format), tokens_before, tokens_after, budget_tokens, actions[{i,action dedupe|trim_tool_output|compress_turn|drop,tokens_before,tokens_after}], kept (original indices)}',
  outputSchema: Output,
  examples: [
    {
      transcript:
        'system: You are a release assistant.\nuser: The staging deploy failed. The migration 0042 timed out after 30 seconds while holding a lock on the orders table, and the health check then failed three times.\nassistant: The migration holds a lock on orders for too long. Split it into two steps: add the column without a default, then backfill in batches of 10,000 rows.\nuser: Fine. Which batch size for production?\nassistant: Start with 5,000 rows per batch and watch the replication lag.\nuser: Write the rollout checklist.',
      budget_tokens: 80,
      keep_last_turns: 1,
    },
    {
      messages: [
        { role: 'system', content: 'You help with searches.' },
        { role: 'user', content: 'Find the changelog.' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"q":"changelog"}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: 'CHANGELOG.md: 2.1.0 adds streaming; 2.0.0 drops Node 16; 1.9.0 fixes retries. '.repeat(20) },
        { role: 'assistant', content: 'The changelog is CHANGELOG.md; 2.1.0 adds streaming.' },
        { role: 'user', content: 'What does 2.0.0 change?' },
      ],
      budget_tokens: 150,
      keep_last_turns: 1,
    },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 20_000, memoryMb: 512 },
  largestInput: () => ({ messages: bigConversation(), budget_tokens: 2_000, keep_last_turns: 20 }),
  handler: async (input, ctx) => compressConversation(conversationOf(input), input.budget_tokens, input.keep_last_turns, ctx),
});

interface Ctx {
  signal: AbortSignal;
  progress(p: { stage: string; done?: number; total?: number }): Promise<void>;
}

export async function compressConversation(original: Message[], budget: number, keepTurns: number, ctx: Ctx) {
  const n = original.length;
  const msgs: Message[] = original.map((m) => ({ ...m }));
  const tokens = msgs.map(messageTokens);
  const tokensBefore = tokens.reduce((a, b) => a + b, 0);
  const dropped = new Array<boolean>(n).fill(false);
  const actions: Action[] = [];
  let total = tokensBefore;
  const fits = () => total <= budget;

  const last = lastUserIndex(msgs);
  const isProtected = (i: number) => msgs[i]!.role === 'system' || i === last;

  // Units: an assistant message with tool_calls and the tool messages answering it; else one message.
  const unitOf = new Array<number>(n);
  const units: number[][] = [];
  const callUnit = new Map<string, number>();
  msgs.forEach((m, i) => {
    if (m.role === 'tool' && m.tool_call_id !== undefined && callUnit.has(m.tool_call_id)) {
      const u = callUnit.get(m.tool_call_id)!;
      units[u]!.push(i);
      unitOf[i] = u;
      return;
    }
    unitOf[i] = units.length;
    units.push([i]);
    if (m.role === 'assistant') for (const c of m.tool_calls ?? []) callUnit.set(c.id, unitOf[i]!);
  });

  // Turns start at user messages; the last keepTurns turns (and anything after the last user) are the tail.
  const userStarts: number[] = [];
  msgs.forEach((m, i) => {
    if (m.role === 'user') userStarts.push(i);
  });
  const tailStart = userStarts.length ? userStarts[Math.max(0, userStarts.length - keepTurns)]! : 0;
  // A unit belongs to the tail when its first message does.
  const inTail = (i: number) => units[unitOf[i]!]![0]! >= tailStart;

  const setContent = (i: number, content: string, action: Action['action']) => {
    const before = tokens[i]!;
    msgs[i] = { ...msgs[i]!, content };
    tokens[i] = messageTokens(msgs[i]!);
    total += tokens[i]! - before;
    actions.push({ i, action, tokens_before: before, tokens_after: tokens[i]! });
  };
  const drop = (i: number) => {
    if (dropped[i]) return;
    dropped[i] = true;
    total -= tokens[i]!;
    actions.push({ i, action: 'drop', tokens_before: tokens[i]!, tokens_after: 0 });
  };
  const dropUnit = (u: number) => {
    for (const i of units[u]!) drop(i);
  };
  const stage = async (name: string, k: number) => {
    checkSignal(ctx.signal);
    await ctx.progress({ stage: name, done: k, total: 5 });
  };

  if (!fits()) {
    // 1. dedupe
    await stage('dedupe', 0);
    const seen = new Map<string, number>();
    for (let i = 0; i < n && !fits(); i++) {
      const m = msgs[i]!;
      const text = (m.content ?? '').trim();
      if (!text || m.role === 'system') continue;
      const key = `${m.role}\u0000${text}`;
      const first = seen.get(key);
      if (first === undefined) {
        seen.set(key, i);
        continue;
      }
      if (isProtected(i)) continue;
      if (m.role === 'tool' || m.tool_calls?.length) {
        const marker = `[duplicate of message ${first}]`;
        if (tokensOf(marker) < tokensOf(m.content ?? '')) setContent(i, marker, 'dedupe');
      } else if (units[unitOf[i]!]!.length === 1) {
        dropped[i] = true;
        total -= tokens[i]!;
        actions.push({ i, action: 'dedupe', tokens_before: tokens[i]!, tokens_after: 0 });
      }
    }
  }

  const trimTools = (tail: boolean) => {
    for (const cap of [256, 64, 16]) {
      for (let i = 0; i < n && !fits(); i++) {
        if (i % 64 === 0) checkSignal(ctx.signal);
        const m = msgs[i]!;
        if (dropped[i] || m.role !== 'tool' || inTail(i) !== tail || isProtected(i)) continue;
        const content = m.content ?? '';
        if (tokensOf(content) <= cap) continue;
        setContent(i, truncateTokens(content, cap, ' [… trimmed]'), 'trim_tool_output');
      }
    }
  };
  const compressTurns = (tail: boolean) => {
    for (let i = 0; i < n && !fits(); i++) {
      if (i % 64 === 0) checkSignal(ctx.signal);
      const m = msgs[i]!;
      if (dropped[i] || (m.role !== 'user' && m.role !== 'assistant') || inTail(i) !== tail || isProtected(i)) continue;
      const content = m.content ?? '';
      if (tokensOf(content) <= 64) continue;
      setContent(i, firstSentences(content, 64), 'compress_turn');
    }
  };

  if (!fits()) {
    await stage('trim_tool_outputs', 1);
    trimTools(false);
  }
  if (!fits()) {
    await stage('compress_old_turns', 2);
    compressTurns(false);
  }
  if (!fits()) {
    // 4. drop middle turns: turns before the tail, the second turn first, the first turn last.
    await stage('drop_middle_turns', 3);
    const before = units.map((_, u) => u).filter((u) => units[u]![0]! < tailStart);
    const firstTurnEnd = userStarts.length > 1 ? userStarts[1]! : tailStart;
    const order = [...before.filter((u) => units[u]![0]! >= firstTurnEnd), ...before.filter((u) => units[u]![0]! < firstTurnEnd)];
    for (const u of order) {
      if (fits()) break;
      if (units[u]!.some(isProtected)) continue;
      dropUnit(u);
    }
  }
  if (!fits()) {
    // 5. the kept turns themselves, protected messages excepted.
    await stage('compress_recent_turns', 4);
    trimTools(true);
    compressTurns(true);
    for (let u = 0; u < units.length && !fits(); u++) {
      if (units[u]![0]! < tailStart || units[u]!.some(isProtected)) continue;
      dropUnit(u);
    }
  }
  if (!fits()) {
    // Whatever is left besides the protected messages (units holding a system message, say).
    for (let u = 0; u < units.length && !fits(); u++) {
      for (const i of units[u]!) if (!isProtected(i) && units[u]!.length === 1) drop(i);
    }
  }

  const kept: number[] = [];
  for (let i = 0; i < n; i++) if (!dropped[i]) kept.push(i);
  const messages = kept.map((i) => msgs[i]!);
  const tokensAfter = conversationTokens(messages);
  if (tokensAfter > budget) {
    throw new AppError(
      'invalid_input',
      `budget_tokens ${budget} is below the ${tokensAfter} tokens that the system message(s) and the last user message need verbatim`,
      {
        issues: [{ path: ['budget_tokens'], message: `at least ${tokensAfter} tokens are needed` }],
        minimum_budget: tokensAfter,
      },
    );
  }
  await ctx.progress({ stage: 'done', done: 5, total: 5 });
  actions.sort((a, b) => a.i - b.i);
  return { messages, tokens_before: tokensBefore, tokens_after: tokensAfter, budget_tokens: budget, actions, kept };
}

/** The first sentences of a text that fit maxTokens (the first one cut if it alone is too long), with " […]". */
function firstSentences(text: string, maxTokens: number): string {
  const marker = ' […]';
  const room = maxTokens - tokensOf(marker);
  let end = 0;
  for (const s of sentences(text)) {
    if (tokensOf(text.slice(0, s.end)) > room) break;
    end = s.end;
  }
  if (end === 0) return truncateTokens(text, maxTokens);
  return text.slice(0, end) + marker;
}
