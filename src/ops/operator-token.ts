import { createHash, timingSafeEqual } from 'node:crypto';

/**
 * Operator tokens (METRICS_TOKEN, ADMIN_TOKEN) compared in constant time: both sides are hashed to the
 * same length first, so neither the length nor a common prefix of a guess shows in the timing.
 */
export function sameSecret(given: string | null, wanted: string): boolean {
  const a = createHash('sha256')
    .update(given ?? '')
    .digest();
  const b = createHash('sha256').update(wanted).digest();
  return timingSafeEqual(a, b) && given !== null;
}

/** The token in `Authorization: Bearer <token>`, or null. */
export function bearerToken(authorization: string | undefined): string | null {
  return /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '')?.[1] ?? null;
}
