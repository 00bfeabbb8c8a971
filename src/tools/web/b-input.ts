import { z } from 'zod';

/**
 * Input pieces the grabr_* tools (group B) share. This module loads without side effects: the pool
 * threads import modules that import it.
 */

/** Normalises a caller's URL: a bare host gets https, only http(s), no credentials, no fragment. */
export function normaliseWebUrl(raw: string): { ok: true; url: string } | { ok: false; message: string } {
  const trimmed = raw.trim();
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(trimmed) ? trimmed : `https://${trimmed}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    return { ok: false, message: 'not a valid URL' };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    return { ok: false, message: `only http and https URLs can be fetched, not ${url.protocol.replace(/:$/, '')}` };
  }
  if (url.username || url.password) return { ok: false, message: 'URLs with embedded credentials are not fetched' };
  url.hash = '';
  return { ok: true, url: url.href };
}

/** An http(s) URL (a bare host such as "example.com" is fetched over https), normalised. */
export const webUrl = z
  .string()
  .trim()
  .min(1)
  .max(2048)
  .transform((raw, ctx) => {
    const r = normaliseWebUrl(raw);
    if (!r.ok) {
      ctx.addIssue({ code: 'custom', message: r.message });
      return z.NEVER;
    }
    return r.url;
  });

/** Output pieces. */
export const OgSchema = z.record(z.string(), z.string()).describe('og:* meta properties (first value of each)');
