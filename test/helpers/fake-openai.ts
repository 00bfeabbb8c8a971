import http from 'node:http';
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';

/**
 * A local stand-in for an OpenAI-compatible upstream (api.openai.com, vLLM, llama.cpp...). It speaks the
 * chat-completions wire format: `POST /v1/chat/completions` as a `chat.completion` JSON body or, with
 * `stream: true`, as SSE `chat.completion.chunk` events ending in `data: [DONE]`; and `GET /v1/models`.
 * Tests script each reply, hold tokens behind gates they control, and simulate failures.
 */

export interface FakeUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export type FakeReply =
  | {
      type: 'tokens';
      /** Each string is sent as its own streamed chunk (and joined for a non-streaming reply). */
      tokens: string[];
      finishReason?: 'stop' | 'length' | 'content_filter';
      /** Reported usage; by default computed from the request (about 4 characters a token). */
      usage?: FakeUsage;
      /** Behave like a server that ignores `stream_options.include_usage`. */
      omitUsage?: boolean;
      model?: string;
      /** Awaited before token `index` is written: the test decides when the stream may go on. */
      beforeToken?: (index: number) => Promise<void> | void;
    }
  /** An HTTP error with OpenAI's error body `{"error": {message, type, param, code}}`. */
  | { type: 'error'; status: number; message: string; errorType?: string; code?: string | null }
  /** Streams these tokens, then cuts the TCP connection without finishing the response. */
  | { type: 'drop'; tokens: string[] }
  /** Streams these tokens, then a `data:` line that is not JSON. */
  | { type: 'malformed'; tokens: string[] }
  /** Streams these tokens, then an `{"error": ...}` event, as OpenAI does when generation fails mid-stream. */
  | { type: 'stream-error'; tokens: string[]; message: string }
  /** Streams these tokens, then goes silent with the connection open. */
  | { type: 'stall'; tokens: string[] }
  /**
   * A JSON reply (structured output), streamed in small chunks: a value, or a function of the request
   * body that derives it (tests read the caller's data blocks from `body.messages`).
   */
  | { type: 'json'; value: unknown | ((body: any) => unknown) };

export interface RecordedRequest {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  /** Parsed JSON body (null for GET). */
  body: any;
  /** Content chunks written so far for this request (streaming replies). */
  tokensSent: number;
}

export interface FakeOpenAI {
  /** e.g. http://127.0.0.1:41234 */
  url: string;
  /** What to pass as the SDK's / LLM_BASE_URL: `${url}/v1`. */
  baseURL: string;
  requests: RecordedRequest[];
  /** Replies for the next requests, first in first out; after that the default reply is used. */
  enqueue(...replies: FakeReply[]): void;
  setDefault(reply: FakeReply): void;
  close(): Promise<void>;
}

export interface FakeOpenAIOptions {
  /** When set, requests must carry `Authorization: Bearer <apiKey>` or get OpenAI's 401. */
  apiKey?: string;
  models?: string[];
}

export interface Deferred<T = void> {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(reason: unknown): void;
}

export function deferred<T = void>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (r: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

const DEFAULT_REPLY: FakeReply = { type: 'tokens', tokens: ['Hello', ' from', ' the', ' fake', ' model', '.'] };

export async function startFakeOpenAI(opts: FakeOpenAIOptions = {}): Promise<FakeOpenAI> {
  const models = opts.models ?? ['gpt-4o-mini', 'fake-model'];
  const queue: FakeReply[] = [];
  let defaultReply = DEFAULT_REPLY;
  const requests: RecordedRequest[] = [];

  const server = http.createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (!res.headersSent) sendError(res, 500, `fake upstream crashed: ${String(err)}`, 'server_error');
      else res.destroy();
    });
  });

  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const raw = await readBody(req);
    const path = (req.url ?? '/').split('?')[0] ?? '/';
    let body: any = null;
    if (raw.length) {
      try {
        body = JSON.parse(raw);
      } catch {
        requests.push({ method: req.method ?? '', path, headers: req.headers, body: raw, tokensSent: 0 });
        return sendError(res, 400, 'We could not parse the JSON body of your request.', 'invalid_request_error');
      }
    }
    const record: RecordedRequest = { method: req.method ?? '', path, headers: req.headers, body, tokensSent: 0 };
    requests.push(record);

    if (opts.apiKey !== undefined && req.headers.authorization !== `Bearer ${opts.apiKey}`) {
      const got = (req.headers.authorization ?? '').replace(/^Bearer\s+/i, '');
      // Echoes the rejected key in full, as some compatible servers do: callers must not pass it on.
      return sendError(res, 401, `Incorrect API key provided: ${got}.`, 'invalid_request_error', 'invalid_api_key');
    }

    if (req.method === 'GET' && path === '/v1/models') {
      return sendJson(res, 200, {
        object: 'list',
        data: models.map((id) => ({ id, object: 'model', created: 1_700_000_000, owned_by: 'fake-openai' })),
      });
    }
    if (path !== '/v1/chat/completions') return sendError(res, 404, `Invalid URL (${req.method} ${path})`, 'invalid_request_error');
    if (req.method !== 'POST') return sendError(res, 405, `Method ${req.method} not allowed`, 'invalid_request_error');
    if (!body || typeof body.model !== 'string' || !Array.isArray(body.messages) || body.messages.length === 0) {
      return sendError(res, 400, "'model' and a non-empty 'messages' array are required.", 'invalid_request_error', null, 'messages');
    }

    let reply = queue.shift() ?? (defaultReply === DEFAULT_REPLY ? structuredDefault(body) : null) ?? defaultReply;
    if (reply.type === 'json') {
      const value = typeof reply.value === 'function' ? (reply.value as (b: any) => unknown)(body) : reply.value;
      reply = { type: 'tokens', tokens: chunkText(JSON.stringify(value)) };
    }
    if (reply.type === 'error') return sendError(res, reply.status, reply.message, reply.errorType ?? 'server_error', reply.code ?? null);
    if (body.stream === true) return stream(body, reply, record, res);
    return complete(body, reply, res);
  }

  async function complete(body: any, reply: Exclude<FakeReply, { type: 'error' } | { type: 'json' }>, res: http.ServerResponse) {
    if (reply.type === 'stall') return; // never answers; close() tears the socket down
    if (reply.type !== 'tokens') {
      res.socket?.destroy();
      return;
    }
    for (let i = 0; i < reply.tokens.length; i++) await reply.beforeToken?.(i);
    const content = reply.tokens.join('');
    sendJson(res, 200, {
      id: completionId(),
      object: 'chat.completion',
      created: now(),
      model: reply.model ?? body.model,
      choices: [{ index: 0, message: { role: 'assistant', content, refusal: null }, logprobs: null, finish_reason: reply.finishReason ?? 'stop' }],
      usage: reply.usage ?? estimateUsage(body, reply.tokens),
      system_fingerprint: null,
    });
  }

  async function stream(body: any, reply: Exclude<FakeReply, { type: 'error' } | { type: 'json' }>, record: RecordedRequest, res: http.ServerResponse) {
    const includeUsage = body.stream_options?.include_usage === true && !(reply.type === 'tokens' && reply.omitUsage);
    const id = completionId();
    const created = now();
    const model = (reply.type === 'tokens' && reply.model) || body.model;
    const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) => ({
      id,
      object: 'chat.completion.chunk',
      created,
      model,
      system_fingerprint: null,
      choices,
      ...(includeUsage ? { usage: null } : {}),
      ...extra,
    });
    const write = (data: unknown) => res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);

    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'x-request-id': `req_${randomBytes(12).toString('hex')}`,
    });
    res.flushHeaders();
    // OpenAI opens with the role and an empty content.
    write(chunk([{ index: 0, delta: { role: 'assistant', content: '', refusal: null }, logprobs: null, finish_reason: null }]));

    for (let i = 0; i < reply.tokens.length; i++) {
      if (reply.type === 'tokens') await reply.beforeToken?.(i);
      if (res.destroyed) return; // the client went away while we waited
      write(chunk([{ index: 0, delta: { content: reply.tokens[i] }, logprobs: null, finish_reason: null }]));
      record.tokensSent += 1;
    }

    switch (reply.type) {
      case 'drop':
        res.socket?.destroy();
        return;
      case 'malformed':
        write('{"id": "chatcmpl-broken", "choices": [');
        res.end();
        return;
      case 'stream-error':
        write({ error: { message: reply.message, type: 'server_error', param: null, code: null } });
        res.end();
        return;
      case 'stall':
        return;
      case 'tokens':
        write(chunk([{ index: 0, delta: {}, logprobs: null, finish_reason: reply.finishReason ?? 'stop' }]));
        if (includeUsage) write(chunk([], { usage: reply.usage ?? estimateUsage(body, reply.tokens) }));
        write('[DONE]');
        res.end();
    }
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const url = `http://127.0.0.1:${port}`;

  return {
    url,
    baseURL: `${url}/v1`,
    requests,
    enqueue: (...replies) => void queue.push(...replies),
    setDefault: (reply) => {
      defaultReply = reply;
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      }),
  };
}

function readBody(req: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    req.on('error', reject);
  });
}

function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    'x-request-id': `req_${randomBytes(12).toString('hex')}`,
  });
  res.end(text);
}

function sendError(res: http.ServerResponse, status: number, message: string, type: string, code: string | null = null, param: string | null = null): void {
  sendJson(res, status, { error: { message, type, param, code } });
}

function completionId(): string {
  return `chatcmpl-${randomBytes(12).toString('base64url')}`;
}

function now(): number {
  return Math.floor(Date.now() / 1000);
}

/** A deterministic stand-in for a tokenizer: about four characters a token, one token per chunk. */
function estimateUsage(body: any, tokens: string[]): FakeUsage {
  const chars = (body.messages as Array<{ content?: unknown }>).reduce(
    (n, m) => n + (typeof m.content === 'string' ? m.content.length : JSON.stringify(m.content ?? '').length),
    0,
  );
  const prompt = Math.ceil(chars / 4);
  return { prompt_tokens: prompt, completion_tokens: tokens.length, total_tokens: prompt + tokens.length };
}

// ---------------------------------------------------------------------------------------------
// Structured output: with no scripted reply, a request that asks for JSON (response_format json_schema,
// or json_object with the schema between <<<SCHEMA>>> markers in the instructions) gets a value that
// fits the schema, its strings drawn from the request's own user text, so replies are derived from the
// request and a caller's words come back in them.

/** The text of the request's user messages, in order. */
export function userText(body: any): string {
  return (body?.messages ?? [])
    .filter((m: any) => m.role === 'user')
    .map((m: any) => (typeof m.content === 'string' ? m.content : ''))
    .join('\n');
}

/** The caller's data blocks (<<<DATA name>>> ... <<<END name>>>) by name. */
export function dataBlocksOf(body: any): Record<string, string> {
  const out: Record<string, string> = {};
  const re = /<<<DATA ([A-Za-z0-9_-]+)>>>\n([\s\S]*?)\n<<<END \1>>>/g;
  for (const m of userText(body).matchAll(re)) out[m[1]!] = m[2]!;
  return out;
}

function requestedSchema(body: any): Record<string, unknown> | null {
  const rf = body?.response_format;
  if (rf?.type === 'json_schema' && rf.json_schema?.schema) return rf.json_schema.schema;
  if (rf?.type === 'json_object') {
    const sys = (body.messages ?? []).find((m: any) => m.role === 'system')?.content ?? '';
    const m = /<<<SCHEMA>>>\n([\s\S]*?)\n<<<END SCHEMA>>>/.exec(String(sys));
    if (m) return JSON.parse(m[1]!);
  }
  return null;
}

function structuredDefault(body: any): FakeReply | null {
  const schema = requestedSchema(body);
  if (!schema) return null;
  const words = Object.values(dataBlocksOf(body)).join(' ').split(/\s+/).filter(Boolean);
  return { type: 'json', value: synthesize(schema, words.length ? words : ['fake']) };
}

/** A value that satisfies a JSON Schema (the subset zod-to-json-schema emits), strings from `words`. */
export function synthesize(schema: any, words: string[]): unknown {
  let cursor = 0;
  const phrase = (n: number) => {
    const out: string[] = [];
    for (let i = 0; i < n; i++) out.push(words[(cursor + i) % words.length]!);
    cursor = (cursor + n) % words.length;
    return out.join(' ');
  };
  const gen = (s: any): unknown => {
    if (!s || typeof s !== 'object') return null;
    if (s.const !== undefined) return s.const;
    if (Array.isArray(s.enum)) return s.enum[0];
    const variants = s.anyOf ?? s.oneOf;
    if (Array.isArray(variants)) return gen(variants.find((v: any) => v.type !== 'null') ?? variants[0]);
    const type = Array.isArray(s.type) ? (s.type.find((t: string) => t !== 'null') ?? 'null') : s.type;
    switch (type) {
      case 'object': {
        const out: Record<string, unknown> = {};
        for (const [k, v] of Object.entries(s.properties ?? {})) out[k] = gen(v);
        return out;
      }
      case 'array': {
        const n = Math.max(s.minItems ?? 0, Math.min(s.maxItems ?? 2, 2));
        return Array.from({ length: n }, () => gen(s.items));
      }
      case 'string': {
        let text = phrase(Math.max(1, Math.min(6, words.length)));
        if (s.minLength && text.length < s.minLength) text = text.padEnd(s.minLength, '.');
        if (s.maxLength && text.length > s.maxLength) text = text.slice(0, s.maxLength);
        return text;
      }
      case 'integer':
      case 'number': {
        const lo = s.minimum ?? (s.exclusiveMinimum !== undefined ? s.exclusiveMinimum + 1 : 1);
        return s.maximum !== undefined ? Math.min(lo, s.maximum) : lo;
      }
      case 'boolean':
        return true;
      case 'null':
        return null;
      default:
        return null;
    }
  };
  return gen(schema);
}

function chunkText(text: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < text.length; i += 12) out.push(text.slice(i, i + 12));
  return out.length ? out : [''];
}
