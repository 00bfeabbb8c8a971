import type { FastifyInstance, FastifyReply } from 'fastify';
import { z } from 'zod';
import { AppError } from '../errors.js';
import type { KeyCaller } from '../access/auth.js';
import { authorizeTool } from '../calls/admission.js';
import type { JobWatch } from '../calls/job-watch.js';
import type { CallResult } from '../queue/call-job.js';
import { dollars, needsMet } from '../tools/index.js';
import { llmChatModels } from '../tools/llm/index.js';
import { chatToToolInput } from '../tools/llm/llm-client.js';
import { PLANS, type AnyTool } from '../tools/types.js';
import { RATE_LIMIT } from './http/openapi-components.js';
import { input, named, ok, type RouteSchema } from './http/route-schema.js';
import {
  billing,
  billingSchema,
  checkToolInput,
  deltaOf,
  failedWithJob,
  IGNORED,
  maxTokens,
  modelTool,
  onlyIf,
  nowSeconds,
  openAiErrors,
  runModelRequest,
  streamJob,
  toolText,
  WHY,
} from './openai-calls.js';
import { openAiErrorBody, parseOpenAi } from './openai-errors.js';
import { responsesRoutes } from './openai-responses.js';

/**
 * OpenAI-compatible chat completions: each svc-* model is the language-model tool of the same name,
 * run and charged through the same admission, queue and metering path as POST /tools/{name}.
 */

// ---------------------------------------------------------------------------------------------
// Request
//
// The svc-* models are Tollgate tools, each with its own instructions, answering in prose. A request
// field that would change what the answer means but that they cannot honour (function calling,
// structured output, several choices, stop sequences, images...) is refused with 400 naming it, never
// ignored; a field that only tunes sampling or bookkeeping is accepted and has no effect; a field
// OpenAI's API does not have is refused as OpenAI refuses it ("Unrecognized request argument").

const ContentPartSchema = z
  .object({
    type: z.string().describe('Part type: only "text" parts are accepted.'),
    text: z.string().optional().describe('The text of a "text" part.'),
  })
  .passthrough()
  .refine((p) => p.type === 'text', { message: `Only text content parts are read: ${WHY}; images, audio and files are refused.` })
  .refine((p) => typeof p.text === 'string', { message: 'A text content part needs its text.' });

const MessageSchema = z
  .object({
    role: z
      .enum(['system', 'developer', 'user', 'assistant', 'tool', 'function'])
      .refine((r) => r !== 'tool' && r !== 'function', { message: `A conversation cannot carry tool results: ${WHY} and calls no functions.` })
      .describe('Author of the message; tool and function results are refused (the models call no functions). The last message must be the user\u2019s.'),
    content: z
      .union([z.string(), z.array(ContentPartSchema), z.null()])
      .optional()
      .describe('Text, or an array of text content parts.'),
    name: z.string().optional().describe('Accepted; has no effect.'),
    tool_calls: onlyIf(z.array(z.unknown()), (c) => c.length === 0, `A conversation cannot carry tool calls: ${WHY} and calls no functions.`),
    function_call: z
      .unknown()
      .refine((c) => c == null, { message: `A conversation cannot carry function calls: ${WHY} and calls no functions.` })
      .optional(),
  })
  // Assistant messages echoed back from a completion carry refusal, audio and annotations fields.
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
        .object({
          include_usage: z.boolean().nullish().describe('Send a last chunk with token usage before [DONE].'),
          include_obfuscation: z.boolean().nullish().describe(IGNORED),
        })
        .strict()
        .nullish(),
      max_completion_tokens: maxTokens().nullish().describe('Upper bound on generated tokens (16 to 16384).'),
      max_tokens: maxTokens().nullish().describe('Older name of max_completion_tokens.'),
      n: onlyIf(z.number().int().min(1), (n) => n === 1, `'n' must be 1: ${WHY}, one choice per call. Send separate requests for more answers.`).describe(
        'Number of choices: only 1 (more is 400).',
      ),
      tools: onlyIf(
        z.array(z.object({ type: z.string() }).passthrough()),
        (t) => t.length === 0,
        `Function calling is not available: ${WHY}. Send the request without 'tools'.`,
      ).describe('Refused with 400 unless empty: the models call no functions.'),
      tool_choice: onlyIf(
        z.union([z.enum(['none', 'auto', 'required']), z.object({ type: z.string() }).passthrough()]),
        (c) => c === 'none' || c === 'auto',
        `'tool_choice' can only be 'none' or 'auto': ${WHY} and calls no functions.`,
      ).describe("Only 'none' or 'auto' (400 otherwise): the models call no functions."),
      parallel_tool_calls: z.boolean().nullish().describe(IGNORED),
      functions: onlyIf(
        z.array(z.object({ name: z.string() }).passthrough()),
        (f) => f.length === 0,
        `Function calling is not available: ${WHY}. Send the request without 'functions'.`,
      ).describe('Refused with 400 unless empty: the models call no functions.'),
      function_call: onlyIf(
        z.union([z.enum(['none', 'auto']), z.object({ name: z.string() }).passthrough()]),
        (c) => c === 'none' || c === 'auto',
        `'function_call' can only be 'none' or 'auto': ${WHY} and calls no functions.`,
      ).describe("Only 'none' or 'auto' (400 otherwise)."),
      response_format: onlyIf(
        z.object({ type: z.enum(['text', 'json_object', 'json_schema']) }).passthrough(),
        (f) => f.type === 'text',
        `Structured output is not available: ${WHY} in the form its instructions ask for. Send 'response_format' {"type": "text"} or none.`,
      ).describe('Only {"type": "text"} (400 otherwise): the models answer in prose.'),
      stop: onlyIf(
        z.union([z.string(), z.array(z.string()).max(4)]),
        (s) => s.length === 0,
        `Stop sequences are not available: ${WHY} and ends where its instructions say. Send the request without 'stop'.`,
      ).describe('Refused with 400 unless empty.'),
      logprobs: onlyIf(z.boolean(), (l) => !l, "Token log probabilities are not available: the upstream's are not passed on.").describe(
        'Only false (400 otherwise).',
      ),
      top_logprobs: onlyIf(
        z.number().int().min(0).max(20),
        (n) => n === 0,
        "Token log probabilities are not available: the upstream's are not passed on.",
      ).describe('Only 0 (400 otherwise).'),
      logit_bias: onlyIf(
        z.record(z.number()),
        (b) => Object.keys(b).length === 0,
        `'logit_bias' is not available: ${WHY}, and token ids differ between upstreams.`,
      ).describe('Refused with 400 unless empty.'),
      modalities: onlyIf(z.array(z.enum(['text', 'audio'])), (m) => !m.includes('audio'), `Audio output is not available: ${WHY}.`).describe(
        'Only ["text"] (400 with "audio").',
      ),
      audio: onlyIf(z.object({}).passthrough(), () => false, `Audio output is not available: ${WHY}.`).describe('Refused with 400.'),
      web_search_options: onlyIf(z.object({}).passthrough(), () => false, `Web search is not available: ${WHY}.`).describe('Refused with 400.'),
      moderation: onlyIf(
        z.object({}).passthrough(),
        () => false,
        'Moderation is not available on these models: nothing would check the input or the answer.',
      ).describe('Refused with 400: nothing here would moderate.'),
      temperature: z
        .number()
        .min(0)
        .max(2)
        .nullish()
        .describe('Accepted for compatibility and not used: each model runs at the temperature its instructions are tuned for.'),
      top_p: z.number().min(0).max(1).nullish().describe(IGNORED),
      frequency_penalty: z.number().min(-2).max(2).nullish().describe(IGNORED),
      presence_penalty: z.number().min(-2).max(2).nullish().describe(IGNORED),
      seed: z.number().int().nullish().describe(IGNORED),
      reasoning_effort: z.string().nullish().describe(IGNORED),
      verbosity: z.enum(['low', 'medium', 'high']).nullish().describe(IGNORED),
      prediction: z.object({}).passthrough().nullish().describe('Accepted; has no effect (a prediction only speeds up an answer elsewhere).'),
      user: z.string().nullish().describe(IGNORED),
      safety_identifier: z.string().nullish().describe(IGNORED),
      metadata: z.record(z.string()).nullish().describe(IGNORED),
      store: z.boolean().nullish().describe('Accepted; completions are not stored for later retrieval.'),
      service_tier: z.string().nullish().describe(IGNORED),
      prompt_cache_key: z.string().nullish().describe(IGNORED),
      prompt_cache_retention: z.string().nullish().describe(IGNORED),
      prompt_cache_options: z.object({}).passthrough().nullish().describe(IGNORED),
    })
    // OpenAI's API refuses fields it does not know; so does this one, rather than ignore what they ask.
    .strict(),
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

/** No tool_calls: the models call no functions (tools are refused). */
const FINISH_REASON_LIST = ['stop', 'length', 'content_filter'] as const;
const FINISH_REASONS = new Set<string>(FINISH_REASON_LIST);
function finishReason(r: string): string {
  return FINISH_REASONS.has(r) ? r : 'stop';
}

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

// ---------------------------------------------------------------------------------------------
// Routes

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
      const body = parseOpenAi(ChatCompletionRequestSchema, req.body);
      const tool = modelTool(body.model);
      const call = { tool, input: chatInput(tool, body), stream: body.stream === true, what: 'chat completions' };
      return runModelRequest(
        req,
        reply,
        caller,
        call,
        (watch, jobId) => streamCompletion(reply, watch, jobId, body, req.id),
        (jobId, value) => completionResponse(jobId, value, body.model),
      );
    },
  );

  await responsesRoutes(app);
}

/**
 * The tool input of a chat request: the last user message is the tool's request, earlier turns its
 * context (chatToToolInput). It is checked here with the tool's schema so a problem is named by the
 * chat field that carried it.
 */
function chatInput(tool: AnyTool, body: ChatCompletionRequest): Record<string, unknown> {
  const maxField = body.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
  const toolInput = chatToToolInput(tool, body.messages, body.max_completion_tokens ?? body.max_tokens);
  const last = body.messages.length - 1;
  checkToolInput(tool, toolInput, {
    path: (p) => (p[0] === tool.qField ? ['messages', last, 'content'] : p[0] === 'max_tokens' ? [maxField] : ['messages']),
    subject: (p) => (p[0] === 'context' ? (p.length > 2 ? 'An earlier message' : 'The conversation before the last message') : undefined),
  });
  return toolInput;
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
 * it (job progress), then the finish reason, the usage chunk if asked for, and [DONE]. A failure
 * after the first event is sent as a `data: {"error": ...}` event and ends the stream.
 */
function streamCompletion(reply: FastifyReply, watch: JobWatch, jobId: string, body: ChatCompletionRequest, requestId: string) {
  const head = { id: `chatcmpl-${jobId}`, object: 'chat.completion.chunk', created: nowSeconds(), model: body.model, system_fingerprint: null };
  const includeUsage = body.stream_options?.include_usage === true;
  const chunk = (delta: Record<string, unknown>, finish: string | null = null, extra: Record<string, unknown> = {}) => ({
    ...head,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
    ...(includeUsage ? { usage: null } : {}),
    ...extra,
  });
  return streamJob(reply, watch, jobId, (out) => {
    out.send(chunk({ role: 'assistant', content: '' }));
    let streamed = '';
    const fail = (err: AppError) => {
      out.send(openAiErrorBody(err, requestId));
      out.end();
    };
    return (e) => {
      if (e.type === 'progress') {
        const delta = deltaOf(e.data);
        if (delta) {
          streamed += delta;
          out.send(chunk({ content: delta }));
        }
        return;
      }
      if (e.type === 'failed') return fail(failedWithJob(e.error, jobId));
      let r: ReturnType<typeof toolText>;
      try {
        r = toolText(e.value.result);
      } catch (err) {
        return fail(err as AppError);
      }
      // Progress events can be lost (e.g. a trimmed event stream); the result has the whole text, so
      // a missing tail is sent here and the deltas always add up to the answer when they can.
      if (r.text.length > streamed.length && r.text.startsWith(streamed)) out.send(chunk({ content: r.text.slice(streamed.length) }));
      out.send(chunk({}, finishReason(r.finish_reason), { tollgate: billing(jobId, e.value) }));
      if (includeUsage) out.send({ ...head, choices: [], usage: r.usage });
      out.write('data: [DONE]\n\n');
      out.end();
    };
  });
}
