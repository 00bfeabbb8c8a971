import { z } from 'zod';
import { defineTool } from '../types.js';
import { bigConversation } from './context-health.js';
import { checkSignal, conversationFields, conversationOf, refineConversation, ROLES, sentences, type Message } from './conversation.js';

/**
 * context_extract: decisions, todos, open questions, constraints and artifacts quoted from a
 * conversation. Each item is one sentence (or code block) of one message's content, found by the
 * cue-phrase table below; `messages[message_index].content.slice(start, end) === text` always (for a
 * transcript, offsets are into the parsed message's content, i.e. the text after "role: "). System,
 * user and assistant messages are read; tool outputs are not. One kind per sentence, first match in
 * this order: open_question, decision, todo, constraint, artifact.
 */

export const KINDS = ['open_question', 'decision', 'todo', 'constraint', 'artifact'] as const;
export type Kind = (typeof KINDS)[number];

/** The cue-phrase table (README documents it). */
export const CUES: Record<Kind, RegExp> = {
  open_question: /\?\s*$|\b(?:open question|unclear|not sure|TBD|to be decided|unresolved|unknown whether)\b/i,
  decision:
    /\b(?:we (?:decided|agreed|chose|picked|settled on|went with)|(?:I|we) (?:will|'ll|’ll) go with|decided (?:to|on|that)|decision:|let(?:'s|’s| us) go with|going with|(?:we|I) (?:will|'ll|’ll) use|agreed (?:to|on|that)|the plan is|approved)\b/i,
  todo: /^\s*(?:[-*]\s*(?:\[ \]\s*)?)?(?:todo|to-do|action items?|next steps?)\b|\b(?:TODO|FIXME|need to|needs to|have to|remember to|don't forget to|follow[ -]up|still need|next,? (?:I|we) (?:will|'ll|should))\b/i,
  constraint:
    /\b(?:must(?: not)?|mustn't|never|always|no more than|no later than|at most|at least|is required|are required|requirement|deadline|limited to|only (?:use|allow)|not allowed|forbidden|budget of)\b/i,
  artifact:
    /^```|\bhttps?:\/\/\S+|(?:^|[\s(`'"])[\w.-]*\/?[\w-]+\.(?:ts|tsx|js|mjs|py|md|json|ya?ml|sql|go|rs|java|html|css|csv|txt|sh|toml|ipynb|pdf|png)\b|\b(?:PR|pull request|issue) #\d+|\bcommit [0-9a-f]{7,40}\b|\b(?:created|wrote|saved|generated|committed|uploaded|published) (?:the |a |an )?[\w./-]+/i,
};

const Input = z
  .object({
    ...conversationFields,
    kinds: z
      .array(z.enum(KINDS))
      .min(1)
      .max(KINDS.length)
      .optional()
      .describe('Only these kinds (default all: open_question, decision, todo, constraint, artifact)'),
    max_items: z.number().int().min(1).max(5000).default(500).describe('At most this many items, first in the conversation first (default 500)'),
  })
  .superRefine(refineConversation);

const Item = z.object({
  kind: z.enum(KINDS),
  text: z.string(),
  message_index: z.number().int(),
  role: z.enum(ROLES),
  start: z.number().int(),
  end: z.number().int(),
  cue: z.string(),
});
const Output = z.object({
  items: z.array(Item),
  counts: z.object({
    open_question: z.number().int(),
    decision: z.number().int(),
    todo: z.number().int(),
    constraint: z.number().int(),
    artifact: z.number().int(),
  }),
  truncated: z.boolean(),
});
export type ExtractItem = z.infer<typeof Item>;

export const contextExtract = defineTool({
  name: 'context_extract',
  description: 'Decisions, todos, open questions, constraints and artifacts quoted from a conversation, with message index and offsets.',
  tier: 'pro',
  priceCents: 0,
  family: 'text',
  input: Input,
  qField: 'transcript',
  qParse: 'text',
  output: '{items[{kind open_question|decision|todo|constraint|artifact,text,message_index,role,start,end,cue}], counts, truncated}',
  outputSchema: Output,
  examples: [
    {
      transcript:
        'system: Answers must be under 200 words.\nuser: Should we use Postgres or MySQL for the ledger?\nassistant: We decided to use Postgres 16 because of its row-level locking. I wrote the schema to db/ledger.sql.\nuser: OK. TODO: add a migration for the refunds table. Is the deadline still Friday?',
    },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 10_000, memoryMb: 384 },
  largestInput: () => ({ messages: bigConversation(), max_items: 5000 }),
  handler: async (input, ctx) => extractItems(conversationOf(input), input.kinds ?? [...KINDS], input.max_items, ctx.signal),
});

export function extractItems(messages: Message[], kinds: readonly Kind[], maxItems: number, signal: AbortSignal) {
  const wanted = new Set(kinds);
  const items: ExtractItem[] = [];
  const counts = { open_question: 0, decision: 0, todo: 0, constraint: 0, artifact: 0 };
  let truncated = false;
  outer: for (let i = 0; i < messages.length; i++) {
    if (i % 50 === 0) checkSignal(signal);
    const m = messages[i]!;
    if (m.role === 'tool' || !m.content) continue;
    for (const s of sentences(m.content)) {
      const text = m.content.slice(s.start, s.end);
      const probe = text.length > 2000 ? text.slice(0, 2000) : text;
      for (const kind of KINDS) {
        const match = CUES[kind].exec(probe);
        if (!match) continue;
        if (wanted.has(kind)) {
          if (items.length >= maxItems) {
            truncated = true;
            break outer;
          }
          items.push({ kind, text, message_index: i, role: m.role, start: s.start, end: s.end, cue: match[0].trim().slice(0, 60) || '?' });
          counts[kind]++;
        }
        break;
      }
    }
  }
  return { items, counts, truncated };
}
