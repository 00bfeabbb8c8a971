import { request } from 'undici';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { runTask } from '../tasks.js';
import type { ToolContext } from '../types.js';
import type { CaptionTrack, VideoDetails } from './parse.js';

/**
 * The video site's client for grabr_transcript and grabr_video_intel, on the worker's event loop: it
 * reads `YOUTUBE_BASE_URL/watch?v=<id>`, hands the page to the pool (task yt_watch_page) for its
 * player response, picks a caption track, and reads it as json3 (task yt_json3).
 *
 * YOUTUBE_BASE_URL is the operator's choice (it may be a local stand-in), so requests go straight
 * through undici rather than the SSRF guard; what the page itself names is not trusted: a track's
 * URL is followed only on YOUTUBE_BASE_URL's origin. No redirects are followed. Each request has
 * WEB_FETCH_TIMEOUT_MS and a 5 MiB cap. Failures of the site are 503 tool_unavailable (uncharged);
 * a video that does not exist is 404 not_found; a video without a track in the wanted languages is
 * 404 no_captions.
 */

export const MAX_PAGE_BYTES = 5 * 1024 * 1024;
export const MAX_TRACK_BYTES = 5 * 1024 * 1024;

const ID = /^[A-Za-z0-9_-]{11}$/;
const HOSTS = new Set(['youtube.com', 'youtube-nocookie.com']);
const ID_PATHS = new Set(['shorts', 'embed', 'live', 'v', 'e']);

/** The 11-character id of a video URL (youtube.com/watch?v=, youtu.be/, /shorts/, /embed/, /live/) or of a bare id; null otherwise. */
export function videoIdOf(raw: string): string | null {
  const s = raw.trim();
  if (ID.test(s)) return s;
  let url: URL;
  try {
    url = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(s) ? s : `https://${s}`);
  } catch {
    return null;
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') return null;
  const host = url.hostname.toLowerCase().replace(/^(www|m|music)\./, '');
  const parts = url.pathname.split('/').filter(Boolean);
  let id: string | null | undefined = null;
  if (host === 'youtu.be') id = parts[0];
  else if (HOSTS.has(host)) {
    if (parts[0] === 'watch') id = url.searchParams.get('v');
    else if (parts[0] && ID_PATHS.has(parts[0])) id = parts[1];
  }
  return id && ID.test(id) ? id : null;
}

/** The `video` input field: a URL or an id, given as the id. */
export const VideoField = z
  .string()
  .trim()
  .min(1)
  .max(2048)
  .describe('The video: a YouTube URL (youtube.com/watch?v=…, youtu.be/…, /shorts/…, /embed/…, /live/…) or its 11-character id')
  .transform((raw, ctx) => {
    const id = videoIdOf(raw);
    if (!id) {
      ctx.addIssue({ code: 'custom', message: 'not a YouTube video URL or 11-character video id' });
      return z.NEVER;
    }
    return id;
  });

export const LangsField = z
  .array(
    z
      .string()
      .trim()
      .regex(/^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,3}$/, 'a language tag such as "en", "en-GB" or "pt-BR"'),
  )
  .min(1)
  .max(10)
  .optional()
  .describe(
    'Caption languages wanted, best first (BCP 47: "en" also matches "en-GB"). Only these are used; none available is 404 no_captions. ' +
      'Default: English if there is a track for it, else the spoken language (that of the automatic track), else the first listed.',
  );

export const PreferField = z
  .enum(['manual', 'asr'])
  .default('manual')
  .describe('Within a language, uploaded captions (manual, the default) or automatic speech recognition (asr) first; the other kind is the fallback');

export type Prefer = 'manual' | 'asr';

export interface Segment {
  start: number;
  dur: number;
  text: string;
}

export interface LoadedVideo {
  video_id: string;
  details: VideoDetails | null;
  tracks: CaptionTrack[];
}

export interface LoadedTranscript {
  track: CaptionTrack;
  segments: Segment[];
  /** The track was longer than the transcript caps (400,000 characters, 20,000 segments, or TOOL_MAX_RESULT_BYTES of JSON). */
  truncated: boolean;
}

function unavailable(why: string, details: Record<string, unknown> = {}): AppError {
  return new AppError('tool_unavailable', `The video site failed: ${why}. Nothing was charged.`, details);
}

function baseOf(ctx: ToolContext): URL {
  const base = ctx.config.YOUTUBE_BASE_URL;
  // Checked at admission (needs: ['youtube']); a direct handler call without it gets the same answer.
  if (!base)
    throw new AppError('tool_unavailable', 'The media tools are not available on this service: YOUTUBE_BASE_URL is not configured. Nothing was charged.', {
      needs: ['youtube'],
    });
  return new URL(base.endsWith('/') ? base : `${base}/`);
}

/** GET with the call's signal, WEB_FETCH_TIMEOUT_MS and a byte cap; no redirects. */
async function get(url: URL, what: string, maxBytes: number, ctx: ToolContext): Promise<{ status: number; body: Buffer; retryAfter: number | null }> {
  const timeoutMs = ctx.config.WEB_FETCH_TIMEOUT_MS;
  const signal = AbortSignal.any([ctx.signal, AbortSignal.timeout(timeoutMs)]);
  try {
    const res = await request(url, {
      method: 'GET',
      signal,
      headers: {
        'user-agent': ctx.config.GRABR_USER_AGENT,
        'accept-language': 'en-US,en;q=0.9',
        accept: what === 'watch page' ? 'text/html,application/xhtml+xml' : 'application/json',
      },
    });
    const retryAfter = String(res.headers['retry-after'] ?? '');
    const status = res.statusCode;
    if (status !== 200) {
      // Only the status matters: the error page is not read.
      await res.body.dump();
      return { status, body: Buffer.alloc(0), retryAfter: /^\d{1,5}$/.test(retryAfter) ? Number(retryAfter) : null };
    }
    const declared = Number(res.headers['content-length']);
    if (Number.isFinite(declared) && declared > maxBytes) {
      res.body.destroy();
      throw unavailable(`the ${what} is larger than ${maxBytes / 1024 / 1024} MiB`);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > maxBytes) {
        res.body.destroy();
        throw unavailable(`the ${what} is larger than ${maxBytes / 1024 / 1024} MiB`);
      }
      chunks.push(chunk);
    }
    return { status, body: Buffer.concat(chunks), retryAfter: null };
  } catch (e) {
    if (e instanceof AppError) throw e;
    if (ctx.signal.aborted) throw new AppError('timeout', `The call was stopped while the video site sent the ${what}`);
    if (signal.aborted) throw unavailable(`no ${what} within ${timeoutMs} ms`);
    throw unavailable(`the ${what} could not be read (${(e as { code?: string }).code ?? (e as Error).message})`);
  }
}

/** The site's refusal as 503; a 429's Retry-After (seconds) is passed on as `retry_after` (and the Retry-After header). */
function statusError(status: number, what: string, retryAfter: number | null = null): AppError {
  if (status === 429)
    return unavailable(`the site is rate limiting (429 for the ${what})`, {
      upstream_status: status,
      ...(retryAfter !== null ? { retry_after: retryAfter } : {}),
    });
  if (status >= 300 && status < 400) return unavailable(`the ${what} redirected (${status}); redirects are not followed`, { upstream_status: status });
  return unavailable(`the ${what} answered ${status}`, { upstream_status: status });
}

/** Reads and parses the watch page: the video's details and caption tracks. */
export async function loadVideo(videoId: string, ctx: ToolContext): Promise<LoadedVideo> {
  const base = baseOf(ctx);
  const url = new URL('watch', base);
  url.searchParams.set('v', videoId);
  await ctx.progress({ stage: 'fetching', message: 'watch page', done: 0, total: 3 });
  const page = await get(url, 'watch page', MAX_PAGE_BYTES, ctx);
  if (page.status === 404 || page.status === 410) throw new AppError('not_found', `No video ${videoId} on the video site`, { video_id: videoId });
  if (page.status !== 200) throw statusError(page.status, 'watch page', page.retryAfter);
  await ctx.progress({ stage: 'parsing', message: 'watch page', done: 1, total: 3 });
  const parsed = await runTask(ctx, 'yt_watch_page', { body: page.body });
  if (!parsed.found)
    throw unavailable('the watch page has no player response (a consent or bot-check page, or a layout this service does not read)', { reason: 'page_layout' });
  const status = parsed.playability?.status ?? 'OK';
  if (status === 'ERROR') {
    throw new AppError('not_found', `Video ${videoId} is not available: ${parsed.playability?.reason ?? 'the site says it does not exist'}`, {
      video_id: videoId,
    });
  }
  if ((status !== 'OK' || !parsed.details) && !parsed.tracks.length) {
    // LOGIN_REQUIRED ("confirm you're not a bot", private, age-restricted), UNPLAYABLE, LIVE_STREAM_OFFLINE...:
    // the site hides the tracks, so whether the video has captions is unknown; not a no_captions answer.
    throw unavailable(`the site did not show video ${videoId} (${status}${parsed.playability?.reason ? `: ${parsed.playability.reason}` : ''})`, {
      playability: status,
    });
  }
  return { video_id: videoId, details: parsed.details, tracks: parsed.tracks };
}

const primary = (tag: string) => tag.toLowerCase().split('-')[0]!;

/**
 * The track to read. With `langs`: for each language in order, tracks whose tag equals it, then
 * tracks of the same primary language ("en" ↔ "en-GB"); within those, the preferred kind first, then
 * page order. Without: English, else the spoken language (the automatic track's), else the first
 * track, with the same kind order. null when nothing matches.
 */
export function selectTrack(tracks: CaptionTrack[], langs: string[] | undefined, prefer: Prefer): CaptionTrack | null {
  if (!tracks.length) return null;
  const kindRank = (t: CaptionTrack) => (t.kind === prefer ? 0 : 1);
  const pick = (candidates: CaptionTrack[]) =>
    candidates.length ? [...candidates].sort((a, b) => kindRank(a) - kindRank(b) || tracks.indexOf(a) - tracks.indexOf(b))[0]! : null;
  if (langs) {
    for (const lang of langs) {
      const want = lang.toLowerCase();
      const exact = pick(tracks.filter((t) => t.language.toLowerCase() === want));
      if (exact) return exact;
      const near = pick(tracks.filter((t) => primary(t.language) === primary(want)));
      if (near) return near;
    }
    return null;
  }
  const spoken = tracks.find((t) => t.kind === 'asr');
  const order = ['en', ...(spoken ? [primary(spoken.language)] : [])];
  for (const lang of order) {
    const found = pick(tracks.filter((t) => primary(t.language) === lang));
    if (found) return found;
  }
  return pick(tracks);
}

/** 404 no_captions, with the languages the video does have. */
export function noCaptions(video: LoadedVideo, langs: string[] | undefined): AppError {
  const available = video.tracks.map((t) => `${t.language}${t.kind === 'asr' ? ' (auto)' : ''}`);
  const message = video.tracks.length
    ? `Video ${video.video_id} has no captions in ${langs!.join(', ')}; it has ${available.join(', ')}. Nothing was charged.`
    : `Video ${video.video_id} has no captions. Nothing was charged.`;
  return new AppError('no_captions', message, { video_id: video.video_id, available_languages: [...new Set(video.tracks.map((t) => t.language))] });
}

/** Reads a track as json3. Its URL must be on YOUTUBE_BASE_URL's origin; an empty 200 is the proof-of-origin gate (503). */
export async function loadTrack(track: CaptionTrack, ctx: ToolContext): Promise<LoadedTranscript> {
  const base = baseOf(ctx);
  let url: URL;
  try {
    url = new URL(track.base_url, base);
  } catch {
    throw unavailable('the caption track has no valid URL', { reason: 'caption_url' });
  }
  if (url.origin !== base.origin) {
    // The page named another host: not followed, whatever it is.
    throw unavailable(`the caption track points outside the configured site (${url.protocol}//${url.host}); it was not fetched`, { reason: 'caption_origin' });
  }
  url.searchParams.set('fmt', 'json3');
  await ctx.progress({ stage: 'fetching', message: 'captions', done: 2, total: 3 });
  const res = await get(url, 'caption track', MAX_TRACK_BYTES, ctx);
  if (res.status !== 200) throw statusError(res.status, 'caption track', res.retryAfter);
  if (res.body.length === 0) {
    throw unavailable('the caption track came back empty (the site requires a proof-of-origin token from a browser player)', { reason: 'empty_captions' });
  }
  const parsed = await runTask(ctx, 'yt_json3', { body: res.body, max_result_bytes: ctx.config.TOOL_MAX_RESULT_BYTES });
  if (!parsed) throw unavailable('the caption track is not json3', { reason: 'caption_format' });
  await ctx.progress({ stage: 'parsed', message: 'captions', done: 3, total: 3 });
  const segments = parsed.texts.map((text, i) => ({ start: parsed.starts[i]!, dur: parsed.durs[i]!, text }));
  return { track, segments, truncated: parsed.truncated };
}
