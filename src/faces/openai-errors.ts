import type { ZodErrorMap, ZodIssue, ZodIssueOptionalMessage, ZodTypeAny, z } from 'zod';
import { AppError } from '../errors.js';

/**
 * Errors of the OpenAI-compatible paths in OpenAI's shape, whether OpenAI's SDKs should retry them,
 * and validation that names the offending field the way OpenAI does (`messages[0].content`) in a
 * sentence rather than a zod message.
 */

/** Every path under /v1 answers errors in OpenAI's shape, including paths that do not exist. */
export function isOpenAiPath(url: string): boolean {
  return url === '/v1' || /^\/v1[/?]/.test(url);
}

function openAiErrorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 402) return 'insufficient_quota';
  if (status === 403) return 'permission_error';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/** A field path as OpenAI's errors write it: messages[0].content[1].type. */
export function paramPath(path: ReadonlyArray<string | number>): string {
  return path.reduce<string>((out, p) => (typeof p === 'number' ? `${out}[${p}]` : out ? `${out}.${p}` : p), '');
}

/**
 * `{"error": {"message", "type", "param", "code"}}` as OpenAI's SDKs parse it. `code` and the HTTP
 * status are the service's own (DECISIONS); its extra details (required_plan, retry_after...) come
 * first so they can never overwrite the four fields or the request id.
 */
export function openAiErrorBody(err: AppError, requestId: string) {
  const {
    param,
    issues,
    type: _type,
    request_id: _id,
    ...details
  } = err.details as {
    param?: unknown;
    issues?: Array<{ path?: Array<string | number> }>;
    type?: unknown;
    request_id?: unknown;
  };
  const issuePath = Array.isArray(issues) && issues[0]?.path?.length ? paramPath(issues[0].path) : null;
  return {
    error: {
      ...details,
      ...(issues ? { issues } : {}),
      message: err.message,
      type: openAiErrorType(err.status),
      param: typeof param === 'string' ? param : issuePath,
      code: err.code,
      request_id: requestId,
    },
  };
}

/** Upstream statuses that mean "busy, try again": the model's server was rate limited or overloaded. */
const BUSY_UPSTREAM = new Set([429, 503]);

/**
 * The `x-should-retry` OpenAI's SDKs obey (they otherwise retry every 409, 429 and 5xx twice). Only
 * what a retry can fix says true: a rate or concurrency limit, a request still running under the same
 * Idempotency-Key, a dependency that is briefly away, an upstream model that was busy. A 503 because no
 * model is configured, a failed generation, a refusal or a bad request would fail the same way again.
 */
export function openAiShouldRetry(err: AppError): boolean {
  if (err.status === 429 || err.code === 'idempotency_in_progress') return true;
  if (err.code === 'tool_unavailable') return BUSY_UPSTREAM.has(err.details.upstream_status as number);
  return err.status >= 500 && err.retryable;
}

// ---------------------------------------------------------------------------------------------
// Validation in sentences

/** A path of the value being parsed, or of the request field it stands for. */
type Path = ReadonlyArray<string | number>;

/** How a field is named in sentences and `param`: by its path in the request, unless told otherwise. */
export interface Naming {
  /** The request field a path of the parsed value stands for (a tool input parsed for a chat request). */
  path?: (path: Path) => Path;
  /** A phrase for a field that the request has no single path for. */
  subject?: (path: Path) => string | undefined;
}

const plural = (n: number | bigint, word: string) => `${n} ${word}${n === 1 || n === 1n ? '' : 's'}`;

function sentence(issue: ZodIssueOptionalMessage, naming: Naming, fallback: string): string {
  const s = subjectOf(issue.path, naming);
  switch (issue.code) {
    case 'invalid_type':
      if (issue.received === 'undefined') return `Missing required parameter: ${s}.`;
      return `Invalid type for ${s}: expected ${issue.expected}, but got ${issue.received} instead.`;
    case 'invalid_literal':
      return `Invalid value for ${s}: it must be ${JSON.stringify(issue.expected)}.`;
    case 'invalid_enum_value':
      return `Invalid value for ${s}: ${JSON.stringify(issue.received)}. Supported values are: ${issue.options.map((o) => `'${String(o)}'`).join(', ')}.`;
    case 'unrecognized_keys':
      return `Unrecognized request argument${issue.keys.length > 1 ? 's' : ''} supplied: ${issue.keys.join(', ')}.`;
    case 'invalid_union':
      return unionSentence(issue, naming, fallback);
    case 'too_small':
      if (issue.type === 'array') return `${s} must have at least ${plural(issue.minimum, 'item')}.`;
      if (issue.type === 'string') return `${s} must be at least ${plural(issue.minimum, 'character')} long.`;
      return `${s} must be ${issue.inclusive ? 'at least' : 'greater than'} ${issue.minimum}.`;
    case 'too_big':
      if (issue.type === 'array') return `${s} must have at most ${plural(issue.maximum, 'item')}.`;
      if (issue.type === 'string') return `${s} must be at most ${plural(issue.maximum, 'character')} long.`;
      return `${s} must be ${issue.inclusive ? 'at most' : 'less than'} ${issue.maximum}.`;
    case 'custom':
      return issue.message ? `Invalid value for ${s}: ${issue.message}` : `Invalid value for ${s}.`;
    default:
      return `Invalid value for ${s}: ${fallback}.`;
  }
}

/**
 * A value that fits none of a union's options: the option that explains it best says what is wrong
 * (deepestIssue), else the types the field may have.
 */
function unionSentence(issue: Extract<ZodIssueOptionalMessage, { code: 'invalid_union' }>, naming: Naming, fallback: string): string {
  const inner = issue.unionErrors.flatMap((e) => e.issues);
  // The options' issues were made with the same error map: they are sentences already.
  const deepest = deepestIssue(issue.path, inner);
  if (deepest) return deepest.message;
  const expected = [...new Set(inner.flatMap((i) => (i.code === 'invalid_type' ? [i.expected] : [])))];
  const got = inner.find((i) => i.code === 'invalid_type');
  if (expected.length && got?.code === 'invalid_type') {
    return `Invalid type for ${subjectOf(issue.path, naming)}: expected one of ${expected.join(', ')}, but got ${got.received} instead.`;
  }
  return `Invalid value for ${subjectOf(issue.path, naming)}: ${fallback}.`;
}

function subjectOf(path: Path, naming: Naming): string {
  return naming.subject?.(path) ?? `'${paramPath(naming.path ? naming.path(path) : path) || 'body'}'`;
}

/** The path of the field an issue is about: an unknown key is named itself, not its parent. */
function issuePath(issue: ZodIssue): Path {
  if (issue.code === 'unrecognized_keys' && issue.keys.length) return [...issue.path, issue.keys[0]!];
  if (issue.code === 'invalid_union') {
    const deepest = deepestIssue(
      issue.path,
      issue.unionErrors.flatMap((e) => e.issues),
    );
    if (deepest) return issuePath(deepest);
  }
  return issue.path;
}

/**
 * The option of a union that explains a failure best: one whose type matched (its issue is not a type
 * mismatch at the union's own path, e.g. an empty array where a non-empty one is wanted), the one that
 * got furthest into the value first. Null when every option failed on the value's type.
 */
function deepestIssue(path: Path, issues: ZodIssue[]): ZodIssue | null {
  const matched = issues.filter((i) => i.path.length > path.length || i.code !== 'invalid_type');
  return matched.reduce<ZodIssue | null>((best, i) => (!best || i.path.length > best.path.length ? i : best), null);
}

/**
 * Parses `value` with `schema`; a failure is 400 invalid_input whose message is a sentence about the
 * first failing field, `param` that field's path (or what `param` maps it to), and `issues` every
 * failing field, each in a sentence.
 */
export function parseOpenAi<S extends ZodTypeAny>(schema: S, value: unknown, naming: Naming = {}): z.output<S> {
  const errorMap: ZodErrorMap = (issue, ctx) => ({ message: sentence(issue, naming, ctx.defaultError) });
  const parsed = schema.safeParse(value, { errorMap });
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((i) => {
    const path = issuePath(i);
    return { path: naming.path ? naming.path(path) : path, message: i.message };
  });
  const first = issues[0]!;
  throw new AppError('invalid_input', first.message, { param: paramPath(first.path), issues });
}
