import type { FastifyInstance, FastifyRequest } from 'fastify';
import { AppError, isAppError } from '../../../errors.js';
import { refusedPath } from '../../../db/pg-text.js';
import { unsupportedCharacter } from './input-guard.js';

const OPEN_BRACE = 0x7b; // {
const OPEN_BRACKET = 0x5b; // [
const CLOSE_BRACE = 0x7d; // }
const CLOSE_BRACKET = 0x5d; // ]
const QUOTE = 0x22; // "
const BACKSLASH = 0x5c; // \

/**
 * Whether a JSON text nests arrays and objects deeper than `max`. It runs on the raw text before any
 * parsing: everything downstream that walks a body recursively (request fingerprints for
 * Idempotency-Key, validation, the MCP SDK) would otherwise overflow the stack on a body that
 * JSON.parse still accepts. Brackets inside strings do not count; malformed text is left to the parser.
 */
export function nestsDeeperThan(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) {
      inString = true;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > max) return true;
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      depth--;
    }
  }
  return false;
}

export function jsonTooDeepError(max: number): AppError {
  return new AppError('invalid_input', `JSON body nests deeper than ${max} levels`, { max_depth: max });
}

export function isJsonTooDeep(e: unknown): boolean {
  return isAppError(e) && e.code === 'invalid_input' && typeof e.details.max_depth === 'number';
}

type Done = (err: Error | null, body?: unknown) => void;
export type JsonBodyParser = (req: FastifyRequest, body: string, done: Done) => void;

/** An escape JSON.parse turns into U+0000 or a surrogate (raw control characters are already a syntax error). */
const SUSPECT_ESCAPE = /\\u(0000|[dD][89a-fA-F])/;

/**
 * The one JSON body parser: the depth cap, then Fastify's own parser, which keeps its prototype- and
 * constructor-poisoning protection (a body with `__proto__` or `constructor.prototype` is refused)
 * and its error codes for empty and malformed bodies; then characters Postgres refuses (U+0000, an
 * unpaired surrogate: src/db/pg-text.ts) anywhere in a key or string are `400 invalid_input`, tool
 * inputs included, so none reaches a query (only bodies with such an escape in their text are walked).
 */
export function jsonBodyParser(app: FastifyInstance, maxDepth: number): JsonBodyParser {
  const parse = app.getDefaultJsonParser('error', 'error');
  return (req, body, done) => {
    if (nestsDeeperThan(body, maxDepth)) return done(jsonTooDeepError(maxDepth));
    if (!SUSPECT_ESCAPE.test(body)) return parse(req, body, done);
    // Fastify's parser is callback-style here (its type also allows a promise, which it never returns).
    void parse(req, body, (err, value) => {
      if (err) return done(err);
      const where = refusedPath(value);
      return where ? done(unsupportedCharacter(['body', ...where])) : done(null, value);
    });
  };
}

/** Replaces the application/json parser of `app` and the plugins registered in it afterwards. */
export function installJsonBodyParser(app: FastifyInstance, maxDepth: number): void {
  const parse = jsonBodyParser(app, maxDepth);
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (req, body, done) => parse(req, body as string, done));
}
