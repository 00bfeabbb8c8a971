import fc from 'fast-check';
import type { Message } from '../../../src/tools/text/conversation.js';

/** Valid chat conversations: a system message, then turns of user / assistant (with answered tool calls). */
const text = fc.oneof(
  fc.lorem({ maxCount: 40 }),
  fc.constantFrom(
    'Retry the deploy.',
    'The build failed with error 42.',
    'We decided to use Postgres 16.',
    'TODO: write the migration',
    'Is the cache warm?',
    'OK.',
  ),
);

export const conversationArb: fc.Arbitrary<Message[]> = fc
  .array(
    fc.record({
      user: text,
      calls: fc.array(fc.record({ name: fc.constantFrom('search', 'logs', 'fetch'), args: fc.constantFrom('{}', '{"q":"x"}', '{"id":7}'), out: text }), {
        maxLength: 3,
      }),
      answer: text,
    }),
    { minLength: 1, maxLength: 12 },
  )
  .chain((turns) =>
    fc.constant(null).map(() => {
      const out: Message[] = [{ role: 'system', content: 'You are a careful assistant.' }];
      let id = 0;
      for (const t of turns) {
        out.push({ role: 'user', content: t.user });
        if (t.calls.length) {
          const calls = t.calls.map((c) => ({ id: `c${id++}`, type: 'function' as const, function: { name: c.name, arguments: c.args } }));
          out.push({ role: 'assistant', content: null, tool_calls: calls });
          calls.forEach((c, k) => out.push({ role: 'tool', tool_call_id: c.id, content: t.calls[k]!.out }));
        }
        out.push({ role: 'assistant', content: t.answer });
      }
      return out;
    }),
  );

/** No tool message without its call before it, and no call without its answer. */
export function isValidChat(messages: Message[]): boolean {
  const open = new Set<string>();
  const answered = new Set<string>();
  for (const m of messages) {
    for (const c of m.tool_calls ?? []) open.add(c.id);
    if (m.role === 'tool') {
      if (!m.tool_call_id || !open.has(m.tool_call_id)) return false;
      answered.add(m.tool_call_id);
    }
  }
  for (const id of open) if (!answered.has(id)) return false;
  return true;
}
