import { PassThrough } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { AppError } from '../errors.js';
import type { KeyCaller } from '../access/auth.js';
import { JobWatch } from '../calls/job-watch.js';
import { ClientGone, stillRunning, type StoredResponse, type TrackJob } from '../calls/idempotency.js';
import type { JobEvent } from '../queue/dispatcher.js';
import { awaitJobBody, sendIdempotent } from './http/calls.js';
import type { CallResult } from '../queue/call-job.js';
import { llmChatModels } from '../tools/llm/index.js';
import { MAX_COMPLETION_TOKENS, type LlmUsage } from '../tools/llm/llm-client.js';
import type { AnyTool } from '../tools/types.js';
import { OpenAiErrorSchema, RATE_LIMIT } from './http/openapi-components.js';
import { ok, type ErrorStatus, type HeaderName, type ResponseDoc } from './http/route-schema.js';
import { parseOpenAi, type Naming } from './openai-errors.js';

/**
 * What the OpenAI-compatible endpoints (chat completions, responses) share: the svc-* model behind a
 * request, running it as a call of its tool (same admission, queue and metering as POST /tools/{name}),
 * and reading the tool's result back.
 */

export function modelTool(model: string): AnyTool {
  const tool = llmChatModels.get(model);
  if (!tool) {
    throw new AppError('tool_not_found', `The model '${model}' does not exist; GET /v1/models lists the models: ${[...llmChatModels.keys()].join(', ')}`, {
      param: 'model',
    });
  }
  return tool;
}

/** Each svc-* model runs one tool with its own instructions, and answers in text. */
export const WHY = 'each svc-* model runs one Tollgate tool with its own instructions and answers in text';

/** Fields that tune sampling or bookkeeping: accepted so OpenAI clients work, and without effect. */
export const IGNORED = 'Accepted for compatibility; has no effect.';

/** `schema`, refused with `message` unless `fine(value)`: a field accepted only where it changes nothing. */
export function onlyIf<S extends z.ZodTypeAny>(schema: S, fine: (v: NonNullable<z.output<S>>) => boolean, message: string) {
  return schema.nullish().refine((v) => v == null || fine(v as NonNullable<z.output<S>>), { message });
}

/** The token bound the tools accept (their max_tokens field), checked here so the field is named as sent. */
export const maxTokens = () => z.number().int().min(16).max(MAX_COMPLETION_TOKENS);

/**
 * The tool input a request maps to, checked with the tool's own schema before anything is queued, so
 * a problem is named by the request field that carried it (`field` says which, for each tool field).
 * The call checks the same input with the same schema again; it cannot fail differently.
 */
export function checkToolInput(tool: AnyTool, toolInput: Record<string, unknown>, naming: Naming): void {
  parseOpenAi(tool.input, toolInput, naming);
}

interface ToolText {
  text: string;
  finish_reason: string;
  usage: LlmUsage | null;
}

export function toolText(result: unknown): ToolText {
  const r = result as Partial<ToolText> | null;
  if (!r || typeof r.text !== 'string') throw new AppError('internal_error', 'The model answered in an unexpected shape');
  return { text: r.text, finish_reason: typeof r.finish_reason === 'string' ? r.finish_reason : 'stop', usage: r.usage ?? null };
}

/** What the call cost, alongside OpenAI's fields (clients ignore fields they do not know). */
export function billing(jobId: string, body: CallResult) {
  return { job_id: jobId, cost_cents: body.cost_cents, remaining_credits: body.remaining_credits, ...(body.sandbox ? { sandbox: true } : {}) };
}

export function failedWithJob(error: AppError, jobId: string): AppError {
  return new AppError(error.code, error.message, { ...error.details, job_id: jobId });
}

/** Every content delta an LLM tool reports as progress ({stage: 'generating', delta, done, unit}). */
export function deltaOf(data: unknown): string {
  const d = (data as { delta?: unknown } | null)?.delta;
  return typeof d === 'string' ? d : '';
}

export const nowSeconds = () => Math.floor(Date.now() / 1000);

/**
 * Queues the request's tool call and starts watching its job. The answer waits as long as the client
 * does (a long generation is not cut off by the REST sync timeout); admission errors come back as
 * plain HTTP errors. A client that hangs up stops the wait; the job still finishes and is charged if
 * it succeeds, as with a REST call whose client goes away.
 */
export async function startCall(
  req: FastifyRequest,
  reply: FastifyReply,
  caller: KeyCaller,
  tool: AnyTool,
  input: unknown,
  stream: boolean,
  track?: TrackJob,
): Promise<{ watch: JobWatch; jobId: string }> {
  const { calls, dispatcher } = req.server.container.api!;
  const watch = new JobWatch(dispatcher, stream);
  const onJobId = async (id: string) => {
    watch.attach(id);
    await track?.(id);
  };
  let jobId: string;
  try {
    ({ jobId } = await calls.call(caller, tool.name, input, { requestId: req.id, respondAsync: true, onJobId }));
  } catch (e) {
    watch.stop();
    throw e;
  }
  reply.raw.on('close', () => watch.stop());
  reply.header('x-job-id', jobId);
  return { watch, jobId };
}

// ---------------------------------------------------------------------------------------------
// What the routes answer (GET /openapi.json)

// Factories: one zod schema used in two places would be written as a pointer into the other.
export const billingSchema = () =>
  z
    .object({
      job_id: z.string(),
      cost_cents: z.number().int(),
      remaining_credits: z.number().int().nullable(),
      sandbox: z.literal(true).optional().describe('Present, true, for sandbox (cv_test_) keys.'),
    })
    .describe("The call's job id and charge, beside OpenAI's fields.");

const OPENAI_ERRORS: Record<string, { description: string; headers?: HeaderName[] }> = {
  '400': { description: 'The body or parameters are invalid, or ask for something these models do not do (`param` names the field).' },
  '401': { description: 'No key, a malformed key or an unknown or revoked key.' },
  '402': { description: 'insufficient_credits, or monthly_limit_exceeded for a sub-key.' },
  '403': { description: 'plan_required (the model is above your plan) or tool_not_allowed (a sub-key without it).' },
  '404': { description: 'tool_not_found: no such model (param: model).' },
  '409': {
    description: 'idempotency_in_progress (the first request with this Idempotency-Key is still running), or cancelled (its job was cancelled).',
    headers: ['Retry-After'],
  },
  '413': { description: 'The body is over BODY_LIMIT.' },
  '415': { description: 'Send the body as application/json.' },
  '422': { description: 'The model failed or passed a limit (tool_failed, limit_exceeded), or the Idempotency-Key was reused with another body.' },
  '429': { description: 'Rate or concurrency limit reached.', headers: [...RATE_LIMIT, 'Retry-After'] },
  '500': { description: 'Something went wrong on our side.' },
  '502': { description: 'The language model upstream failed.' },
  '503': {
    description: 'A dependency or the model upstream is unavailable, or no upstream is configured; nothing was charged.',
    headers: ['Retry-After'],
  },
  '504': { description: 'The call took too long.' },
};

/**
 * The error answers of these routes, in OpenAI's shape (isOpenAiPath) instead of the service's
 * envelope, each with `x-should-retry` (openAiShouldRetry).
 */
export function openAiErrors(extra: ErrorStatus[]): Record<string, ResponseDoc> {
  const codes = new Set<string>(['401', '429', '500', '503', ...extra]);
  return Object.fromEntries(
    Object.entries(OPENAI_ERRORS)
      .filter(([status]) => codes.has(status))
      .map(([status, e]) => [status, ok(OpenAiErrorSchema, `${e.description} In OpenAI's error shape.`, e.headers ? { headers: e.headers } : {})]),
  );
}

// ---------------------------------------------------------------------------------------------
// Waiting for the job

/** The result of a finished job; a failure is thrown with its job id, a client gone as ClientGone. */
export async function finishedValue(watch: JobWatch, jobId: string): Promise<CallResult> {
  const done = await watch.finished;
  if (done.state === 'failed') throw failedWithJob(done.error, jobId);
  // The client is gone and no one can be answered; the job still completes and is charged.
  if (done.state === 'stopped') throw new ClientGone();
  return done.value;
}

/** An Idempotency-Key retry's job, read back once it completed (sendIdempotent's `recover`). */
export async function recoveredValue(req: FastifyRequest, caller: KeyCaller, jobId: string): Promise<{ jobId: string; value: CallResult } | null> {
  const job = await awaitJobBody(req, caller, jobId);
  if (!job) return null;
  const { job_id: _id, status, ...value } = job;
  if (status !== 'completed') throw stillRunning(jobId);
  return { jobId, value: value as unknown as CallResult };
}

/**
 * The handler both OpenAI-compatible endpoints share once their body is parsed: with `stream` the job's
 * events go to `streamed` (an Idempotency-Key is refused there: a stream cannot be replayed); otherwise
 * the finished job goes through `answer`, stored under an Idempotency-Key like a tool call's answer, so
 * a retry with the same key and body gets the first response and runs (and charges) nothing, and a
 * client that hung up keeps the key: its retry answers from the job the first request started.
 */
export async function runModelRequest(
  req: FastifyRequest,
  reply: FastifyReply,
  caller: KeyCaller,
  call: { tool: AnyTool; input: Record<string, unknown>; stream: boolean; what: string },
  streamed: (watch: JobWatch, jobId: string) => unknown,
  answer: (jobId: string, value: CallResult) => StoredResponse,
) {
  if (call.stream) {
    if (req.headers['idempotency-key'] !== undefined) {
      throw new AppError('invalid_input', `Idempotency-Key is supported on non-streaming ${call.what} only; send it without stream: true.`, {
        param: 'stream',
      });
    }
    const { watch, jobId } = await startCall(req, reply, caller, call.tool, call.input, true);
    return streamed(watch, jobId);
  }
  return sendIdempotent(
    req,
    reply,
    caller,
    async (track) => {
      const { watch, jobId } = await startCall(req, reply, caller, call.tool, call.input, false, track);
      return answer(jobId, await finishedValue(watch, jobId));
    },
    async (jobIds) => {
      const done = await recoveredValue(req, caller, jobIds[0]!);
      return done && answer(done.jobId, done.value);
    },
  );
}

/** Where a streamed answer writes its Server-Sent Events. */
export interface SseOut {
  /** One `data:` event (with `event:` when named). */
  send(data: unknown, event?: string): void;
  /** A raw line, e.g. `data: [DONE]`. */
  write(text: string): void;
  end(): void;
  readonly ended: boolean;
}

/**
 * Streams a job as Server-Sent Events: `begin` opens the stream and returns what to do with each job
 * event (progress deltas, then completion or failure).
 *
 * The response starts with the job's first event, so a call that fails before producing anything
 * (upstream down, no model) still answers with its HTTP status, as OpenAI does. A failure after that
 * is the stream's to report.
 */
export async function streamJob(reply: FastifyReply, watch: JobWatch, jobId: string, begin: (out: SseOut) => (e: JobEvent) => void): Promise<FastifyReply> {
  const early: JobEvent[] = [];
  let handle: ((e: JobEvent) => void) | null = null;
  const first = new Promise<JobEvent | null>((resolve) => {
    watch.listen((e) => {
      if (handle) return handle(e);
      if (!early.length) resolve(e);
      early.push(e);
    });
    void watch.finished.then((f) => f.state === 'stopped' && resolve(null));
  });
  const opening = await first;
  if (!opening) {
    reply.hijack(); // the client left while the job waited in the queue
    reply.raw.destroy();
    return reply;
  }
  if (opening.type === 'failed') throw failedWithJob(opening.error, jobId);

  const stream = new PassThrough();
  // Comment lines keep proxies from closing a stream while the model thinks between tokens.
  const keepAlive = setInterval(() => stream.write(': keep-alive\n\n'), 15_000);
  keepAlive.unref();
  let ended = false;
  const out: SseOut = {
    send: (data, event) => void stream.write(`${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`),
    write: (text) => void stream.write(text),
    end: () => {
      if (ended) return;
      ended = true;
      clearInterval(keepAlive);
      stream.end();
    },
    get ended() {
      return ended;
    },
  };
  reply.raw.on('close', out.end);

  reply.header('content-type', 'text/event-stream; charset=utf-8').header('cache-control', 'no-cache').header('x-accel-buffering', 'no');
  void reply.send(stream);
  const onEvent = begin(out);
  const guarded = (e: JobEvent) => {
    if (!out.ended) onEvent(e);
  };
  for (const e of early.splice(0)) guarded(e);
  handle = guarded;
  return reply;
}
