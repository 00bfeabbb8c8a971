import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { conversationDiagnostic } from '../../../src/tools/text/conversation-diagnostic.js';
import type { Message } from '../../../src/tools/text/conversation.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { conversationArb } from './conversations-b.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = (input: unknown) => conversationDiagnostic.handler(conversationDiagnostic.input.parse(input), ctx);

describe('conversation_diagnostic', () => {
  it('three identical tool calls give retry_storm with those indices (property: any position, any filler)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.constantFrom('thinking', 'still working on it', 'one moment'), { minLength: 3, maxLength: 3 }),
        fc.constantFrom('deploy', 'search'),
        async (fillers, name) => {
          const messages: Message[] = [{ role: 'user', content: 'Do it.' }];
          const indices: number[] = [];
          fillers.forEach((f, k) => {
            indices.push(messages.length);
            messages.push({
              role: 'assistant',
              content: null,
              tool_calls: [{ id: `t${k}`, type: 'function', function: { name, arguments: '{"a":1,"b":2}' } }],
            });
            messages.push({ role: 'tool', tool_call_id: `t${k}`, content: 'ok' });
            messages.push({ role: 'assistant', content: `${f} ${k}` });
          });
          const r = await run({ messages });
          const storm = r.findings.filter((f) => f.check === 'retry_storm');
          expect(storm).toHaveLength(1);
          expect(storm[0]!.message_indices).toEqual(indices);
        },
      ),
      { numRuns: 20 },
    );
  });

  it('example 1: retry storm (JSON arguments compared by value) and tool errors', async () => {
    const r = await run(conversationDiagnostic.examples[0]);
    expect(r.findings.find((f) => f.check === 'retry_storm')!.message_indices).toEqual([1, 3, 5]);
    expect(r.findings.find((f) => f.check === 'tool_error')!.message_indices).toEqual([2, 4, 6]);
    expect(r.score).toBeLessThan(100);
  });

  it('example 2: unanswered question and refusal', async () => {
    const r = await run(conversationDiagnostic.examples[1]);
    const checks = r.findings.map((f) => f.check);
    expect(checks).toContain('unanswered_question');
    expect(checks).toContain('refusal');
  });

  it('loops, language switch, souring sentiment, JSON format drift', async () => {
    const loop = await run({
      transcript:
        'user: fix it\nassistant: Let me check the configuration file again.\nuser: and?\nassistant: Let me check the configuration file again.\nuser: ??\nassistant: Let me check the configuration file again.',
    });
    expect(loop.findings.find((f) => f.check === 'loop')!.message_indices).toEqual([1, 3, 5]);
    const en = 'Could you please explain how the deployment pipeline works for the staging environment today?';
    const fr = 'Pouvez-vous expliquer comment fonctionne le pipeline de déploiement pour cet environnement aujourd’hui ?';
    const lang = await run({ transcript: `user: ${en}\nassistant: ok\nuser: ${fr}` });
    expect(lang.findings.find((f) => f.check === 'language_switch')!.message_indices).toEqual([2]);
    const sour = await run({
      transcript: 'user: great, thanks, love it\nuser: good job\nuser: this is terrible and broken\nuser: awful, I hate this, useless',
    });
    expect(sour.findings.find((f) => f.check === 'souring_sentiment')!.message_indices).toEqual([2, 3]);
    const json = await run({ transcript: 'system: Reply in JSON only.\nuser: a\nassistant: {"ok":true}\nuser: b\nassistant: Sure! Here it is.' });
    expect(json.findings.find((f) => f.check === 'format_drift')!.message_indices).toEqual([4]);
  });

  it('a clean conversation scores 100; results are deterministic and match the output schema (property)', async () => {
    const clean = await run({ transcript: 'user: What is 2+2?\nassistant: 4.' });
    expect(clean).toMatchObject({ findings: [], score: 100 });
    await fc.assert(
      fc.asyncProperty(conversationArb, async (messages) => {
        const r = await run({ messages });
        expect(conversationDiagnostic.outputSchema!.safeParse(r).success).toBe(true);
        for (const f of r.findings) for (const i of f.message_indices) expect(i).toBeLessThan(messages.length);
        expect(JSON.stringify(await run({ messages }))).toBe(JSON.stringify(r));
      }),
      { numRuns: 40 },
    );
  });

  it('refuses input past the caps; largestInput finishes within its limits', async () => {
    expect(conversationDiagnostic.input.safeParse({ transcript: 'x'.repeat(400_001) }).success).toBe(false);
    const t = cpuNow();
    await run(conversationDiagnostic.largestInput!());
    expect(cpuNow() - t).toBeLessThan(conversationDiagnostic.limits!.timeMs ?? 5000);
  });
});
