import { z } from 'zod';
import { franc } from 'franc-min';
import Sentiment from 'sentiment';
import { defineTool } from '../types.js';
import { bigConversation } from './context-health.js';
import { checkSignal, conversationFields, conversationOf, refineConversation, type Message } from './conversation.js';

/**
 * conversation_diagnostic: failure patterns in a conversation, each with the message indices it rests
 * on. Checks (in this order; heuristics, documented in the README):
 * - retry_storm: the same tool call (function + arguments, JSON compared by value) 3+ times in one user turn;
 * - loop: an assistant reply (20+ chars) repeating one of the 5 assistant replies before it (same
 *   normalised text, or word-trigram Jaccard ≥ 0.8);
 * - tool_error: tool outputs that read as errors (error/exception/traceback, "error": keys, 4xx/5xx status);
 * - unanswered_question: a user question followed by another user message with no assistant text between;
 * - format_drift: the system prompt asks for JSON and replies are not JSON, or replies leave the format
 *   (json / markdown / plain) that the first three set;
 * - refusal: assistant replies that decline ("I can't help with", "I'm unable to", "As an AI"...);
 * - language_switch: user/assistant messages (80+ chars) in another language than the first (franc-min);
 * - souring_sentiment: user messages' AFINN sentiment falls (second half mean ≤ -1 and 2+ below the first half).
 * score = 100 − 25 per high, 10 per medium, 5 per low finding (not below 0).
 */

const CHECKS = ['retry_storm', 'loop', 'tool_error', 'unanswered_question', 'format_drift', 'refusal', 'language_switch', 'souring_sentiment'] as const;
const SEVERITIES = ['low', 'medium', 'high'] as const;
type Check = (typeof CHECKS)[number];
type Severity = (typeof SEVERITIES)[number];
const WEIGHT: Record<Severity, number> = { low: 5, medium: 10, high: 25 };

const Input = z.object({ ...conversationFields }).superRefine(refineConversation);

const Finding = z.object({
  check: z.enum(CHECKS),
  severity: z.enum(SEVERITIES),
  message_indices: z.array(z.number().int()),
  evidence: z.string(),
});
const Output = z.object({ findings: z.array(Finding), score: z.number().int().min(0).max(100), messages: z.number().int(), checks: z.array(z.enum(CHECKS)) });
type FindingT = z.infer<typeof Finding>;

export const conversationDiagnostic = defineTool({
  name: 'conversation_diagnostic',
  description:
    'Failure patterns in a conversation: retry storms, loops, tool errors, unanswered questions, format drift, refusals, language switches, souring sentiment.',
  tier: 'enterprise',
  priceCents: 0,
  family: 'text',
  input: Input,
  qField: 'transcript',
  qParse: 'text',
  output: '{findings[{check,severity low|medium|high,message_indices,evidence}], score 0-100, messages, checks}',
  outputSchema: Output,
  examples: [
    {
      messages: [
        { role: 'user', content: 'Deploy the app to staging.' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'a', type: 'function', function: { name: 'deploy', arguments: '{"env":"staging"}' } }] },
        { role: 'tool', tool_call_id: 'a', content: 'Error: 503 Service Unavailable' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'b', type: 'function', function: { name: 'deploy', arguments: '{"env": "staging"}' } }] },
        { role: 'tool', tool_call_id: 'b', content: 'Error: 503 Service Unavailable' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'deploy', arguments: '{"env":"staging"}' } }] },
        { role: 'tool', tool_call_id: 'c', content: 'Error: 503 Service Unavailable' },
        { role: 'assistant', content: 'The deploy keeps failing with 503.' },
      ],
    },
    { transcript: 'user: Why is the build red?\nuser: Hello?? This is useless, terrible support.\nassistant: I cannot help with that request.' },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 20_000, memoryMb: 384 },
  largestInput: () => ({ messages: bigConversation() }),
  handler: async (input, ctx) => diagnose(conversationOf(input), ctx.signal),
});

export function diagnose(messages: Message[], signal: AbortSignal) {
  const findings: FindingT[] = [];
  const add = (check: Check, severity: Severity, message_indices: number[], evidence: string) =>
    findings.push({ check, severity, message_indices: [...new Set(message_indices)].sort((a, b) => a - b), evidence: evidence.slice(0, 300) });

  // retry_storm
  let turn = 0;
  const groups = new Map<string, { name: string; args: string; indices: number[] }>();
  messages.forEach((m, i) => {
    if (m.role === 'user') turn++;
    for (const c of m.tool_calls ?? []) {
      const args = canonicalArgs(c.function.arguments);
      const key = `${turn}\u0000${c.function.name}\u0000${args}`;
      const g = groups.get(key) ?? { name: c.function.name, args, indices: [] };
      g.indices.push(i);
      groups.set(key, g);
    }
  });
  for (const g of groups.values()) {
    if (g.indices.length >= 3)
      add(
        'retry_storm',
        g.indices.length >= 5 ? 'high' : 'medium',
        g.indices,
        `${g.name}(${g.args.slice(0, 120)}) called ${g.indices.length} times in one turn`,
      );
  }
  checkSignal(signal);

  // loop
  const replies: Array<{ i: number; norm: string; shingles: Set<string> }> = [];
  const loopOf = new Map<number, number[]>();
  messages.forEach((m, i) => {
    if (m.role !== 'assistant' || !m.content || m.content.trim().length < 20) return;
    const norm = m.content.toLowerCase().replace(/\s+/g, ' ').trim();
    const shingles = trigrams(norm.slice(0, 20_000));
    for (const prev of replies.slice(-5)) {
      if (prev.norm === norm || jaccard(prev.shingles, shingles) >= 0.8) {
        const root = [...loopOf.entries()].find(([, v]) => v.includes(prev.i))?.[0] ?? prev.i;
        loopOf.set(root, [...(loopOf.get(root) ?? [root]), i]);
        break;
      }
    }
    replies.push({ i, norm, shingles });
  });
  for (const [root, idx] of loopOf)
    add('loop', idx.length >= 3 ? 'high' : 'medium', idx, `assistant repeats message ${root}: "${messages[root]!.content!.slice(0, 80)}"`);
  checkSignal(signal);

  // tool_error
  const toolMsgs = messages.map((m, i) => [m, i] as const).filter(([m]) => m.role === 'tool');
  const errors = toolMsgs.filter(([m]) => isToolError(m.content ?? '')).map(([, i]) => i);
  if (errors.length) {
    const ratio = errors.length / toolMsgs.length;
    add(
      'tool_error',
      ratio >= 0.5 && errors.length >= 2 ? 'high' : 'medium',
      errors,
      `${errors.length} of ${toolMsgs.length} tool outputs are errors, first: "${(messages[errors[0]!]!.content ?? '').trim().slice(0, 80)}"`,
    );
  }

  // unanswered_question
  const unanswered: number[] = [];
  messages.forEach((m, i) => {
    if (m.role !== 'user' || !(m.content ?? '').includes('?')) return;
    for (let j = i + 1; j < messages.length; j++) {
      const n = messages[j]!;
      if (n.role === 'assistant' && (n.content ?? '').trim()) return;
      if (n.role === 'user') {
        unanswered.push(i);
        return;
      }
    }
  });
  if (unanswered.length)
    add('unanswered_question', 'medium', unanswered, `${unanswered.length} user question(s) got no assistant reply before the next user message`);

  // format_drift
  const texts = messages.map((m, i) => [m, i] as const).filter(([m]) => m.role === 'assistant' && (m.content ?? '').trim());
  const wantsJson = messages.some((m) => m.role === 'system' && /\bjson\b/i.test(m.content ?? ''));
  if (wantsJson) {
    const bad = texts.filter(([m]) => formatOf(m.content!) !== 'json').map(([, i]) => i);
    if (bad.length)
      add('format_drift', bad.length >= 2 ? 'medium' : 'low', bad, `the system prompt asks for JSON; ${bad.length} of ${texts.length} replies are not JSON`);
  } else if (texts.length >= 4) {
    const first = texts.slice(0, 3).map(([m]) => formatOf(m.content!));
    const base = first.filter((f) => f === first[0]).length >= 2 ? first[0] : first[1] === first[2] ? first[1] : null;
    if (base) {
      const off = texts
        .slice(3)
        .filter(([m]) => formatOf(m.content!) !== base)
        .map(([, i]) => i);
      if (off.length >= 2) add('format_drift', 'low', off, `replies began as ${base}; ${off.length} later replies are not`);
    }
  }

  // refusal
  const refusals = texts.filter(([m]) => REFUSAL.test(m.content!.slice(0, 400))).map(([, i]) => i);
  if (refusals.length) add('refusal', refusals.length >= 2 ? 'high' : 'medium', refusals, `refusal: "${messages[refusals[0]!]!.content!.trim().slice(0, 80)}"`);
  checkSignal(signal);

  // language_switch
  let base: string | null = null;
  const switched: number[] = [];
  const langs = new Set<string>();
  messages.forEach((m, i) => {
    if ((m.role !== 'user' && m.role !== 'assistant') || (m.content ?? '').trim().length < 80) return;
    const lang = franc(m.content!.slice(0, 1000));
    if (lang === 'und') return;
    if (base === null) base = lang;
    else if (lang !== base) {
      switched.push(i);
      langs.add(lang);
    }
  });
  if (switched.length) add('language_switch', 'low', switched, `conversation starts in ${base}; ${switched.length} message(s) in ${[...langs].join(', ')}`);
  checkSignal(signal);

  // souring_sentiment
  const analyser = new Sentiment();
  const users = messages.map((m, i) => [m, i] as const).filter(([m]) => m.role === 'user' && (m.content ?? '').trim());
  if (users.length >= 4) {
    const scores = users.map(([m]) => Math.max(-10, Math.min(10, analyser.analyze(m.content!.slice(0, 5000)).score)));
    const half = Math.floor(scores.length / 2);
    const mean = (a: number[]) => a.reduce((x, y) => x + y, 0) / a.length;
    const early = mean(scores.slice(0, half));
    const late = mean(scores.slice(half));
    if (late <= -1 && late - early <= -2) {
      const idx = users
        .slice(half)
        .filter((_, k) => scores[half + k]! < 0)
        .map(([, i]) => i);
      add('souring_sentiment', late <= -3 ? 'high' : 'medium', idx, `user sentiment fell from ${round(early)} to ${round(late)} (AFINN, mean per message)`);
    }
  }

  const score = Math.max(0, 100 - findings.reduce((a, f) => a + WEIGHT[f.severity], 0));
  return { findings, score, messages: messages.length, checks: [...CHECKS] };
}

const REFUSAL =
  /\b(I can(?:not|'t|’t) (?:help|assist|do|provide|comply|fulfil|fulfill|support)|I(?:'m|’m| am) (?:unable|not able) to|I won(?:'t|’t) (?:help|do|provide)|I will not (?:help|do|provide)|as an AI\b|I(?:'m|’m) sorry, but I can)/i;

function isToolError(text: string): boolean {
  const head = text.slice(0, 500);
  return (
    /^\s*(?:error|exception|traceback|fatal|failed|failure)\b/i.test(head) ||
    /"(?:error|err|exception)"\s*:\s*(?!null|false|""|\[\]|\{\})/i.test(head) ||
    /\b(?:status(?:[ _]?code)?|http)\W{0,3}[45]\d\d\b/i.test(head) ||
    /\b(?:Traceback \(most recent call last\)|ENOENT|ECONNREFUSED|ETIMEDOUT|timed out|permission denied|\w+Error:)/.test(head)
  );
}

function canonicalArgs(args: string): string {
  try {
    return stable(JSON.parse(args));
  } catch {
    return args.trim();
  }
}

function stable(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(stable).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${stable((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

function trigrams(text: string): Set<string> {
  const w = text.split(' ');
  const out = new Set<string>();
  for (let i = 0; i + 2 < w.length; i++) out.add(`${w[i]} ${w[i + 1]} ${w[i + 2]}`);
  if (!out.size) out.add(text);
  return out;
}

function jaccard(a: Set<string>, b: Set<string>): number {
  let inter = 0;
  const [small, big] = a.size < b.size ? [a, b] : [b, a];
  for (const x of small) if (big.has(x)) inter++;
  return inter / (a.size + b.size - inter);
}

function formatOf(text: string): 'json' | 'markdown' | 'plain' {
  const t = text
    .trim()
    .replace(/^```(?:json)?\s*\n?/i, '')
    .replace(/\n?```\s*$/, '');
  if (/^[[{]/.test(t)) {
    try {
      JSON.parse(t);
      return 'json';
    } catch {
      /* not JSON */
    }
  }
  if (/^(#{1,6} |[-*+] |\d+\. |```|\|.*\|)/m.test(text)) return 'markdown';
  return 'plain';
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}
