import type { ZodError, ZodTypeAny, z } from 'zod';
import { AppError } from '../errors.js';

/** A zod failure as the envelope's `invalid_input`, naming each failing field. */
export function invalidInput(error: ZodError, what = 'Request is invalid'): AppError {
  const issues = error.issues.map((i) => ({ path: i.path, message: i.message }));
  const first = issues[0];
  const where = first && first.path.length ? `${first.path.join('.')}: ` : '';
  return new AppError('invalid_input', `${what}: ${where}${first?.message ?? 'invalid'}`, { issues });
}

export function parseOrThrow<S extends ZodTypeAny>(schema: S, value: unknown, what?: string): z.output<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw invalidInput(parsed.error, what);
  return parsed.data;
}
