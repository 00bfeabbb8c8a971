/**
 * The official `openai` package against Tollgate's chat-completions surface: list the svc-* models
 * this key may use, then one chat completion. The svc-* models need the service to have a language-model
 * upstream (LLM_BASE_URL); without one they answer 503 tool_unavailable, uncharged.
 *   TOLLGATE_URL=http://localhost:8080 TOLLGATE_KEY=cv_... npx tsx examples/openai.ts
 */
import OpenAI, { APIError } from 'openai';

const baseUrl = process.env.TOLLGATE_URL;
const apiKey = process.env.TOLLGATE_KEY;
if (!baseUrl || !apiKey) {
  console.error('Set TOLLGATE_URL (e.g. http://localhost:8080) and TOLLGATE_KEY (an API key, cv_...).');
  process.exit(2);
}

// maxRetries: 0, so the client never retries into a second charge.
const openai = new OpenAI({ apiKey, baseURL: `${baseUrl.replace(/\/+$/, '')}/v1`, maxRetries: 0 });

async function main(): Promise<void> {
  const models = (await openai.models.list()).data.map((m) => m.id);
  console.log(`models: ${models.join(', ') || '(none for this plan)'}`);
  const model = models.find((m) => m === 'svc-hints') ?? models.find((m) => m.startsWith('svc-'));
  if (!model) throw new Error('no svc-* model is open to this key (the free plan has none)');

  const completion = await openai.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'How do I reverse a linked list in place?' }],
  });
  const answer = completion.choices[0]?.message.content ?? '';
  // Tollgate adds a `tollgate` member: the job, its cost and the balance after it.
  const billing = (completion as unknown as { tollgate?: { job_id: string; cost_cents: number; remaining_credits: number } }).tollgate;
  console.log(`${model}: ${answer}`);
  console.log(`usage: ${completion.usage?.total_tokens ?? '?'} tokens; cost ${billing?.cost_cents} cents, ${billing?.remaining_credits} credits left`);
}

main().catch((err: unknown) => {
  if (err instanceof APIError) console.error(`FAILED: ${err.status ?? 'no answer'} ${err.code ?? ''}: ${err.message}`);
  else console.error('FAILED:', err instanceof Error ? err.message : err);
  process.exit(1);
});
