/**
 * calls/: what happens to one call from the moment it is accepted until its answer is read. Admission
 * (this file: tier, scope, input, then one Redis script for rate limit, slot and credit hold), the
 * runner and worker pool that execute it, the root protocol's chains and parallels, job watching,
 * idempotency, cancel, webhooks, job intents and calls paid per call. It decides the order of a call's steps; the
 * money it moves is money/'s, who may call is access/'s, and faces/ only translate.
 */
import { randomUUID } from 'node:crypto';
import { ownsJob } from '../access/keys.js';
import type { Config } from '../config.js';
import { AppError, type SerializedError } from '../errors.js';
import { ResultsStore } from '../money/results.js';
import { getTool, assertNeedsMet } from '../tools/index.js';
import { planRank, type AnyTool } from '../tools/types.js';
import type { CompletionDispatcher } from '../queue/dispatcher.js';
import { newJobId, type JobQueues } from '../queue/queues.js';
import { asDependencyError, dependencyUnavailable } from '../queue/redis.js';
import type { JobRecords } from '../queue/job-records.js';
import type { Caller } from '../access/auth.js';
import { PLAN_MAX_IN_FLIGHT, slotOwner, type InFlightSlots } from '../access/in-flight.js';
import type { CreditReservations } from '../money/holds.js';
import { assertEdgeToken, type EdgeTokenSealer } from '../access/edge-token.js';
import { assertInKeyToolSet } from '../access/tool-sets.js';
import { jobLostError, type CallJobData, type CallResult } from '../queue/call-job.js';
import { inputDigest, type IntentStore, type IntentWriter } from './intents.js';
import { currentIdempotency } from './idempotency.js';
import { sealedInput } from '../queue/job-seal.js';
import { parseOrThrow } from '../errors.js';
import type { DeferredHit } from '../access/rate-limit.js';
import { annotate, callAttributes, traced } from '../tracing.js';

export type CallAnswer =
  | { status: 200; jobId: string; body: CallResult }
  | { status: 202; jobId: string; body: { job_id: string; status: string; status_url: string } };

export interface CallOptions {
  requestId: string;
  respondAsync?: boolean;
  edgeToken?: string;
  /** Called with the job id as soon as it is queued (streaming). */
  onQueued?: (jobId: string) => void;
  /**
   * Called with the job id after admission, just before the job is queued. Subscribe to the
   * dispatcher here to be sure of seeing every progress event (the chat and MCP endpoints do).
   */
  onJobId?: (jobId: string) => void | Promise<void>;
  /** A Callback-Url already vetted (src/calls/webhooks.ts): the job's outcome is POSTed there when it ends. */
  callbackUrl?: string;
  /** The request's rate-limit hit, not counted yet: admission counts it in its own script. */
  rateLimit?: DeferredHit;
}

/**
 * Checks that the caller's plan and key may use the tool: the plan's tier, a sub-key's (or grant's)
 * allowed_tools and the key's default tool set, all of them (every surface calls this).
 */
export function authorizeTool(caller: Caller, tool: AnyTool): void {
  if (caller.kind !== 'key') return;
  if (planRank(caller.plan) < planRank(tool.tier)) {
    throw new AppError('plan_required', `${tool.name} needs the ${tool.tier} plan or higher; this account is on ${caller.plan}`, {
      required_plan: tool.tier,
      current_plan: caller.plan,
    });
  }
  if (caller.subKey && !caller.subKey.allowedTools.includes(tool.name)) {
    const who = caller.keyType === 'grant' ? 'This OAuth grant' : 'This sub-key';
    throw new AppError('tool_not_allowed', `${who} may not call ${tool.name}`, { allowed_tools: caller.subKey.allowedTools });
  }
  assertInKeyToolSet(caller.toolSet, tool.name);
}

/** Takes `edge_token` out of a request body so it is never validated, queued or logged in clear. */
export function takeEdgeToken(body: unknown): { input: unknown; edgeToken?: string } {
  if (body && typeof body === 'object' && !Array.isArray(body) && 'edge_token' in body) {
    const { edge_token, ...rest } = body as Record<string, unknown>;
    return { input: rest, edgeToken: typeof edge_token === 'string' && edge_token ? edge_token : undefined };
  }
  return { input: body };
}

/**
 * The front half of a tool call: admission (tier, scope, input, credit), enqueue on the tool's family
 * queue, and a wait for the outcome through the process's completion dispatcher.
 */
export class CallService {
  constructor(
    private readonly deps: {
      config: Config;
      queues: JobQueues;
      dispatcher: CompletionDispatcher;
      credits: CreditReservations;
      sealer: EdgeTokenSealer;
      records: JobRecords;
      slots: InFlightSlots;
      /** Stored answers (job_results): GET /jobs/{id} once Redis no longer knows the job. */
      results?: ResultsStore;
      /** Job intents (src/calls/intents.ts): written at admission, read when neither Redis nor job_results knows a job. */
      intents?: { writer: IntentWriter; store: IntentStore };
    },
  ) {}

  /** Validates a tool's input, including the edge token the cf_* tools need. */
  prepare(tool: AnyTool, rawInput: unknown, edgeToken: string | undefined): Record<string, unknown> {
    assertNeedsMet(tool, this.deps.config);
    const input = parseOrThrow(tool.input, rawInput ?? {}, `Input for ${tool.name} is invalid`) as Record<string, unknown>;
    if (tool.needsEdgeToken) assertEdgeToken(edgeToken);
    if (tool.needsEdgeToken && !edgeToken) {
      throw new AppError('invalid_input', `${tool.name} needs your Cloudflare API token: send it in the X-Edge-Token header (or as edge_token in the body)`, {
        issues: [{ path: ['X-Edge-Token'], message: 'required' }],
      });
    }
    return input;
  }

  jobData(caller: Caller, tool: AnyTool, input: Record<string, unknown>, requestId: string, edgeToken?: string): CallJobData {
    const key = caller.kind === 'key' ? caller : null;
    const sandbox = key?.sandbox ?? false;
    return {
      tool: tool.name,
      input,
      accountId: key?.accountId ?? null,
      keyId: key?.keyId ?? null,
      subKeyId: key?.subKey?.keyId ?? null,
      agentName: key?.agentName ?? null,
      payer: caller.kind === 'payer' ? caller.payer : null,
      priceCents: sandbox || caller.kind === 'payer' ? 0 : tool.priceCents,
      listPriceCents: tool.priceCents,
      sandbox,
      requestId,
      ...(edgeToken && tool.needsEdgeToken ? { edgeToken: this.deps.sealer.seal(edgeToken) } : {}),
      ...(tool.sensitive ? sealedInput(this.deps.config, tool.name, key?.accountId ?? null, input) : {}),
    };
  }

  /**
   * Admission of every job of a request at once: a slot each under the caller's cap on jobs in flight
   * (429 concurrency_limited), then credit holds (402 when the balance or a sub-key's month can't
   * cover them). Either all are admitted or nothing is held. A key's jobs then get their intents
   * committed (`rootId`: the request's root job, for chain and parallel steps), before any of them is
   * queued or its id told: a job accepted is a job recorded, and one Redis then loses is `lost`, not
   * unknown. Without its intents nothing is admitted (503, the hold and slot given back).
   */
  async reserve(caller: Caller, jobs: Array<{ jobId: string; data: CallJobData }>, rate?: DeferredHit, rootId?: string): Promise<void> {
    try {
      await traced('admission', () => this.admit(caller, jobs, rate), { 'tollgate.jobs': jobs.length });
    } catch (e) {
      // Redis or Postgres unreachable: 503 with Retry-After. Whatever was taken before the failure is
      // given back by the reconciler (no job will ever exist for it).
      throw asDependencyError(e);
    }
    const intents = this.deps.intents;
    if (caller.kind !== 'key' || !intents) return;
    const idem = currentIdempotency();
    const rows = jobs.map(({ jobId, data }) => ({
      jobId,
      accountId: caller.accountId,
      keyId: caller.keyId,
      tool: data.tool,
      digest: idem ? Buffer.from(idem.fingerprint, 'hex') : inputDigest(data.tool, data.input),
      idem: idem?.idem ?? null,
      rootId: rootId ?? null,
    }));
    try {
      await traced('intent', () => intents.writer.record(rows), { 'tollgate.jobs': rows.length });
    } catch {
      await this.release(
        caller,
        jobs.map((j) => j.jobId),
      ).catch(() => {});
      throw dependencyUnavailable();
    }
  }

  private async admit(caller: Caller, jobs: Array<{ jobId: string; data: CallJobData }>, rate?: DeferredHit): Promise<void> {
    const owner = slotOwner(jobs[0]!.data)!;
    const ids = jobs.map((j) => j.jobId);
    if (caller.kind !== 'key') return this.deps.slots.take(owner, PLAN_MAX_IN_FLIGHT.pro, ids);
    // A key's caller: slots and credit holds in one script (its slots live in its account's slot).
    const cap = this.deps.slots.capFor(caller.plan, caller.maxInFlight);
    const holds = jobs.filter((j) => j.data.priceCents > 0).map((j) => ({ holdId: j.jobId, amount: j.data.priceCents }));
    const sub = caller.subKey && holds.length ? { keyId: caller.subKey.keyId, monthlyLimitCents: caller.subKey.monthlyLimitCents } : null;
    await this.deps.credits.reserve(caller.accountId, holds, sub, this.deps.slots.claim(owner, cap, ids), rate);
  }

  /** Gives back what `reserve` took for jobs that were never queued. */
  async release(caller: Caller, jobIds: string[]): Promise<void> {
    const owner = caller.kind === 'key' ? caller.accountId : slotOwner({ accountId: null, payer: caller.payer })!;
    await this.deps.slots.release(owner, jobIds);
    if (caller.kind === 'key') await this.deps.credits.release(caller.accountId, jobIds);
  }

  statusUrl(jobId: string): string {
    return `/jobs/${jobId}`;
  }

  async call(caller: Caller, toolName: string, body: unknown, opts: CallOptions): Promise<CallAnswer> {
    const tool = getTool(toolName);
    authorizeTool(caller, tool);
    const taken = takeEdgeToken(body);
    const edgeToken = opts.edgeToken ?? taken.edgeToken;
    const input = this.prepare(tool, taken.input, edgeToken);
    const jobId = newJobId(tool.family);
    annotate(callAttributes({ tool: tool.name, family: tool.family, jobId, accountId: caller.kind === 'key' ? caller.accountId : null }));
    const data = this.jobData(caller, tool, input, opts.requestId, edgeToken);
    if (opts.callbackUrl && caller.kind === 'key') data.callbackUrl = opts.callbackUrl;
    await this.reserve(caller, [{ jobId, data }], opts.rateLimit);
    const wait = opts.respondAsync ? null : this.deps.dispatcher.waitFor(jobId, this.deps.config.SYNC_TIMEOUT_MS);
    try {
      // Awaited: an Idempotency-Key claim records the job before it can run.
      await opts.onJobId?.(jobId);
      await this.deps.queues.add(tool.family, jobId, data);
    } catch {
      wait?.cancel();
      // With Redis gone the release fails too: the reconciler gives the hold and slot back once the
      // grace period shows no job came of them. The API's connection has no offline queue and never
      // resends, so this enqueue cannot happen later behind the caller's back.
      await this.release(caller, [jobId]).catch(() => {});
      throw dependencyUnavailable();
    }
    opts.onQueued?.(jobId);
    const outcome = wait ? await wait.outcome : ({ state: 'pending' } as const);
    if (outcome.state === 'completed') return { status: 200, jobId, body: outcome.value };
    if (outcome.state === 'failed') {
      // Once charged, always reported charged: a job whose settlement committed and that then failed
      // (stalled twice, lost its lock) answers with its stored result.
      const stored = await this.deps.results?.get(jobId).catch(() => null);
      if (stored?.status === 'completed') {
        const { job_id: _id, status: _s, ...value } = ResultsStore.answer(jobId, stored);
        return { status: 200, jobId, body: value as unknown as CallResult };
      }
      throw withJob(outcome.error, jobId);
    }
    return { status: 202, jobId, body: { job_id: jobId, status: 'queued', status_url: this.statusUrl(jobId) } };
  }

  /** GET /jobs/{id}: the same body a sync call would have returned, for the key that made it. */
  async jobStatus(caller: Caller, jobId: string): Promise<{ status: number; body: unknown }> {
    const notFound = new AppError('not_found', `No job ${jobId} for this key`);
    // A key reads its own jobs and those of the keys it replaced (rotation); x402 payers read none.
    const owns = (keyId: string | null | undefined) => caller.kind === 'key' && ownsJob(caller, keyId);
    const view = await this.deps.queues.view(jobId).catch(() => null);
    if (view) {
      if (!owns(view.data.keyId)) throw notFound;
      if (view.state === 'completed') return { status: 200, body: { job_id: jobId, status: 'completed', ...view.value } };
      if (view.state === 'failed') {
        // A job whose charge committed is answered as charged, whatever failed after (a stall, a lost lock).
        const stored = await this.deps.results?.get(jobId).catch(() => null);
        if (stored?.status === 'completed' && owns(stored.keyId)) return { status: 200, body: ResultsStore.answer(jobId, stored) };
        // Cancelled (DELETE /jobs/{id}): a chain step failed by the cancelled step before it says so too.
        if (stored?.status === 'cancelled' && owns(stored.keyId)) throw withJob(AppError.fromJSON(stored.body as unknown as SerializedError), jobId);
        throw withJob(view.error, jobId);
      }
      return { status: 200, body: { job_id: jobId, status: view.status === 'active' ? 'running' : 'queued', progress: view.progress ?? null } };
    }
    const rec = await this.deps.records.get(jobId).catch(() => null);
    if (rec) {
      if (!owns(rec.keyId)) throw notFound;
      if (rec.state === 'completed') return { status: 200, body: { job_id: jobId, status: 'completed', ...rec.value } };
      throw withJob(AppError.fromJSON(rec.error!), jobId);
    }
    // Redis no longer knows the job (removed, expired, or Redis lost its data): Postgres has its answer.
    const stored = caller.kind !== 'key' ? null : await this.deps.results?.get(jobId);
    if (!stored) {
      // No outcome: its intent says whether it was accepted, and lost (410) or not yet found lost.
      const intent = caller.kind !== 'key' ? null : await this.deps.intents?.store.find(jobId);
      if (!intent || !owns(intent.keyId)) throw notFound;
      if (intent.state === 'lost') throw jobLostError(jobId);
      // Accepted, not in Redis, not yet past the reconciler: it reads as queued until it is marked lost.
      return { status: 200, body: { job_id: jobId, status: 'queued', progress: null } };
    }
    if (!owns(stored.keyId)) throw notFound;
    if (stored.status === 'completed') return { status: 200, body: ResultsStore.answer(jobId, stored) };
    throw withJob(AppError.fromJSON(stored.body as unknown as SerializedError), jobId);
  }
}

function withJob(err: AppError, jobId: string): AppError {
  return new AppError(err.code, err.message, { ...err.details, job_id: jobId }, { headers: { ...err.headers, 'x-job-id': jobId } });
}

export function newRequestId(): string {
  return randomUUID();
}
