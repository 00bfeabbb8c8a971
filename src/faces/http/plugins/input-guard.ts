import type { FastifyInstance, FastifyRequest } from 'fastify';
import { AppError } from '../../../errors.js';
import { pgRefuses, refusedPath } from '../../../db/pg-text.js';

/**
 * Characters Postgres refuses (U+0000, UTF-16 surrogates without their pair: src/db/pg-text.ts) are
 * refused at the door, before authentication or any query: in the path (`%00` anywhere in it, and the
 * decoded route parameters), the query string and the header values here; in JSON bodies by the body
 * parser (src/faces/http/plugins/json-body.ts). Each is `400 invalid_input` with `reason: "unsupported_character"`
 * and the place in `issues`, never a 500 from a query that failed.
 */

const NUL_ESCAPE = /%00/;

export function unsupportedCharacter(where: Array<string | number>): AppError {
  const place = where.length ? where.join('.') : 'body';
  const message = 'contains U+0000 or an unpaired UTF-16 surrogate, which this service does not accept';
  return new AppError('invalid_input', `Request is invalid: ${place} ${message}`, { reason: 'unsupported_character', issues: [{ path: where, message }] });
}

export function isUnsupportedCharacter(e: unknown): boolean {
  return e instanceof AppError && e.code === 'invalid_input' && e.details.reason === 'unsupported_character';
}

/** The first place in a request's URL, parameters, query or headers that Postgres would refuse, or null. */
export function refusedInRequest(req: FastifyRequest): Array<string | number> | null {
  const path = req.url.split('?')[0] ?? '';
  if (NUL_ESCAPE.test(path) || pgRefuses(path)) return ['path'];
  const params = refusedPath(req.params ?? {});
  if (params) return ['params', ...params];
  // The query as parsed (every value decoded), and the raw query for what a parser might drop.
  const query = refusedPath(req.query ?? {});
  if (query) return ['query', ...query];
  const rawQuery = req.url.includes('?') ? req.url.slice(req.url.indexOf('?') + 1) : '';
  if (NUL_ESCAPE.test(rawQuery) || pgRefuses(rawQuery)) return ['query'];
  for (const [name, value] of Object.entries(req.headers)) {
    if (typeof value === 'string' ? pgRefuses(value) : Array.isArray(value) && value.some(pgRefuses)) return ['headers', name];
  }
  return null;
}

/** Refuses, on every route (and unknown paths), a request whose URL or headers carry such a character. */
export function installInputGuard(app: FastifyInstance): void {
  app.addHook('onRequest', async (req) => {
    const where = refusedInRequest(req);
    if (where) throw unsupportedCharacter(where);
  });
}
