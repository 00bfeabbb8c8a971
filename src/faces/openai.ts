import { PassThrough } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { AppError, isAppError } from '../errors.js';
import type { JobEvent } from '../queue/dispatcher.js';
import type { KeyCaller } from '../access/auth.js';
import { authorizeTool } from '../calls/admission.js';
import { JobWatch } from '../calls/job-watch.js';
import { awaitJobBody, sendIdempotent } from './http/calls.js';
import { ClientGone, stillRunning, type TrackJob } from '../calls/idempotency.js';
import type { CallResult } from '../queue/call-job.js';
import { dollars, needsMet } from '../tools/index.js';
import { llmChatModels } from '../tools/llm/index.js';
import { chatToToolInput, type LlmUsage } from '../tools/llm/llm-client.js';
import { PLANS, type AnyTool } from '../tools/types.js';
import { OpenAiErrorSchema, RATE_LIMIT } from './http/openapi-components.js';
import { input, named, ok, type ErrorStatus, type HeaderName, type ResponseDoc, type RouteSchema } from './http/route-schema.js';

/**
 * OpenAI-compatible chat completions: each svc-* model is the language-model tool of the same name,
 * run and charged through the same admission, queue and metering path as POST /tools/{name}.
 */

// ---------------------------------------------------------------------------------------------
// Request

const ContentPartSchema = z
  .object({
    type: z.string().describe('Part type; only "text" parts are read, others (images, audio) are ignored.'),
    text: z.string().optional().describe('The text of a "text" part.'),
  })
  .passthrough();

const MessageSchema = z
  .object({
    role: z.enum(['system', 'developer', 'user', 'assistant', 'tool', 'function']).describe('Author of the message. The last message must be the user\u2019s.'),
    content: z
      .union([z.string(), z.array(ContentPartSchema), z.null()])
      .optional()
      .describe('Text, or an array of content parts of which the text parts are used.'),
  })
  .passthrough();

export const ChatCompletionRequestSchema = named(
  'ChatCompletionRequest',
  z
    .object({
      model: z.string().min(1).describe('One of the models GET /v1/models lists: svc-genius, svc-hints, svc-roast.'),
      messages: z
        .array(MessageSchema)
        .min(1)
        .max(200)
        .describe('The conversation, oldest first; the last user message is the request, earlier ones are context.'),
      stream: z.boolean().nullish().describe('Stream chat.completion.chunk events as the model generates tokens.'),
      stream_options: z
        .object({ include_usage: z.boolean().nullish().describe('Send a last chunk with token usage before [DONE].') })
        .passthrough()
        .nullish(),
      max_completion_tokens: z.number().int().positive().nullish().describe('Upper bound on generated tokens.'),
      max_tokens: z.number().int().positive().nullish().describe('Older name of max_completion_tokens.'),
      temperature: z
        .number()
        .min(0)
        .max(2)
        .nullish()
        .describe('Accepted for compatibility and not used: each model runs at the temperature its prompt is tuned for.'),
      n: z.literal(1).nullish().describe('Number of choices; only 1 is offered.'),
    })
    // Clients send many optional fields (user, top_p, tools, seed...); they do not change what a tool does.
    .passthrough(),
);
export type ChatCompletionRequest = z.infer<typeof ChatCompletionRequestSchema>;

export const CHAT_REQUEST_EXAMPLES: ChatCompletionRequest[] = [
  { model: 'svc-hints', messages: [{ role: 'user', content: 'How do I find a cycle in a linked list in O(1) space?' }] },
  {
    model: 'svc-roast',
    messages: [{ role: 'user', content: 'Startup idea: a subscription for artisanal ice cubes.' }],
    stream: true,
    stream_options: { include_usage: true },
  },
];

// ---------------------------------------------------------------------------------------------
// Errors in OpenAI's shape

/** The two paths whose errors use OpenAI's body instead of the service's envelope. */
export function isOpenAiPath(url: string): boolean {
  return /^\/v1\/(chat\/completions|models)(\/|\?|$)/.test(url);
}

function openAiErrorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 402) return 'insufficient_quota';
  if (status === 403) return 'permission_error';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/**
 * `{"error": {"message", "type", "param", "code"}}` as OpenAI's SDKs parse it. `code` and the HTTP
 * status are the service's own (DECISIONS); its extra details (required_plan, retry_after...) follow.
 */
export function openAiErrorBody(err: AppError, requestId: string) {
  const { param, issues, ...details } = err.details as { param?: unknown; issues?: Array<{ path?: unknown[] }> };
  const issuePath = Array.isArray(issues) && issues[0]?.path?.length ? issues[0].path.join('.') : null;
  return {
    error: {
      message: err.message,
      type: openAiErrorType(err.status),
      param: typeof param === 'string' ? param : issuePath,
      code: err.code,
      request_id: requestId,
      ...(issues ? { issues } : {}),
      ...details,
    },
  };
}

/** Tool-input problems named by the chat request field that carried them. */
function asChatError(e: unknown, tool: AnyTool, body: ChatCompletionRequest): unknown {
  if (!isAppError(e) || e.code !== 'invalid_input' || typeof e.details.param === 'string') return e;
  const issues = e.details.issues as Array<{ path?: unknown[] }> | undefined;
  const field = issues?.[0]?.path?.[0];
  const param =
    field === 'max_tokens'
      ? body.max_completion_tokens != null
        ? 'max_completion_tokens'
        : 'max_tokens'
      : field === tool.qField || field === 'context'
        ? 'messages'
        : undefined;
  return param ? new AppError(e.code, e.message, { ...e.details, param }) : e;
}

// ---------------------------------------------------------------------------------------------
// Responses

/** Fixed, so every replica reports the same; the svc-* models are versioned with the service. */
const MODELS_CREATED = 1_735_689_600;

function modelObject(id: string, tool: AnyTool) {
  return {
    id,
    object: 'model' as const,
    created: MODELS_CREATED,
    owned_by: 'tollgate',
    description: tool.description,
    tool: tool.name,
    cost: dollars(tool.priceCents),
    price_cents: tool.priceCents,
    tier: tool.tier,
  };
}

function mayCall(caller: KeyCaller, tool: AnyTool): boolean {
  try {
    authorizeTool(caller, tool);
    return true;
  } catch {
    return false;
  }
}

function modelTool(model: string): AnyTool {
  const tool = llmChatModels.get(model);
  if (!tool) {
    throw new AppError('tool_not_found', `The model '${model}' does not exist; GET /v1/models lists the models: ${[...llmChatModels.keys()].join(', ')}`, {
      param: 'model',
    });
  }
  return tool;
}

interface ToolText {
  text: string;
  finish_reason: string;
  usage: LlmUsage | null;
}

function toolText(result: unknown): ToolText {
  const r = result as Partial<ToolText> | null;
  if (!r || typeof r.text !== 'string') throw new AppError('internal_error', 'The model answered in an unexpected shape');
  return { text: r.text, finish_reason: typeof r.finish_reason === 'string' ? r.finish_reason : 'stop', usage: r.usage ?? null };
}

const FINISH_REASON_LIST = ['stop', 'length', 'content_filter', 'tool_calls', 'function_call'] as const;
const FINISH_REASONS = new Set<string>(FINISH_REASON_LIST);
function finishReason(r: string): string {
  return FINISH_REASONS.has(r) ? r : 'stop';
}

/** What the call cost, alongside OpenAI's fields (clients ignore fields they do not know). */
function billing(jobId: string, body: CallResult) {
  return { job_id: jobId, cost_cents: body.cost_cents, remaining_credits: body.remaining_credits, ...(body.sandbox ? { sandbox: true } : {}) };
}

function failedWithJob(error: AppError, jobId: string): AppError {
  return new AppError(error.code, error.message, { ...error.details, job_id: jobId });
}

/** Every content delta an LLM tool reports as progress ({stage: 'generating', delta, done, unit}). */
function deltaOf(data: unknown): string {
  const d = (data as { delta?: unknown } | null)?.delta;
  return typeof d === 'string' ? d : '';
}

const nowSeconds = () => Math.floor(Date.now() / 1000);

// ---------------------------------------------------------------------------------------------
// What the routes answer (GET /openapi.json)

const ModelSchema = named(
  'Model',
  z.object({
    id: z.enum([...llmChatModels.keys()] as [string, ...string[]]),
    object: z.literal('model'),
    created: z.number().int().describe('Fixed: the svc-* models are versioned with the service.'),
    owned_by: z.literal('tollgate'),
    description: z.string(),
    tool: z.string().describe('The tool the model runs, at its price.'),
    cost: z.string().describe('The price in dollars, e.g. $0.02.'),
    price_cents: z.number().int(),
    tier: z.enum(PLANS).describe('The lowest plan that may call it.'),
  }),
);

const ModelListSchema = z.object({ object: z.literal('list'), data: z.array(ModelSchema).describe('The models your key may call.') });

const ModelParams = z.object({ model: z.string().describe('A model id (GET /v1/models lists them); an unknown one is 404.') });

// Factories: one zod schema used in two places would be written as a pointer into the other.
const tokenUsage = () => z.object({ prompt_tokens: z.number().int(), completion_tokens: z.number().int(), total_tokens: z.number().int() });

const billingSchema = () =>
  z
    .object({
      job_id: z.string(),
      cost_cents: z.number().int(),
      remaining_credits: z.number().int().nullable(),
      sandbox: z.literal(true).optional().describe('Present, true, for sandbox (cv_test_) keys.'),
    })
    .describe("The call's job id and charge, beside OpenAI's fields.");

const ChatCompletionSchema = named(
  'ChatCompletion',
  z.object({
    id: z.string().describe('chatcmpl-<job id>'),
    object: z.literal('chat.completion'),
    created: z.number().int(),
    model: z.string(),
    system_fingerprint: z.null(),
    choices: z
      .array(
        z.object({
          index: z.literal(0),
          message: z.object({ role: z.literal('assistant'), content: z.string(), refusal: z.null() }),
          logprobs: z.null(),
          finish_reason: z.enum(FINISH_REASON_LIST),
        }),
      )
      .describe('Always one choice.'),
    usage: tokenUsage().optional().describe('Token usage, when the upstream reported it.'),
    tollgate: billingSchema(),
  }),
);

named(
  'ChatCompletionChunk',
  z
    .object({
      id: z.string().describe('chatcmpl-<job id>'),
      object: z.literal('chat.completion.chunk'),
      created: z.number().int(),
      model: z.string(),
      system_fingerprint: z.null(),
      choices: z.array(
        z.object({
          index: z.literal(0),
          delta: z.object({ role: z.literal('assistant').optional(), content: z.string().optional() }),
          logprobs: z.null(),
          finish_reason: z.enum(FINISH_REASON_LIST).nullable(),
        }),
      ),
      usage: tokenUsage().nullable().optional().describe('With stream_options.include_usage: null on every chunk but the last, which has no choices.'),
      tollgate: billingSchema().optional().describe('On the chunk with the finish reason.'),
    })
    .describe('One `data:` event of a streamed chat completion (stream: true).'),
);

const CHAT_STREAM =
  'Server-Sent Events, each `data:` a ChatCompletionChunk: the role, each token delta as the model produces it, the finish reason (with `tollgate`), ' +
  'with stream_options.include_usage a chunk of token usage, then `data: [DONE]`. A failure after the first event is a `data:` OpenAiError and ends the stream; ' +
  'comment lines keep the connection alive.';

const OPENAI_ERRORS: Record<string, { description: string; headers?: HeaderName[] }> = {
  '400': { description: 'The body or parameters are invalid (`param` names the field; issues lists them).' },
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
  '503': { description: 'A dependency or the model upstream is unavailable; nothing was charged.', headers: ['Retry-After'] },
  '504': { description: 'The call took too long.' },
};

/** The error answers of these routes, in OpenAI's shape (isOpenAiPath) instead of the service's envelope. */
function openAiErrors(extra: ErrorStatus[]): Record<string, ResponseDoc> {
  const codes = new Set<string>(['401', '429', '500', '503', ...extra]);
  return Object.fromEntries(
    Object.entries(OPENAI_ERRORS)
      .filter(([status]) => codes.has(status))
      .map(([status, e]) => [status, ok(OpenAiErrorSchema, `${e.description} In OpenAI's error shape.`, e.headers ? { headers: e.headers } : {})]),
  );
}

// ---------------------------------------------------------------------------------------------
// Routes

/**
 * Queues the chat's tool call and starts watching its job. The answer waits as long as the client
 * does (a long generation is not cut off by the REST sync timeout); admission errors come back as
 * plain HTTP errors. A client that hangs up stops the wait; the job still finishes and is charged if
 * it succeeds, as with a REST call whose client goes away.
 */
async function startChat(
  req: FastifyRequest,
  reply: FastifyReply,
  caller: KeyCaller,
  tool: AnyTool,
  input: unknown,
  body: ChatCompletionRequest,
  track?: TrackJob,
) {
  const { calls, dispatcher } = req.server.container.api!;
  const watch = new JobWatch(dispatcher, !!body.stream);
  const onJobId = async (id: string) => {
    watch.attach(id);
    await track?.(id);
  };
  let jobId: string;
  try {
    ({ jobId } = await calls.call(caller, tool.name, input, { requestId: req.id, respondAsync: true, onJobId }));
  } catch (e) {
    watch.stop();
    throw asChatError(e, tool, body);
  }
  reply.raw.on('close', () => watch.stop());
  reply.header('x-job-id', jobId);
  return { watch, jobId };
}

export async function openAiRoutes(app: FastifyInstance): Promise<void> {
  const { config } = app.container;
  app.get(
    '/v1/models',
    {
      schema: {
        operationId: 'listModels',
        tags: ['OpenAI'],
        summary: 'OpenAI-compatible model list: the svc-* models your plan may call',
        description:
          'Each svc-* model is the language-model tool of the same name, at its price. Only the models your key may call are listed, ' +
          'and none while this service has no language-model upstream (LLM_BASE_URL unset).',
        response: { '200': ok(ModelListSchema, 'Models your key may call.', { headers: RATE_LIMIT }), ...openAiErrors([]) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      const data = [...llmChatModels].filter(([, tool]) => mayCall(caller, tool) && needsMet(tool, config)).map(([id, tool]) => modelObject(id, tool));
      return { object: 'list', data };
    },
  );

  app.get(
    '/v1/models/:model',
    {
      schema: {
        operationId: 'getModel',
        tags: ['OpenAI'],
        summary: 'One model (403 plan_required above your plan)',
        params: ModelParams,
        response: { '200': ok(ModelSchema, 'One model.', { headers: RATE_LIMIT }), ...openAiErrors(['403', '404']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      const { model } = input<typeof ModelParams>(req, 'params');
      const tool = modelTool(model);
      authorizeTool(caller, tool);
      return modelObject(model, tool);
    },
  );

  app.post(
    '/v1/chat/completions',
    {
      schema: {
        operationId: 'chatCompletions',
        tags: ['OpenAI'],
        summary: 'OpenAI-compatible chat completions (stream: true for Server-Sent Events)',
        description:
          'Each svc-* model runs the language-model tool of the same name, charged at its price like POST /tools/{name}; the answer waits as long as the client does. ' +
          'With an Idempotency-Key (non-streaming only: with stream: true it is 400) a retry with the same key and body gets the first completion again and runs nothing. ' +
          "Errors are in OpenAI's shape, with the service's own `code` and status.",
        parameters: ['Idempotency-Key'],
        body: ChatCompletionRequestSchema,
        bodyExamples: Object.fromEntries(CHAT_REQUEST_EXAMPLES.map((value, i) => [`example${i + 1}`, { value }])),
        response: {
          '200': {
            description: 'chat.completion, or chat.completion.chunk events with stream: true.',
            headers: [...RATE_LIMIT, 'X-Job-Id', 'Idempotent-Replayed'],
            content: { 'application/json': { schema: ChatCompletionSchema }, 'text/event-stream': { schema: { type: 'string', description: CHAT_STREAM } } },
          },
          ...openAiErrors(['400', '402', '403', '404', '409', '413', '415', '422', '502', '504']),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      const body = input<typeof ChatCompletionRequestSchema>(req, 'body', 'Chat completion request is invalid');
      const tool = modelTool(body.model);
      const toolInput = chatToToolInput(tool, body.messages, body.max_completion_tokens ?? body.max_tokens);

      if (body.stream) {
        if (req.headers['idempotency-key'] !== undefined) {
          throw asChatError(
            new AppError('invalid_input', 'Idempotency-Key is supported on non-streaming chat completions only; send it without stream: true'),
            tool,
            body,
          );
        }
        const { watch, jobId } = await startChat(req, reply, caller, tool, toolInput, body);
        return streamCompletion(reply, watch, jobId, body, req.id);
      }
      // Non-streaming answers are stored under an Idempotency-Key like tool calls: a retry with the same
      // key and body gets the first completion again and runs (and charges) nothing. A client that hangs
      // up keeps the key: its retry gets the completion of the job the first request started.
      return sendIdempotent(
        req,
        reply,
        caller,
        async (track) => {
          const { watch, jobId } = await startChat(req, reply, caller, tool, toolInput, body, track);
          const done = await watch.finished;
          if (done.state === 'failed') throw failedWithJob(done.error, jobId);
          // The client is gone and no one can be answered; the job still completes and is charged.
          if (done.state === 'stopped') throw new ClientGone();
          return completionResponse(jobId, done.value, body.model);
        },
        async (jobIds) => {
          const jobId = jobIds[0]!;
          const job = await awaitJobBody(req, caller, jobId);
          if (!job) return null;
          const { job_id: _id, status, ...value } = job;
          if (status !== 'completed') {
            throw asChatError(stillRunning(jobId), tool, body);
          }
          return completionResponse(jobId, value as unknown as CallResult, body.model);
        },
      );
    },
  );
}

/** A finished job as a non-streaming chat completion. */
function completionResponse(jobId: string, value: CallResult, model: string) {
  const r = toolText(value.result);
  return {
    status: 200,
    headers: { 'x-job-id': jobId },
    body: {
      id: `chatcmpl-${jobId}`,
      object: 'chat.completion',
      created: nowSeconds(),
      model,
      system_fingerprint: null,
      choices: [{ index: 0, message: { role: 'assistant', content: r.text, refusal: null }, logprobs: null, finish_reason: finishReason(r.finish_reason) }],
      ...(r.usage ? { usage: r.usage } : {}),
      tollgate: billing(jobId, value),
    },
  };
}

/**
 * Server-sent chat.completion.chunk events: the role, then each token delta as the model produces
 * it (job progress), then the finish reason, the usage chunk if asked for, and [DONE].
 *
 * The response starts with the job's first event, so a call that fails before producing anything
 * (no upstream configured, upstream down) still answers with its HTTP status, as OpenAI does. A
 * failure after that is sent as a `data: {"error": ...}` event and ends the stream.
 */
async function streamCompletion(reply: FastifyReply, watch: JobWatch, jobId: string, body: ChatCompletionRequest, requestId: string) {
  const early: JobEvent[] = [];
  let write: ((e: JobEvent) => void) | null = null;
  const first = new Promise<JobEvent | null>((resolve) => {
    watch.listen((e) => {
      if (write) return write(e);
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

  const out = new PassThrough();
  const id = `chatcmpl-${jobId}`;
  const created = nowSeconds();
  const includeUsage = body.stream_options?.include_usage === true;
  const head = { id, object: 'chat.completion.chunk', created, model: body.model, system_fingerprint: null };
  const chunk = (delta: Record<string, unknown>, finish: string | null = null, extra: Record<string, unknown> = {}) => ({
    ...head,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
    ...(includeUsage ? { usage: null } : {}),
    ...extra,
  });
  const send = (data: unknown) => out.write(`data: ${JSON.stringify(data)}\n\n`);
  // Comment lines keep proxies from closing a stream while the model thinks between tokens.
  const keepAlive = setInterval(() => out.write(': keep-alive\n\n'), 15_000);
  keepAlive.unref();
  let ended = false;
  const end = () => {
    if (ended) return;
    ended = true;
    clearInterval(keepAlive);
    out.end();
  };
  reply.raw.on('close', end);

  let streamed = '';
  const onEvent = (e: JobEvent) => {
    if (ended) return;
    if (e.type === 'progress') {
      const delta = deltaOf(e.data);
      if (delta) {
        streamed += delta;
        send(chunk({ content: delta }));
      }
      return;
    }
    if (e.type === 'failed') {
      send(openAiErrorBody(failedWithJob(e.error, jobId), requestId));
      return end();
    }
    let r: ToolText;
    try {
      r = toolText(e.value.result);
    } catch (err) {
      send(openAiErrorBody(err as AppError, requestId));
      return end();
    }
    // Progress events can be lost (e.g. a trimmed event stream); the result has the whole text, so
    // a missing tail is sent here and the deltas always add up to the answer when they can.
    if (r.text.length > streamed.length && r.text.startsWith(streamed)) send(chunk({ content: r.text.slice(streamed.length) }));
    send(chunk({}, finishReason(r.finish_reason), { tollgate: billing(jobId, e.value) }));
    if (includeUsage) send({ ...head, choices: [], usage: r.usage });
    out.write('data: [DONE]\n\n');
    end();
  };

  reply.header('content-type', 'text/event-stream; charset=utf-8').header('cache-control', 'no-cache').header('x-accel-buffering', 'no');
  void reply.send(out);
  send(chunk({ role: 'assistant', content: '' }));
  for (const e of early.splice(0)) onEvent(e);
  write = onEvent;
  return reply;
}
