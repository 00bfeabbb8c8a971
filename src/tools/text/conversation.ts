import { z } from 'zod';
import { AppError } from '../../errors.js';
import { countTokensA } from './tiktoken-count.js';

/**
 * Conversations for the context_* tools, conversation_diagnostic and handoff: `messages` in the
 * OpenAI chat format or a `transcript` of "role: text" lines (which q fills). Pure functions, no side
 * effects on load: the tools that import this module run in the sandbox pool.
 */

export const MAX_MESSAGES = 1000;
/** Text cap (CATALOGUE conventions): the transcript, or the sum of every message's content and tool-call arguments. */
export const MAX_TEXT_CHARS = 400_000;
/** Framing tokens counted per message (role and separators), as OpenAI's chat format adds ~3-4. */
export const MESSAGE_OVERHEAD_TOKENS = 4;

export const ROLES = ['system', 'user', 'assistant', 'tool'] as const;
export type Role = (typeof ROLES)[number];

const ToolCallSchema = z.object({
  id: z.string().min(1).max(200).describe('The call id a tool message answers with tool_call_id'),
  type: z.literal('function').default('function').describe('Always "function"'),
  function: z
    .object({
      name: z.string().min(1).max(200).describe('The function called'),
      arguments: z.string().max(MAX_TEXT_CHARS).default('').describe('Its arguments, a JSON string as the model wrote it'),
    })
    .describe('The function and its arguments'),
});

export const MessageSchema = z.object({
  role: z.enum(ROLES).describe('system, user, assistant or tool'),
  content: z.string().max(MAX_TEXT_CHARS).nullable().default(null).describe('The text (null for an assistant message that only calls tools)'),
  name: z.string().max(200).optional().describe('Optional participant name'),
  tool_calls: z.array(ToolCallSchema).max(128).optional().describe('Assistant only: the tool calls it makes'),
  tool_call_id: z.string().max(200).optional().describe('Tool only: the id of the assistant tool call this answers'),
});

export type ToolCall = { id: string; type: 'function'; function: { name: string; arguments: string } };
export interface Message {
  role: Role;
  content: string | null;
  name?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
}

/** Output schema of a message (what context_compress returns). */
export const MessageOut = z.object({
  role: z.enum(ROLES),
  content: z.string().nullable(),
  name: z.string().optional(),
  tool_calls: z.array(z.object({ id: z.string(), type: z.literal('function'), function: z.object({ name: z.string(), arguments: z.string() }) })).optional(),
  tool_call_id: z.string().optional(),
});

export const conversationFields = {
  messages: z
    .array(MessageSchema)
    .min(1)
    .max(MAX_MESSAGES)
    .optional()
    .describe(
      `The conversation in the OpenAI chat format (at most ${MAX_MESSAGES} messages, ${MAX_TEXT_CHARS.toLocaleString('en')} characters in all); give this or transcript`,
    ),
  transcript: z
    .string()
    .min(1)
    .max(MAX_TEXT_CHARS)
    .optional()
    .describe('The conversation as "role: text" lines (system, user, assistant, tool; lines without a role continue the message above); give this or messages'),
};

type ConversationInput = { messages?: Message[] | undefined; transcript?: string | undefined };

/** Refinement for a tool's input object: exactly one of messages/transcript, and the text cap. */
export function refineConversation(value: ConversationInput, ctx: z.RefinementCtx): void {
  if (!!value.messages === !!value.transcript) {
    ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['messages'], message: 'Give either messages or transcript (exactly one)' });
    return;
  }
  if (value.messages) {
    let chars = 0;
    for (const m of value.messages) {
      chars += (m.content ?? '').length;
      for (const c of m.tool_calls ?? []) chars += c.function.arguments.length + c.function.name.length;
    }
    if (chars > MAX_TEXT_CHARS) {
      ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['messages'], message: `messages hold ${chars} characters; at most ${MAX_TEXT_CHARS} are allowed` });
    }
  }
}

const ROLE_ALIASES: Record<string, Role> = {
  system: 'system',
  user: 'user',
  human: 'user',
  assistant: 'assistant',
  ai: 'assistant',
  bot: 'assistant',
  tool: 'tool',
  function: 'tool',
};
const ROLE_LINE = /^\s*(system|user|human|assistant|ai|bot|tool|function)\s*:\s?/i;

/**
 * "role: text" lines into messages. A line that starts with a role (case-insensitive; human → user,
 * ai/bot → assistant, function → tool) opens a message; other lines continue the one above. Text
 * before the first role line is a user message. Content is the text after "role: ", lines joined by \n.
 */
export function parseTranscript(transcript: string): Message[] {
  const out: Message[] = [];
  let current: { role: Role; lines: string[] } | null = null;
  const flush = () => {
    if (current) out.push({ role: current.role, content: current.lines.join('\n').replace(/\s+$/, '') });
  };
  for (const line of transcript.split(/\r?\n/)) {
    const m = ROLE_LINE.exec(line);
    if (m) {
      flush();
      current = { role: ROLE_ALIASES[m[1]!.toLowerCase()]!, lines: [line.slice(m[0].length)] };
    } else if (current) {
      current.lines.push(line);
    } else if (line.trim()) {
      current = { role: 'user', lines: [line] };
    }
  }
  flush();
  if (!out.length) throw new AppError('invalid_input', 'The transcript holds no messages', { issues: [{ path: ['transcript'], message: 'no messages' }] });
  if (out.length > MAX_MESSAGES) {
    throw new AppError('invalid_input', `The transcript holds ${out.length} messages; at most ${MAX_MESSAGES} are allowed`, {
      issues: [{ path: ['transcript'], message: 'too many messages' }],
    });
  }
  return out;
}

/** The conversation of a parsed input, as plain messages (copies; the input is never changed). */
export function conversationOf(input: ConversationInput): Message[] {
  if (input.messages) {
    return input.messages.map((m) => {
      const msg: Message = { role: m.role, content: m.content ?? null };
      if (m.name !== undefined) msg.name = m.name;
      if (m.tool_calls?.length)
        msg.tool_calls = m.tool_calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.function.name, arguments: c.function.arguments ?? '' } }));
      if (m.tool_call_id !== undefined) msg.tool_call_id = m.tool_call_id;
      return msg;
    });
  }
  return parseTranscript(input.transcript ?? '');
}

/**
 * o200k_base tokens of a text, exact: group A's counter (tiktoken-count.ts), which gives js-tiktoken's
 * counts without its failure modes on caller text (special-token spellings such as <|endoftext|>
 * throw there; long letter runs take quadratic time).
 */
export function tokensOf(text: string): number {
  if (!text) return 0;
  if (text.length < 4096) return countTokensA(text);
  // Long texts are counted again and again while they are cut to size: remember the last few.
  const hit = bigCounts.get(text);
  if (hit !== undefined) return hit;
  const n = countTokensA(text);
  if (bigCounts.size >= 8) bigCounts.delete(bigCounts.keys().next().value!);
  bigCounts.set(text, n);
  return n;
}

const bigCounts = new Map<string, number>();

/** Tokens of one message (o200k_base): framing + content + each tool call's name and arguments. */
export function messageTokens(m: Message): number {
  let n = MESSAGE_OVERHEAD_TOKENS + tokensOf(m.content ?? '');
  for (const c of m.tool_calls ?? []) n += tokensOf(c.function.name) + tokensOf(c.function.arguments);
  return n;
}

export function conversationTokens(messages: Message[]): number {
  let n = 0;
  for (const m of messages) n += messageTokens(m);
  return n;
}

/** Index of the last user message, or -1. */
export function lastUserIndex(messages: Message[]): number {
  for (let i = messages.length - 1; i >= 0; i--) if (messages[i]!.role === 'user') return i;
  return -1;
}

/** For each tool message, the index of the assistant message whose tool_call it answers (or -1). */
export function toolCallOwners(messages: Message[]): Map<number, number> {
  const owner = new Map<string, number>();
  const out = new Map<number, number>();
  messages.forEach((m, i) => {
    if (m.role === 'assistant') for (const c of m.tool_calls ?? []) owner.set(c.id, i);
    if (m.role === 'tool') out.set(i, m.tool_call_id !== undefined && owner.has(m.tool_call_id) ? owner.get(m.tool_call_id)! : -1);
  });
  return out;
}

/** The function name of the call a tool message answers (for reports), or null. */
export function toolNameOf(messages: Message[], i: number): string | null {
  const id = messages[i]?.tool_call_id;
  if (id === undefined) return null;
  for (let j = i - 1; j >= 0; j--) {
    const c = messages[j]!.tool_calls?.find((t) => t.id === id);
    if (c) return c.function.name;
  }
  return null;
}

export interface Span {
  start: number;
  end: number;
}

/**
 * Sentences of a text with their offsets (text.slice(start, end) is the sentence, trimmed): split at
 * . ! ? followed by space, and at line breaks; code fences count as one span each.
 */
export function sentences(text: string): Span[] {
  const out: Span[] = [];
  const push = (s: number, e: number) => {
    while (s < e && /\s/.test(text[s]!)) s++;
    while (e > s && /\s/.test(text[e - 1]!)) e--;
    if (e > s) out.push({ start: s, end: e });
  };
  let start = 0;
  let i = 0;
  const n = text.length;
  while (i < n) {
    if (text.startsWith('```', i) && (i === 0 || text[i - 1] === '\n')) {
      push(start, i);
      const close = text.indexOf('```', i + 3);
      const end = close < 0 ? n : Math.min(n, close + 3);
      push(i, end);
      i = end;
      start = i;
      continue;
    }
    const ch = text[i]!;
    if (ch === '\n') {
      push(start, i);
      start = i + 1;
    } else if ((ch === '.' || ch === '!' || ch === '?') && (i + 1 >= n || /\s/.test(text[i + 1]!))) {
      // Not after a single letter or common abbreviation (e.g., "e.g." or "Dr.").
      const before = text.slice(Math.max(start, i - 4), i);
      if (!(ch === '.' && /(^|\s)(e\.g|i\.e|etc|vs|dr|mr|mrs|ms|no|[A-Za-z])$/i.test(before))) {
        push(start, i + 1);
        start = i + 1;
      }
    }
    i++;
  }
  push(start, n);
  return out;
}

/** Lowercase words (letters, digits), for term matching. */
export function words(text: string): string[] {
  return text.toLowerCase().match(/[\p{L}\p{N}][\p{L}\p{N}'_-]*/gu) ?? [];
}

export const STOPWORDS = new Set(
  'a an the and or but if then else of to in on at by for with from as is are was were be been being it its this that these those there here i you he she we they me him her us them my your our their not no do does did done have has had having will would can could should may might must shall so than too very just also into over under about after before between through during without within up down out off again further once all any both each few more most other some such only own same what which who whom whose when where why how'.split(
    ' ',
  ),
);

/** Content words with a crude suffix stem (plural s, -ed, -ing), for recall and BM25. */
export function terms(text: string): string[] {
  const out: string[] = [];
  for (const w of words(text)) {
    if (STOPWORDS.has(w) || /^\d/.test(w)) continue;
    out.push(stem(w));
  }
  return out;
}

export function stem(w: string): string {
  if (w.length > 5 && w.endsWith('ing')) return w.slice(0, -3);
  if (w.length > 4 && w.endsWith('ed')) return w.slice(0, -2);
  if (w.length > 4 && w.endsWith('ies')) return w.slice(0, -3) + 'y';
  if (w.length > 3 && w.endsWith('s') && !w.endsWith('ss')) return w.slice(0, -1);
  return w;
}

/** Throws when the call was cancelled or timed out. */
export function checkSignal(signal: AbortSignal): void {
  if (signal.aborted) throw new AppError('tool_failed', 'The call was cancelled');
}

/** Shortens text to at most `maxTokens` tokens, cutting at a character boundary, with a marker. */
export function truncateTokens(text: string, maxTokens: number, marker = ' […]'): string {
  if (tokensOf(text) <= maxTokens) return text;
  const budget = Math.max(0, maxTokens - tokensOf(marker));
  let hi = Math.min(text.length, budget * 12 + 16);
  let lo = 0;
  // Largest prefix (in characters) that fits: binary search on the token count.
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (tokensOf(text.slice(0, mid)) <= budget) lo = mid;
    else hi = mid - 1;
  }
  let cut = lo;
  // Don't split a surrogate pair.
  if (cut > 0 && /[\uD800-\uDBFF]/.test(text[cut - 1]!)) cut--;
  const out = text.slice(0, cut).replace(/\s+$/, '') + marker;
  return tokensOf(out) <= maxTokens ? out : '';
}
