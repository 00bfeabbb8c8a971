import type { Logger } from 'pino';
import type { Config } from '../config.js';
import { AppError, isAppError, type SerializedError } from '../errors.js';
import { findTool, qInput } from '../tools/index.js';
import { accountStore } from '../queue/tool-store.js';
import { passportsFor } from '../access/passports.js';
import { createGuardedHttp } from '../tools/web/guarded-http.js';
import { createResolver } from '../tools/web/resolver.js';
import { createSearch } from '../tools/web/search-client.js';
import { createLlm } from '../tools/llm/structured.js';
import { dependencyUnavailable, isDependencyError, type Redis } from '../queue/redis.js';
import type { ToolContext, ToolProgress } from '../tools/types.js';
import type { SandboxPool } from '../sandbox/pool.js';
import type { AccountsRepo } from '../access/accounts.js';
import type { CreditReservations } from '../money/holds.js';
import type { Settler, Settlement } from '../money/settlement.js';
import { JOB_CANCELLED, cancelledError, type CallJobData, type CallResult, type StoredOutcome } from '../queue/call-job.js';
import type { ResultsStore } from '../money/results.js';
import { redactToken, type EdgeTokenSealer } from '../access/edge-token.js';
import { invalidInput } from '../errors.js';
import { storedAnswer } from '../queue/result-refs.js';
import { inputBinding, jobSeal, resultBinding, type Sealed } from '../queue/job-seal.js';

function answerTooLarge(tool: string, bytes: number, max: number): AppError {
  return new AppError(
    'limit_exceeded',
    `${tool}'s answer is ${bytes.toLocaleString('en')} bytes of JSON, over the ${max.toLocaleString('en')}-byte limit on a tool's answer (TOOL_MAX_RESULT_BYTES); narrow the request. Nothing was charged.`,
    { limit: 'size', limit_value: max, bytes },
    { retryable: false },
  );
}

/**
 * A sensitive tool's progress as it leaves the worker (BullMQ progress, the event log, SSE): its
 * figures, never its text (`delta`, `message`), which would be the caller's secret in clear.
 */
function figuresOnly(p: ToolProgress): ToolProgress {
  return {
    stage: p.stage,
    ...(p.done !== undefined ? { done: p.done } : {}),
    ...(p.total !== undefined ? { total: p.total } : {}),
    ...(p.unit !== undefined ? { unit: p.unit } : {}),
  };
}

/** The worker-side view of one job run, kept free of BullMQ types. */
export interface JobRun {
  id: string;
  attemptsMade: number;
  maxAttempts: number;
  /**
   * This run may follow one that got as far as settling: a retry after a failed attempt, or a
   * redelivery after a stall (dead worker, lost lock). Only such runs look for a stored outcome first.
   */
  redelivered?: boolean;
  /** When the job was queued (ms since the epoch), recorded with its outcome. */
  createdAt?: number;
  signal: AbortSignal;
  progress(p: ToolProgress): Promise<void>;
  /** Output of the previous chain step (a flow child), when the job is a later chain step. */
  previousOutput(): Promise<unknown>;
  /** Set by the runner when settlement gave the job's slot in flight back (the worker then need not). */
  slotReleased?: boolean;
  /**
   * Set by the runner on success: JSON bytes of the answer's result, and whether job_results holds
   * exactly this answer (the worker then returns a reference for a large one: src/queue/result-refs.ts).
   */
  resultBytes?: number;
  storedWhole?: boolean;
}

export class JobFailure extends Error {
  constructor(
    readonly error: AppError,
    /** True when the job must not be retried. */
    readonly final: boolean,
  ) {
    super(error.message);
  }
}

/** Turns a previous step's output into the next step's `q` string. */
export function outputAsQ(output: unknown): string {
  if (typeof output === 'string') return output;
  if (output && typeof output === 'object') {
    // Tools that produce text put it in one of these fields; pass the text, not the wrapper.
    for (const k of ['text', 'result', 'answer', 'content']) {
      const v = (output as Record<string, unknown>)[k];
      if (typeof v === 'string') return v;
    }
  }
  return JSON.stringify(output);
}

export class ToolRunner {
  constructor(
    private readonly deps: {
      config: Config;
      log: Logger;
      accounts: AccountsRepo;
      credits: CreditReservations;
      settler: Settler;
      /** Stored outcomes (job_results), read when a redelivered job may already have one. */
      results: ResultsStore;
      sealer: EdgeTokenSealer;
      /** Runs isolated tools and handlers' CPU tasks (src/sandbox/pool.ts). */
      sandbox: SandboxPool;
      /** Backs ctx.store (src/queue/tool-store.ts). */
      redis?: Redis;
    },
  ) {}

  async run(data: CallJobData, job: JobRun): Promise<CallResult> {
    let edgeToken: string | undefined;
    // Calls made with a key are settled with their answer (job_results); x402 calls are not stored.
    const stored = data.accountId !== null && data.payer === null;
    try {
      // Cancelled before it started (DELETE /jobs/{id}): the tool never runs.
      if (job.signal.aborted && job.signal.reason === JOB_CANCELLED) throw cancelledError();
      if (stored && job.redelivered) {
        // A run before this one may have settled: then that is the answer, and the tool does not run again.
        const prior = await this.deps.results.get(job.id);
        if (prior) return await this.answerWith(data, job, prior);
      }
      const tool = findTool(data.tool);
      if (!tool) throw new AppError('tool_not_found', `No tool named '${data.tool}'`);
      // A sensitive tool's input is sealed in the job (src/queue/job-seal.ts): opened here, in memory only.
      let raw = data.sealedInput
        ? (jobSeal(this.deps.config).open(data.sealedInput, inputBinding(data.tool, data.accountId)) as Record<string, unknown>)
        : data.input;
      if (data.qFromPrevious) raw = { ...raw, ...qInput(tool, outputAsQ(await job.previousOutput())) };
      const parsed = tool.input.safeParse(raw);
      if (!parsed.success) throw invalidInput(parsed.error, `Input for ${tool.name} is invalid`);
      edgeToken = data.edgeToken ? this.deps.sealer.open(data.edgeToken) : undefined;
      const usage: Record<string, number> = {};
      const accountId = data.accountId;
      const recordUsage = (u: Record<string, number>) => {
        for (const [k, v] of Object.entries(u)) usage[k] = (usage[k] ?? 0) + v;
      };
      const log = this.deps.log.child({ job: job.id, tool: tool.name });
      const { sandbox } = this.deps;
      const progress = tool.sensitive ? (p: ToolProgress) => job.progress(figuresOnly(p)) : (p: ToolProgress) => job.progress(p);
      // The pool's fairness counts per payer: the account, or the x402 payer address.
      const sandboxCall = {
        owner: accountId ?? (data.payer ? `payer:${data.payer}` : 'anonymous'),
        label: tool.name,
        limits: tool.limits,
        signal: job.signal,
        progress,
        log,
      };
      let result: unknown;
      const { config } = this.deps;
      // The event loop's context: everything a handler may use (network clients, store, balance).
      const eventLoopContext = (): ToolContext => {
        const dns = createResolver(config);
        return {
          config,
          log,
          signal: job.signal,
          progress,
          http: createGuardedHttp({ config, resolver: dns, tool: tool.name, signal: job.signal, progress }),
          ...(config.SEARCH_BASE_URL ? { search: createSearch(config, job.signal) } : {}),
          ...(config.LLM_BASE_URL ? { llm: createLlm({ config, log, signal: job.signal, progress, recordUsage }) } : {}),
          dns,
          callerKeyId: data.keyId,
          sandbox: data.sandbox,
          accountId: accountId ?? '',
          keyId: data.subKeyId,
          edgeToken,
          balance: () => this.balance(accountId, data.subKeyId),
          ...(this.deps.redis && accountId
            ? { store: accountStore(this.deps.redis, this.deps.config.REDIS_PREFIX, { accountId, sandbox: data.sandbox, tool: tool.name }) }
            : {}),
          ...(this.deps.redis && accountId
            ? {
                passports: passportsFor(
                  { redis: this.deps.redis, config, accounts: this.deps.accounts, log },
                  { accountId, callerKeyId: data.keyId, sandbox: data.sandbox, callId: job.id, ownOnly: data.subKeyId !== null },
                ),
              }
            : {}),
          recordUsage,
          isolate: (task, payload) => sandbox.runTask(task, payload, { ...sandboxCall, label: `${tool.name}/${task}` }),
        };
      };
      // Built once, and only for a tool that uses it on the event loop.
      let loopCtx: ToolContext | undefined;
      const loop = () => (loopCtx ??= eventLoopContext());
      // A tool that reads what the caller named (URLs) does that on the event loop first.
      const input = tool.prepare ? await tool.prepare(parsed.data, loop()) : parsed.data;
      if (tool.isolated && sandbox.isolating) {
        const out = await sandbox.runTool(tool, input, { sandbox: data.sandbox, accountId: accountId ?? '', keyId: data.subKeyId }, sandboxCall);
        recordUsage(out.usage);
        result = out.value;
      } else {
        result = await tool.handler(input, loop());
      }
      // ...and one that keeps what it computed (handoff's passport) does that after.
      if (tool.finish) result = await tool.finish(result, input, loop());
      // The final answer, whatever the tool assembled after its pool tasks, is held to
      // TOOL_MAX_RESULT_BYTES: over it the call fails for good, uncharged (its hold goes back below).
      const resultJson = JSON.stringify(result) ?? 'null';
      const resultBytes = Buffer.byteLength(resultJson);
      if (resultBytes > config.TOOL_MAX_RESULT_BYTES) throw answerTooLarge(tool.name, resultBytes, config.TOOL_MAX_RESULT_BYTES);
      job.resultBytes = resultBytes;
      job.storedWhole = false;
      const cost = data.sandbox ? 0 : data.payer ? data.listPriceCents : data.priceCents;
      // Calls paid per call (x402) are recorded by the API once their payment settles, not here.
      if (!stored || !accountId) return { result, cost_cents: cost, remaining_credits: null };
      // A sensitive tool's answer goes to job_results sealed, bound to this job.
      const sealed: Sealed | null = tool.sensitive ? jobSeal(config).seal(result, resultBinding(job.id)) : null;
      const storedJson = sealed ? JSON.stringify(sealed) : resultJson;
      // The charge (if any) and this answer, in one statement with the rest of the batch.
      const settled = await this.deps.settler.settle({
        ...this.settlement(data, job, 'completed'),
        amount: data.priceCents,
        costCents: cost,
        result: sealed ?? result,
        resultJson: storedJson,
        usage: Object.keys(usage).length ? usage : null,
        // Its account's slot for this job goes back with the batch's holds.
        slotId: job.id,
      });
      if (settled.slotReleased) job.slotReleased = true;
      // Settled before (a redelivery that ran anyway): the first answer is the one that was charged.
      if (settled.prior) return await this.answerWith(data, job, settled.prior);
      if (!settled.stored) {
        const prior = await this.deps.results.get(job.id);
        if (prior) return await this.answerWith(data, job, prior);
      }
      job.storedWhole = (sealed ? Buffer.byteLength(storedJson) : resultBytes) <= config.RESULT_MAX_BYTES;
      return {
        result,
        cost_cents: cost,
        remaining_credits: settled.remaining,
        ...(data.sandbox ? { sandbox: true as const } : {}),
      };
    } catch (e) {
      if (e instanceof JobFailure) throw e;
      if (job.signal.aborted && job.signal.reason === JOB_CANCELLED) {
        // Its cancelled outcome is already stored (the cancel wrote it first): nothing to record, nothing charged.
        await this.releaseHold(data, job.id);
        throw new JobFailure(cancelledError(), true);
      }
      const err = this.normalise(e, edgeToken);
      const final = !err.retryable || job.attemptsMade + 1 >= job.maxAttempts;
      if (final && stored) {
        // Recorded as failed unless it was settled after all (say the commit went through but its
        // answer was lost): then it completed, and is answered as such, never as "not charged".
        const prior = await this.recordFailure(data, job, err);
        if (prior) return this.answerWith(data, job, prior);
      }
      if (final) await this.releaseHold(data, job.id);
      throw new JobFailure(err, final);
    }
  }

  /**
   * Ends a job that is not run (a chain step after one that failed by its caller's doing) as failed
   * with `err`: recorded so GET /jobs/{id} says why, not charged, its hold given back.
   */
  async endUnrun(data: CallJobData, job: Pick<JobRun, 'id' | 'createdAt'>, err: AppError): Promise<void> {
    if (data.accountId !== null && data.payer === null) await this.recordFailure(data, job, err);
    await this.releaseHold(data, job.id);
  }

  /** The fields every settlement of this job shares. */
  private settlement(
    data: CallJobData,
    job: Pick<JobRun, 'id' | 'createdAt'>,
    status: Settlement['status'],
  ): Omit<Settlement, 'amount' | 'costCents' | 'result' | 'usage'> {
    return {
      jobId: job.id,
      accountId: data.accountId!,
      keyId: data.keyId,
      tool: data.tool,
      status,
      sandbox: data.sandbox,
      agentName: data.agentName,
      createdAt: job.createdAt ?? null,
      holdId: status === 'completed' && data.priceCents > 0 ? job.id : null,
      ...(data.callbackUrl ? { callbackUrl: data.callbackUrl } : {}),
    };
  }

  /**
   * Stores a final failure (best effort: a failure to store it only costs GET /jobs its record).
   * Returns the job's completed outcome when it turns out to have one.
   */
  private async recordFailure(data: CallJobData, job: Pick<JobRun, 'id' | 'createdAt'>, err: AppError): Promise<StoredOutcome | null> {
    try {
      const out = await this.deps.settler.settle({ ...this.settlement(data, job, 'failed'), amount: 0, costCents: 0, result: err.toJSON(), usage: null });
      if (out.prior?.status === 'completed') return out.prior;
      if (!out.stored && !out.prior) {
        const prior = await this.deps.results.get(job.id);
        if (prior?.status === 'completed') return prior;
      }
    } catch (e) {
      this.deps.log.warn({ err: (e as Error).message, job: job.id }, 'recording a failed call failed');
    }
    return null;
  }

  /** Answers with a stored outcome: the completed body as first answered, or its failure (final). */
  private async answerWith(data: CallJobData, job: JobRun, stored: StoredOutcome): Promise<CallResult> {
    const jobId = job.id;
    // Settlement hands back the row as stored: a sensitive tool's answer sealed.
    const prior = jobSeal(this.deps.config).openOutcome(jobId, stored);
    // A run that settled and then died before its webhook was queued: queued now (once; deliveries are keyed by job id).
    if (data.callbackUrl && data.accountId) {
      await this.deps.settler
        .onEnded?.([{ jobId, accountId: data.accountId, callbackUrl: data.callbackUrl }])
        .catch((err: Error) => this.deps.log.warn({ err: err.message, job: jobId }, 'queueing a webhook delivery failed'));
    }
    // Failed, or cancelled (DELETE /jobs/{id} won before this run settled): not charged, final.
    if (prior.status !== 'completed') {
      await this.releaseHold(data, jobId);
      throw new JobFailure(AppError.fromJSON(prior.body as unknown as SerializedError), true);
    }
    // Its charge is durable: the hold (if a crash left it) goes, as the settler would have dropped it,
    // and its spend alerts are checked (the run that settled may have died before it checked them).
    if (data.accountId && data.priceCents > 0) {
      await this.deps.credits.settled([{ accountId: data.accountId, holdId: jobId }]).catch(() => {});
      await this.deps.settler.onCharged?.([{ accountId: data.accountId, keyId: data.keyId }]).catch(() => {});
    }
    // The answer is job_results' own: a large one travels as a reference to it (src/calls/worker-pool.ts).
    job.resultBytes = Buffer.byteLength(JSON.stringify(prior.body.result) ?? 'null');
    job.storedWhole = true;
    return storedAnswer(prior);
  }

  /** Gives back the hold of a job that failed for good. Safe to call more than once. */
  async releaseHold(data: CallJobData, jobId: string): Promise<void> {
    const holds = [...(data.priceCents > 0 ? [jobId] : []), ...(data.laterSteps ?? [])];
    if (data.accountId && holds.length) await this.deps.credits.release(data.accountId, holds);
  }

  private async balance(accountId: string | null, subKeyId: string | null) {
    if (!accountId) throw new AppError('invalid_input', 'check_balance needs an API key');
    return this.deps.accounts.balanceView(accountId, subKeyId);
  }

  private normalise(e: unknown, edgeToken: string | undefined): AppError {
    if (isAppError(e)) {
      if (!edgeToken) return e;
      const msg = redactToken(e.message, edgeToken);
      return msg === e.message ? e : new AppError(e.code, msg, e.details, { retryable: e.retryable });
    }
    // Postgres or Redis unreachable (a settlement's connection terminated): not the tool's fault. Retried
    // like any fault; if the attempts run out the caller gets 503 service_unavailable (retry), not a 500.
    if (isDependencyError(e)) return dependencyUnavailable();
    // A fault: logged with its stack (where the bug is), the edge token redacted from both.
    const message = redactToken(e instanceof Error ? e.message : String(e), edgeToken);
    const stack = e instanceof Error && e.stack ? redactToken(e.stack, edgeToken) : undefined;
    this.deps.log.error({ err: { type: (e as Error)?.name, message, stack } }, 'tool failed unexpectedly');
    // Unexpected faults may be transient (a dropped connection): retry, and report no internals.
    return new AppError('internal_error', 'The tool failed unexpectedly', {}, { retryable: true });
  }
}
