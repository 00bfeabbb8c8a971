import type { FastifyInstance, FastifyReply } from 'fastify';
import { z } from 'zod';
import { AppError } from '../errors.js';
import type { JobWatch } from '../calls/job-watch.js';
import type { CallResult } from '../queue/call-job.js';
import { chatToToolInput, type ChatMessageLike, type LlmUsage } from '../tools/llm/llm-client.js';
import type { AnyTool } from '../tools/types.js';
import { RATE_LIMIT } from './http/openapi-components.js';
import { named, type RouteSchema } from './http/route-schema.js';
import {
  billing,
  billingSchema,
  checkToolInput,
  deltaOf,
  failedWithJob,
  IGNORED,
  maxTokens,
  modelTool,
  nowSeconds,
  onlyIf,
  openAiErrors,
  runModelRequest,
  streamJob,
  toolText,
  WHY,
} from './openai-calls.js';
import { openAiErrorBody, parseOpenAi } from './openai-errors.js';

/**
 * OpenAI's Responses API (`POST /v1/responses`) for the same svc-* models as chat completions, run and
 * charged the same way: `input` (a string or messages) becomes the tool's request and context, the
 * answer is one output message. Responses are not stored, so nothing can be retrieved or continued
 * (`previous_response_id`, `store: true` and conversations are refused), and like chat completions the
 * models call no tools and answer in text.
 */

// ---------------------------------------------------------------------------------------------
// Request

const InputPartSchema = z
  .object({
    type: z.string().describe('input_text (or output_text in an echoed assistant message); images and files are refused.'),
    text: z.string().optional(),
  })
  .passthrough()
  .refine((p) => p.type === 'input_text' || p.type === 'output_text', {
    message: `Only text content parts are read: ${WHY}; images, audio and files are refused.`,
  })
  .refine((p) => typeof p.text === 'string', { message: 'A text content part needs its text.' });

const InputMessageSchema = z
  .object({
    type: z
      .string()
      .optional()
      .refine((t) => t === undefined || t === 'message', { message: `Only message items are read: ${WHY} and calls no functions.` })
      .describe("'message' (the default); function calls, their outputs and reasoning items are refused."),
    role: z.enum(['user', 'assistant', 'system', 'developer']).describe('The last item must be the user\u2019s.'),
    content: z.union([z.string(), z.array(InputPartSchema)]).describe('Text, or an array of input_text parts.'),
  })
  // Output messages echoed back carry id, status and annotations.
  .passthrough();

const NOT_STORED = 'Responses are not stored here, so none can be retrieved or continued';

export const ResponseRequestSchema = named(
  'CreateResponseRequest',
  z
    .object({
      model: z.string().min(1).describe('One of the models GET /v1/models lists: svc-genius, svc-hints, svc-roast.'),
      input: z
        .union([z.string(), z.array(InputMessageSchema).min(1).max(200)])
        .describe('The request as text, or the conversation as messages, oldest first; the last must be the user\u2019s.'),
      instructions: z
        .string()
        .nullish()
        .describe("Passed to the model as the calling application's instructions, after the tool's own (which it cannot replace)."),
      max_output_tokens: maxTokens().nullish().describe('Upper bound on generated tokens (16 to 16384).'),
      stream: z.boolean().nullish().describe('Stream the Responses API events as the model generates tokens.'),
      stream_options: z
        .object({ include_obfuscation: z.boolean().nullish().describe(IGNORED) })
        .strict()
        .nullish(),
      store: onlyIf(z.boolean(), (s) => !s, `${NOT_STORED}: send store: false or leave it out.`).describe('Only false: responses are not stored.'),
      previous_response_id: onlyIf(z.string(), () => false, `${NOT_STORED}: send the earlier turns in 'input' instead.`).describe(
        'Refused with 400: responses are not stored; send the conversation in input.',
      ),
      conversation: onlyIf(z.unknown(), () => false, `${NOT_STORED}: send the earlier turns in 'input' instead.`).describe('Refused with 400.'),
      background: onlyIf(
        z.boolean(),
        (b) => !b,
        "Background responses are not available: use stream: true, or Tollgate's POST /tools/{name} with Prefer: respond-async.",
      ).describe('Only false.'),
      prompt: onlyIf(z.object({}).passthrough(), () => false, 'Stored prompts are not available here: send the text in instructions and input.').describe(
        'Refused with 400.',
      ),
      tools: onlyIf(
        z.array(z.object({ type: z.string() }).passthrough()),
        (t) => t.length === 0,
        `Tools are not available: ${WHY}. Send the request without 'tools'.`,
      ).describe('Refused with 400 unless empty.'),
      tool_choice: onlyIf(
        z.union([z.enum(['none', 'auto', 'required']), z.object({ type: z.string() }).passthrough()]),
        (c) => c === 'none' || c === 'auto',
        `'tool_choice' can only be 'none' or 'auto': ${WHY} and calls no tools.`,
      ).describe("Only 'none' or 'auto'."),
      text: z
        .object({
          format: onlyIf(
            z.object({ type: z.enum(['text', 'json_object', 'json_schema']) }).passthrough(),
            (f) => f.type === 'text',
            `Structured output is not available: ${WHY} in the form its instructions ask for. Send text.format {"type": "text"} or none.`,
          ),
          verbosity: z.enum(['low', 'medium', 'high']).nullish().describe(IGNORED),
        })
        .strict()
        .optional()
        .describe('Only text.format {"type": "text"}.'),
      include: onlyIf(z.array(z.string()), (i) => i.length === 0, 'Extra output data is not available: the answer is one text message.').describe(
        'Only empty.',
      ),
      top_logprobs: onlyIf(
        z.number().int().min(0).max(20),
        (n) => n === 0,
        "Token log probabilities are not available: the upstream's are not passed on.",
      ).describe('Only 0.'),
      moderation: onlyIf(
        z.object({}).passthrough(),
        () => false,
        'Moderation is not available on these models: nothing would check the input or the answer.',
      ).describe('Refused with 400.'),
      context_management: onlyIf(z.array(z.unknown()), (c) => c.length === 0, `${NOT_STORED}: context management is not available.`).describe('Only empty.'),
      temperature: z.number().min(0).max(2).nullish().describe('Accepted and not used: each model runs at the temperature its instructions are tuned for.'),
      top_p: z.number().min(0).max(1).nullish().describe(IGNORED),
      parallel_tool_calls: z.boolean().nullish().describe(IGNORED),
      max_tool_calls: z.number().int().nullish().describe(IGNORED),
      reasoning: z.object({}).passthrough().nullish().describe(IGNORED),
      truncation: z.enum(['auto', 'disabled']).nullish().describe(IGNORED),
      metadata: z.record(z.string()).nullish().describe('Returned in the response; has no other effect.'),
      user: z.string().nullish().describe(IGNORED),
      safety_identifier: z.string().nullish().describe(IGNORED),
      service_tier: z.string().nullish().describe(IGNORED),
      prompt_cache_key: z.string().nullish().describe(IGNORED),
      prompt_cache_retention: z.string().nullish().describe(IGNORED),
      prompt_cache_options: z.object({}).passthrough().nullish().describe(IGNORED),
    })
    .strict(),
);
type ResponseRequest = z.infer<typeof ResponseRequestSchema>;

const RESPONSE_REQUEST_EXAMPLES: ResponseRequest[] = [
  { model: 'svc-hints', input: 'How do I find a cycle in a linked list in O(1) space?' },
  {
    model: 'svc-roast',
    instructions: 'Keep it under 50 words.',
    input: [{ role: 'user', content: 'Startup idea: a subscription for artisanal ice cubes.' }],
    stream: true,
  },
];

/**
 * The tool input of a Responses request: `instructions` and the input messages map to chat messages
 * (chatToToolInput), checked with the tool's schema and named by the field that carried them.
 */
function responseInput(tool: AnyTool, body: ResponseRequest): Record<string, unknown> {
  const items: ChatMessageLike[] = typeof body.input === 'string' ? [{ role: 'user', content: body.input }] : body.input.map(asChatMessage);
  const messages = body.instructions ? [{ role: 'system', content: body.instructions }, ...items] : items;
  let toolInput: Record<string, unknown>;
  try {
    toolInput = chatToToolInput(tool, messages, body.max_output_tokens);
  } catch (e) {
    throw e instanceof AppError ? new AppError(e.code, 'The last input item must be a user message with text content.', { param: 'input' }) : e;
  }
  const lastPath = typeof body.input === 'string' ? ['input'] : ['input', body.input.length - 1, 'content'];
  checkToolInput(tool, toolInput, {
    path: (p) => (p[0] === tool.qField ? lastPath : p[0] === 'max_tokens' ? ['max_output_tokens'] : ['input']),
    subject: (p) => (p[0] === 'context' ? (p.length > 2 ? 'An earlier input message' : 'The input before the last message') : undefined),
  });
  return toolInput;
}

function asChatMessage(m: z.infer<typeof InputMessageSchema>): ChatMessageLike {
  return { role: m.role, content: typeof m.content === 'string' ? m.content : m.content.map((p) => ({ type: 'text', text: p.text })) };
}

// ---------------------------------------------------------------------------------------------
// The response object

interface Answer {
  jobId: string;
  text: string;
  finish: string;
  usage: LlmUsage | null;
  value: CallResult;
}

function responseUsage(u: LlmUsage) {
  return {
    input_tokens: u.prompt_tokens,
    input_tokens_details: { cached_tokens: 0 },
    output_tokens: u.completion_tokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u.total_tokens,
  };
}

/** Why an answer stopped short, in the Responses API's words (null when it did not). */
function incompleteReason(finish: string): 'max_output_tokens' | 'content_filter' | null {
  return finish === 'length' ? 'max_output_tokens' : finish === 'content_filter' ? 'content_filter' : null;
}

function outputMessage(jobId: string, text: string, status: 'in_progress' | 'completed' | 'incomplete') {
  return {
    id: `msg_${jobId}`,
    type: 'message' as const,
    status,
    role: 'assistant' as const,
    content: status === 'in_progress' ? [] : [outputText(text)],
  };
}

const outputText = (text: string) => ({ type: 'output_text' as const, text, annotations: [], logprobs: [] });

/** The response object: in progress (no output yet), or finished with its one message, usage and charge. */
function responseObject(jobId: string, body: ResponseRequest, createdAt: number, answer?: Answer) {
  const reason = answer ? incompleteReason(answer.finish) : null;
  const status = !answer ? 'in_progress' : reason ? 'incomplete' : 'completed';
  return {
    id: `resp_${jobId}`,
    object: 'response' as const,
    created_at: createdAt,
    status,
    ...(answer ? { completed_at: nowSeconds() } : {}),
    error: null,
    incomplete_details: reason ? { reason } : null,
    instructions: body.instructions ?? null,
    max_output_tokens: body.max_output_tokens ?? null,
    model: body.model,
    output: answer ? [outputMessage(jobId, answer.text, reason ? 'incomplete' : 'completed')] : [],
    parallel_tool_calls: false,
    previous_response_id: null,
    temperature: null,
    top_p: null,
    tool_choice: 'none' as const,
    tools: [],
    text: { format: { type: 'text' as const } },
    truncation: 'disabled' as const,
    store: false,
    metadata: body.metadata ?? {},
    ...(answer?.usage ? { usage: responseUsage(answer.usage) } : {}),
    ...(answer ? { tollgate: billing(jobId, answer.value) } : {}),
  };
}

function answerOf(jobId: string, value: CallResult): Answer {
  const r = toolText(value.result);
  return { jobId, text: r.text, finish: r.finish_reason, usage: r.usage, value };
}

// ---------------------------------------------------------------------------------------------
// What the route answers (GET /openapi.json)

const OutputMessageSchema = z.object({
  id: z.string().describe('msg_<job id>'),
  type: z.literal('message'),
  status: z.enum(['in_progress', 'completed', 'incomplete']),
  role: z.literal('assistant'),
  content: z.array(z.object({ type: z.literal('output_text'), text: z.string(), annotations: z.array(z.never()), logprobs: z.array(z.never()) })),
});

const ResponseObjectSchema = named(
  'ResponseObject',
  z.object({
    id: z.string().describe('resp_<job id>'),
    object: z.literal('response'),
    created_at: z.number().int(),
    completed_at: z.number().int().optional(),
    status: z.enum(['in_progress', 'completed', 'incomplete']),
    error: z.null(),
    incomplete_details: z.object({ reason: z.enum(['max_output_tokens', 'content_filter']) }).nullable(),
    instructions: z.string().nullable(),
    max_output_tokens: z.number().int().nullable(),
    model: z.string(),
    output: z.array(OutputMessageSchema).describe('One assistant message (none while in progress).'),
    parallel_tool_calls: z.literal(false),
    previous_response_id: z.null(),
    temperature: z.null(),
    top_p: z.null(),
    tool_choice: z.literal('none'),
    tools: z.array(z.never()),
    text: z.object({ format: z.object({ type: z.literal('text') }) }),
    truncation: z.literal('disabled'),
    store: z.literal(false),
    metadata: z.record(z.string()),
    usage: z
      .object({
        input_tokens: z.number().int(),
        input_tokens_details: z.object({ cached_tokens: z.number().int() }),
        output_tokens: z.number().int(),
        output_tokens_details: z.object({ reasoning_tokens: z.number().int() }),
        total_tokens: z.number().int(),
      })
      .optional()
      .describe('Token usage, when the upstream reported it.'),
    tollgate: billingSchema().optional().describe('Once finished.'),
  }),
);

const RESPONSE_STREAM =
  'Server-Sent Events, each with `event:` its type and `data:` the event with a sequence_number: response.created, response.in_progress, ' +
  'response.output_item.added, response.content_part.added, one response.output_text.delta per token as the model produces it, ' +
  'response.output_text.done, response.content_part.done, response.output_item.done, then response.completed (or response.incomplete) ' +
  'with the whole ResponseObject. A failure after the first event is an `error` event (type, code, message, param, and OpenAI error object) and ends the stream.';

// ---------------------------------------------------------------------------------------------
// Route

export async function responsesRoutes(app: FastifyInstance): Promise<void> {
  app.post(
    '/v1/responses',
    {
      schema: {
        operationId: 'createResponse',
        tags: ['OpenAI'],
        summary: 'OpenAI-compatible Responses API for the svc-* models (stream: true for Server-Sent Events)',
        description:
          'The same models, prices and charging as POST /v1/chat/completions: `input` is the request (the last user message) and its context. ' +
          'Responses are not stored (previous_response_id, store: true and conversations are 400), and the models call no tools and answer in text. ' +
          "With an Idempotency-Key (non-streaming only) a retry with the same key and body gets the first response and runs nothing. Errors are in OpenAI's shape.",
        parameters: ['Idempotency-Key'],
        body: ResponseRequestSchema,
        bodyExamples: Object.fromEntries(RESPONSE_REQUEST_EXAMPLES.map((value, i) => [`example${i + 1}`, { value }])),
        response: {
          '200': {
            description: 'A response object, or its events with stream: true.',
            headers: [...RATE_LIMIT, 'X-Job-Id', 'Idempotent-Replayed'],
            content: {
              'application/json': { schema: ResponseObjectSchema },
              'text/event-stream': { schema: { type: 'string', description: RESPONSE_STREAM } },
            },
          },
          ...openAiErrors(['400', '402', '403', '404', '409', '413', '415', '422', '502', '504']),
        },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      const body = parseOpenAi(ResponseRequestSchema, req.body);
      const tool = modelTool(body.model);
      const createdAt = nowSeconds();
      const call = { tool, input: responseInput(tool, body), stream: body.stream === true, what: 'responses' };
      return runModelRequest(
        req,
        reply,
        caller,
        call,
        (watch, jobId) => streamResponse(reply, watch, jobId, body, createdAt, req.id),
        (jobId, value) => ({ status: 200, headers: { 'x-job-id': jobId }, body: responseObject(jobId, body, createdAt, answerOf(jobId, value)) }),
      );
    },
  );
}

/**
 * The Responses API's streaming events, each `event: <type>` with a sequence number: the response and
 * its message opened, one output_text delta per token as the model produces it, then everything
 * closed and the finished response. A failure after the first event is an `error` event that also
 * carries OpenAI's error object (so OpenAI's SDKs raise it) and ends the stream.
 */
function streamResponse(reply: FastifyReply, watch: JobWatch, jobId: string, body: ResponseRequest, createdAt: number, requestId: string) {
  const itemId = `msg_${jobId}`;
  const at = { item_id: itemId, output_index: 0, content_index: 0 };
  return streamJob(reply, watch, jobId, (out) => {
    let sequence = 0;
    const emit = (type: string, data: Record<string, unknown>) => out.send({ type, sequence_number: sequence++, ...data }, type);
    const opened = responseObject(jobId, body, createdAt);
    emit('response.created', { response: opened });
    emit('response.in_progress', { response: opened });
    emit('response.output_item.added', { output_index: 0, item: outputMessage(jobId, '', 'in_progress') });
    emit('response.content_part.added', { ...at, part: outputText('') });
    let streamed = '';
    const fail = (err: AppError) => {
      const { error } = openAiErrorBody(err, requestId);
      emit('error', { code: error.code, message: error.message, param: error.param, error });
      out.end();
    };
    return (e) => {
      if (e.type === 'progress') {
        const delta = deltaOf(e.data);
        if (delta) {
          streamed += delta;
          emit('response.output_text.delta', { ...at, delta, logprobs: [] });
        }
        return;
      }
      if (e.type === 'failed') return fail(failedWithJob(e.error, jobId));
      let answer: Answer;
      try {
        answer = answerOf(jobId, e.value);
      } catch (err) {
        return fail(err as AppError);
      }
      // Lost progress events: the result has the whole text, so a missing tail is sent here.
      if (answer.text.length > streamed.length && answer.text.startsWith(streamed)) {
        emit('response.output_text.delta', { ...at, delta: answer.text.slice(streamed.length), logprobs: [] });
      }
      const done = responseObject(jobId, body, createdAt, answer);
      const item = done.output[0]!;
      emit('response.output_text.done', { ...at, text: answer.text, logprobs: [] });
      emit('response.content_part.done', { ...at, part: outputText(answer.text) });
      emit('response.output_item.done', { output_index: 0, item });
      emit(done.status === 'incomplete' ? 'response.incomplete' : 'response.completed', { response: done });
      out.end();
    };
  });
}
