import { createHash } from 'node:crypto';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { runTask } from '../tasks.js';
import { defineTool } from '../types.js';
import { ClaimResult, MAX_SOURCES, normaliseSources, SourceSchema, type Source } from './cvi-core.js';

/**
 * cvi_loop: verification rounds over a draft's revisions. The first call (no loop_id) starts a loop
 * (its id is a hash of draft, sources and max_rounds, so the same start gives the same id and starts
 * over); each later call with the loop_id checks the revised draft against the loop's sources. State
 * (round, failing claims, sources) sits in ctx.store for 24 h from the last round, per account: another
 * account's loop_id is 404 not_found.
 * Not isolated: the store lives on the event loop; the round itself (cvi_verify's checks) runs in the
 * sandbox pool as the `cvi_round` task. Rounds of one loop run one at a time (a lock per loop in the
 * store): two sent at once become consecutive rounds, each checked against the state the other left;
 * rounds of different loops never wait for each other. Status: pass (every claim supported), stalled
 * (the same claims fail as last round), exhausted (max_rounds reached with claims failing), else revise.
 */

const TTL_SECONDS = 24 * 3600;
const MAX_DRAFT_CHARS = 100_000;
const MAX_SOURCE_CHARS = 300_000;
/** Sources are kept with the loop when their JSON is this small (the store holds 256 KiB per key). */
const STORED_SOURCES_BYTES = 200_000;
/**
 * A loop's lock: held by its round (whose pool work stops at the tool's 15 s limit) and freed when the
 * round ends, or after LOCK_HOLD_MS if its worker died. A round waits at most LOCK_WAIT_MS for it.
 */
const LOCK_HOLD_MS = 30_000;
const LOCK_WAIT_MS = 20_000;

const Input = z
  .object({
    draft: z.string().min(1).max(MAX_DRAFT_CHARS).describe('The draft (or its revision); each sentence is a claim (at most 50)'),
    sources: z
      .array(SourceSchema)
      .min(1)
      .max(MAX_SOURCES)
      .optional()
      .describe("Sources (strings or {id, text}): required to start; later rounds reuse the loop's own unless given"),
    loop_id: z
      .string()
      .regex(/^cvi_[0-9a-f]{20}$/)
      .optional()
      .describe("The loop to continue (from the first round's answer); omit to start a loop"),
    max_rounds: z.number().int().min(1).max(10).default(5).describe('Rounds before the loop is exhausted (1-10, default 5; set when the loop starts)'),
  })
  .superRefine((v, ctx) => {
    if (!v.loop_id && !v.sources) ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['sources'], message: 'sources are required to start a loop' });
    const chars = (v.sources ?? []).reduce((a, s) => a + (typeof s === 'string' ? s.length : s.text.length), 0);
    if (chars > MAX_SOURCE_CHARS)
      ctx.addIssue({ code: z.ZodIssueCode.custom, path: ['sources'], message: `sources hold ${chars} characters; at most ${MAX_SOURCE_CHARS} are allowed` });
  });

const STATUSES = ['pass', 'revise', 'stalled', 'exhausted'] as const;
const Output = z.object({
  loop_id: z.string(),
  round: z.number().int().min(1),
  max_rounds: z.number().int(),
  status: z.enum(STATUSES),
  failing: z.array(ClaimResult),
  fixed_since_last: z.array(z.string()),
  claims: z.number().int(),
  supported: z.number().int(),
});

interface LoopState {
  round: number;
  max_rounds: number;
  failing_keys: string[];
  /** The failing claims' text, parallel to failing_keys (fixed_since_last quotes them). */
  failing_claims: string[];
  status: (typeof STATUSES)[number];
  sources: Source[] | null;
  sources_hash: string;
}

export const cviLoop = defineTool({
  name: 'cvi_loop',
  // Not idempotent though it changes nothing outside: each call keeps a round in the account's store.
  idempotent: false,
  description:
    "Claim–Verify–Iterate rounds over a draft's revisions: each round checks every claim against the sources and says pass, revise, stalled or exhausted (state kept 24 h).",
  tier: 'pro',
  priceCents: 0,
  family: 'text',
  input: Input,
  qField: 'draft',
  qParse: 'text',
  output:
    '{loop_id, round, max_rounds, status pass|revise|stalled|exhausted, failing[cvi_verify results], fixed_since_last[claims failing last round that no longer fail], claims, supported}',
  outputSchema: Output,
  examples: [
    {
      draft: 'Acme had 340 employees in 2023. Revenue rose 15% in 2023.',
      sources: [{ id: 'annual-report', text: 'In 2023 Acme had 340 employees. Revenue rose 12% to $4.2 million in 2023.' }],
      max_rounds: 3,
    },
  ],
  limits: { timeMs: 15_000, memoryMb: 512 },
  largestInput: () => {
    const para = 'In 2023 the company reported revenue of 4,200,000 dollars, 340 employees and offices in 12 European countries. ';
    const sources = Array.from({ length: MAX_SOURCES }, (_, i) => ({
      id: `s${i}`,
      text: para.repeat(Math.floor(MAX_SOURCE_CHARS / MAX_SOURCES / para.length)),
    }));
    const draft = Array.from(
      { length: 50 },
      (_, i) => `The company reported revenue of ${i},200,000 dollars and ${300 + i} employees in ${i} European countries in 2023.`,
    ).join(' ');
    return { draft, sources, max_rounds: 10 };
  },
  handler: async (input, ctx) => {
    const store = ctx.store;
    if (!store) throw new AppError('tool_unavailable', 'cvi_loop keeps its rounds per account; this call has no account store');
    const loopId = input.loop_id ?? startId(input.draft, normaliseSources(input.sources!), input.max_rounds);
    // One round of a loop at a time: a second one waits for the first to keep its state, then runs on it.
    const ran = await store.exclusive(`loop:${loopId}`, { holdMs: LOCK_HOLD_MS, waitMs: LOCK_WAIT_MS, signal: ctx.signal }, async () => {
      let state: LoopState | null = null;
      let sources: Source[];
      if (input.loop_id) {
        state = await store.get<LoopState>(`loop:${loopId}`);
        if (!state) throw new AppError('not_found', `No loop ${loopId} for this account (loops last 24 h after their last round)`);
        if (state.status === 'pass' || state.status === 'exhausted') {
          throw new AppError('invalid_input', `Loop ${loopId} is finished (${state.status} at round ${state.round}); start a new loop`, {
            issues: [{ path: ['loop_id'], message: state.status }],
          });
        }
        if (input.sources) sources = normaliseSources(input.sources);
        else if (state.sources) sources = state.sources;
        else
          throw new AppError('invalid_input', "This loop's sources were too large to keep: send sources with each round", {
            issues: [{ path: ['sources'], message: 'required' }],
          });
      } else {
        sources = normaliseSources(input.sources!);
      }
      const round = (state?.round ?? 0) + 1;
      const maxRounds = state?.max_rounds ?? input.max_rounds;
      await ctx.progress({ stage: 'verifying', done: 0, total: 1 });
      const out = await runTask(ctx, 'cvi_round', { draft: input.draft, sources, previous_failing: state?.failing_keys ?? [] });
      const same = state !== null && out.failing_keys.length > 0 && sameSet(out.failing_keys, state.failing_keys);
      const status: LoopState['status'] = !out.failing.length ? 'pass' : same ? 'stalled' : round >= maxRounds ? 'exhausted' : 'revise';
      const sourcesHash = createHash('sha256').update(JSON.stringify(sources)).digest('hex');
      const keep = Buffer.byteLength(JSON.stringify(sources)) <= STORED_SOURCES_BYTES;
      await store.set(
        `loop:${loopId}`,
        {
          round,
          max_rounds: maxRounds,
          failing_keys: out.failing_keys,
          failing_claims: out.failing.map((r) => r.claim),
          status,
          sources: keep ? sources : null,
          sources_hash: sourcesHash,
        } satisfies LoopState,
        TTL_SECONDS,
      );
      await ctx.progress({ stage: 'verifying', done: 1, total: 1 });
      return {
        loop_id: loopId,
        round,
        max_rounds: maxRounds,
        status,
        failing: out.failing,
        fixed_since_last: out.fixed_since_last.map((k) => state!.failing_claims[state!.failing_keys.indexOf(k)] ?? k),
        claims: out.results.length,
        supported: out.results.length - out.failing.length,
      };
    });
    if (!ran) {
      throw new AppError(
        'loop_busy',
        `Another round of loop ${loopId} has been running for over ${LOCK_WAIT_MS / 1000} s; this round did not run and was not charged. Send it again shortly.`,
        { loop_id: loopId, retry_after: 1 },
        { headers: { 'retry-after': '1' } },
      );
    }
    return ran.value;
  },
});

/** A loop's id: a hash of how it starts, so the same start gives the same id (and starts it over). */
function startId(draft: string, sources: Source[], maxRounds: number): string {
  return `cvi_${createHash('sha256')
    .update(JSON.stringify([draft, sources, maxRounds]))
    .digest('hex')
    .slice(0, 20)}`;
}

function sameSet(a: string[], b: string[]): boolean {
  const x = new Set(a);
  const y = new Set(b);
  return x.size === y.size && [...x].every((k) => y.has(k));
}
