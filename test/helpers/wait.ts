/** Polls `check` until it holds; throws after `timeoutMs` (a liveness bound, far above normal latency). */
export async function waitUntil(check: () => boolean | Promise<boolean>, timeoutMs = 10_000, stepMs = 10): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, stepMs));
  }
}
