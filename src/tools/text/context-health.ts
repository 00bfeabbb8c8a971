import { z } from 'zod';
import { defineTool } from '../types.js';
import { checkSignal, conversationFields, conversationOf, messageTokens, refineConversation, ROLES, toolNameOf, type Message } from './conversation.js';

/**
 * context_health: where a conversation's tokens go and what to do about it. Counts are o200k_base
 * (js-tiktoken) plus 4 framing tokens per message; fill_ratio is exactly total / window.
 * Status: < 0.5 ok, < 0.75 watch, < 0.9 compress, otherwise handoff.
 */

const WATCH = 0.5;
const COMPRESS = 0.75;
const HANDOFF = 0.9;
/** A tool output this large, with this many user turns after it, is stale. */
const STALE_MIN_TOKENS = 200;
const STALE_AFTER_TURNS = 3;

const Input = z
  .object({
    ...conversationFields,
    window: z.number().int().min(1000).max(10_000_000).default(128_000).describe('The model context window in tokens (default 128,000)'),
  })
  .superRefine(refineConversation);

const RoleCounts = z.object({ system: z.number().int(), user: z.number().int(), assistant: z.number().int(), tool: z.number().int() });

const Output = z.object({
  tokens: z.object({
    total: z.number().int(),
    by_role: RoleCounts,
    largest: z.array(z.object({ i: z.number().int(), role: z.enum(ROLES), tokens: z.number().int() })),
  }),
  window: z.number().int(),
  fill_ratio: z.number(),
  messages: z.number().int(),
  duplicates: z.array(z.object({ i: z.number().int(), duplicate_of: z.number().int(), tokens: z.number().int() })),
  stale_tool_outputs: z.array(z.object({ i: z.number().int(), tool: z.string().nullable(), tokens: z.number().int(), reason: z.enum(['superseded', 'old']) })),
  reclaimable_tokens: z.number().int(),
  status: z.enum(['ok', 'watch', 'compress', 'handoff']),
  recommended: z.array(z.string()),
});

type Result = z.infer<typeof Output>;

export const contextHealth = defineTool({
  name: 'context_health',
  description: 'The state of a context window: tokens by role, fill ratio, duplicate messages, stale tool outputs and what to do next.',
  tier: 'pro',
  priceCents: 1,
  family: 'text',
  input: Input,
  qField: 'transcript',
  qParse: 'text',
  output:
    '{tokens{total,by_role,largest[{i,role,tokens}]}, window, fill_ratio, messages, duplicates[{i,duplicate_of,tokens}], stale_tool_outputs[{i,tool,tokens,reason}], reclaimable_tokens, status ok|watch|compress|handoff, recommended[]}',
  outputSchema: Output,
  examples: [
    {
      transcript:
        'system: You are a helpful assistant.\nuser: Summarise the report.\nassistant: The report says revenue grew 12% in Q3.\nuser: Summarise the report.',
      window: 8000,
    },
    {
      messages: [
        { role: 'system', content: 'You answer questions about the weather.' },
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: '{"temp_c":18,"sky":"cloudy"}' },
        { role: 'assistant', content: 'It is 18 °C and cloudy in Paris.' },
      ],
      window: 4000,
    },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 15_000, memoryMb: 384 },
  largestInput: () => ({ messages: bigConversation(), window: 128_000 }),
  handler: async (input, ctx) => analyseHealth(conversationOf(input), input.window, ctx.signal),
});

export function analyseHealth(messages: Message[], window: number, signal: AbortSignal): Result {
  const by_role = { system: 0, user: 0, assistant: 0, tool: 0 };
  const counts: number[] = [];
  for (let i = 0; i < messages.length; i++) {
    if (i % 50 === 0) checkSignal(signal);
    const n = messageTokens(messages[i]!);
    counts.push(n);
    by_role[messages[i]!.role] += n;
  }
  const total = counts.reduce((a, b) => a + b, 0);
  const largest = counts
    .map((tokens, i) => ({ i, role: messages[i]!.role, tokens }))
    .sort((a, b) => b.tokens - a.tokens || a.i - b.i)
    .slice(0, 5);

  // Duplicates: same role and the same non-empty content (whitespace-trimmed) as an earlier message.
  const seen = new Map<string, number>();
  const duplicates: Result['duplicates'] = [];
  messages.forEach((m, i) => {
    const text = (m.content ?? '').trim();
    if (!text || m.role === 'system') return;
    const key = `${m.role}\u0000${text}`;
    const first = seen.get(key);
    if (first === undefined) seen.set(key, i);
    else duplicates.push({ i, duplicate_of: first, tokens: counts[i]! });
  });

  // Stale tool outputs: superseded by a later answer to the same call (same function and arguments),
  // or large and STALE_AFTER_TURNS user turns old.
  const callKey = new Map<string, string>();
  for (const m of messages) for (const c of m.tool_calls ?? []) callKey.set(c.id, `${c.function.name}\u0000${c.function.arguments.trim()}`);
  const lastAnswer = new Map<string, number>();
  messages.forEach((m, i) => {
    if (m.role === 'tool' && m.tool_call_id !== undefined && callKey.has(m.tool_call_id)) lastAnswer.set(callKey.get(m.tool_call_id)!, i);
  });
  const userAfter: number[] = new Array(messages.length).fill(0);
  for (let i = messages.length - 2; i >= 0; i--) userAfter[i] = userAfter[i + 1]! + (messages[i + 1]!.role === 'user' ? 1 : 0);
  const stale: Result['stale_tool_outputs'] = [];
  messages.forEach((m, i) => {
    if (m.role !== 'tool') return;
    const key = m.tool_call_id !== undefined ? callKey.get(m.tool_call_id) : undefined;
    if (key !== undefined && lastAnswer.get(key)! > i) stale.push({ i, tool: toolNameOf(messages, i), tokens: counts[i]!, reason: 'superseded' });
    else if (counts[i]! >= STALE_MIN_TOKENS && userAfter[i]! >= STALE_AFTER_TURNS)
      stale.push({ i, tool: toolNameOf(messages, i), tokens: counts[i]!, reason: 'old' });
  });

  const reclaimable_tokens = duplicates.reduce((a, d) => a + d.tokens, 0) + stale.reduce((a, s) => a + s.tokens, 0);
  const fill_ratio = total / window;
  const status = fill_ratio < WATCH ? 'ok' : fill_ratio < COMPRESS ? 'watch' : fill_ratio < HANDOFF ? 'compress' : 'handoff';
  const recommended: string[] = [];
  if (status === 'handoff') recommended.push(`Hand off: the window is ${pct(fill_ratio)} full; run handoff for a brief another agent can continue from`);
  if (status === 'compress' || status === 'handoff') {
    recommended.push(`Compress: run context_compress with budget_tokens ${Math.floor(window * WATCH)} (half the window)`);
  }
  if (status === 'watch') recommended.push(`Watch: ${pct(fill_ratio)} of the window is used; compress before it passes ${pct(COMPRESS)}`);
  if (duplicates.length) recommended.push(`Drop ${duplicates.length} duplicate message(s) (${duplicates.reduce((a, d) => a + d.tokens, 0)} tokens)`);
  if (stale.length) recommended.push(`Trim ${stale.length} stale tool output(s) (${stale.reduce((a, s) => a + s.tokens, 0)} tokens)`);
  if (largest[0] && total > 0 && largest[0].tokens / total >= 0.5 && messages.length > 1) {
    recommended.push(`Message ${largest[0].i} (${largest[0].role}) holds ${pct(largest[0].tokens / total)} of the tokens`);
  }
  if (!recommended.length) recommended.push('Nothing to do');

  return {
    tokens: { total, by_role, largest },
    window,
    fill_ratio,
    messages: messages.length,
    duplicates,
    stale_tool_outputs: stale,
    reclaimable_tokens,
    status,
    recommended,
  };
}

function pct(x: number): string {
  return `${Math.round(x * 1000) / 10}%`;
}

/** 1,000 messages and 400,000 characters: the caps. Shared with the other tools' largestInput. */
export function bigConversation(): Message[] {
  const para = 'The deployment failed because the database migration 0042 timed out after 30 seconds; we should retry with a longer lock timeout. ';
  const out: Message[] = [{ role: 'system', content: 'You are an operations assistant. Always answer in English.' }];
  let i = 0;
  while (out.length < 1000) {
    const k = out.length;
    if (k % 4 === 1) out.push({ role: 'user', content: `Question ${i}: what happened with release ${i}? ${para}`.slice(0, 390) });
    else if (k % 4 === 2)
      out.push({
        role: 'assistant',
        content: null,
        tool_calls: [{ id: `call_${i}`, type: 'function', function: { name: 'logs', arguments: `{"release":${i}}` } }],
      });
    else if (k % 4 === 3) out.push({ role: 'tool', tool_call_id: `call_${i}`, content: `${para}${para}${para}`.slice(0, 380) });
    else {
      out.push({ role: 'assistant', content: `Release ${i}: ${para}`.slice(0, 380) });
      i++;
    }
  }
  return out;
}
