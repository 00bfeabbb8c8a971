/**
 * Parsing what the video site sends: the watch page's embedded player response and a json3 caption
 * track. Pure functions, no side effects at load: this module runs in sandbox pool threads (tasks
 * `yt_watch_page` and `yt_json3`, see ./tasks.ts), because the page is large upstream HTML.
 */

/** A caption track as the player response lists it. `kind` is `asr` for automatic (speech recognition) captions. */
export interface CaptionTrack {
  /** The track's URL as given by the page (absolute or relative); only followed on YOUTUBE_BASE_URL's origin. */
  base_url: string;
  /** BCP 47 tag as given (e.g. "en", "en-GB", "pt-BR"). */
  language: string;
  kind: 'manual' | 'asr';
  /** Display name (e.g. "English (auto-generated)"). */
  name: string;
}

export interface VideoDetails {
  video_id: string;
  title: string;
  channel: string;
  channel_id: string | null;
  /** null when the page does not say (live streams say 0). */
  duration_s: number | null;
  views: number | null;
  description: string;
  /** The uploader's tags. */
  tags: string[];
  is_live: boolean;
}

export interface WatchPage {
  /** The page embeds a player response (false: the layout was not recognised, or a consent or bot page). */
  found: boolean;
  /** playabilityStatus: OK, ERROR (no such video), LOGIN_REQUIRED, UNPLAYABLE, LIVE_STREAM_OFFLINE... */
  playability: { status: string; reason: string | null } | null;
  details: VideoDetails | null;
  tracks: CaptionTrack[];
}

export interface WatchPageInput {
  /** The page's bytes (UTF-8). */
  body: Uint8Array;
}

const MAX_TRACKS = 100;
const MAX_DESCRIPTION_CHARS = 10_000;
const MAX_TITLE_CHARS = 1_000;
const MAX_TAGS = 100;

/** yt_watch_page: the player response of a watch page, reduced to what the media tools use. */
export function parseWatchPageTask({ body }: WatchPageInput): WatchPage {
  const html = new TextDecoder('utf-8').decode(body);
  const player = extractPlayerResponse(html);
  if (!player) return { found: false, playability: null, details: null, tracks: [] };
  return { found: true, playability: playabilityOf(player), details: detailsOf(player), tracks: tracksOf(player) };
}

/**
 * The JSON object assigned to `ytInitialPlayerResponse` in the page's scripts (`var ytInitialPlayerResponse = {...};`
 * or `window["ytInitialPlayerResponse"] = {...}`). The object's end is found by matching braces outside
 * JSON strings, so the text after it (`;var meta = ...`, `</script>`) does not matter. null when absent
 * or not JSON.
 */
export function extractPlayerResponse(html: string): Record<string, unknown> | null {
  const marker = /ytInitialPlayerResponse["'\]]{0,2}\s*=\s*\{/g;
  for (let m = marker.exec(html); m; m = marker.exec(html)) {
    const open = m.index + m[0].length - 1;
    const close = matchBrace(html, open);
    if (close < 0) return null;
    try {
      const value: unknown = JSON.parse(html.slice(open, close + 1));
      if (value && typeof value === 'object' && !Array.isArray(value)) return value as Record<string, unknown>;
    } catch {
      // Not JSON (say, a script that builds the object): try the next assignment.
    }
    marker.lastIndex = close + 1;
  }
  return null;
}

/** Index of the `}` that closes the `{` at `open`, skipping JSON strings; -1 when it never closes. */
function matchBrace(s: string, open: number): number {
  let depth = 0;
  for (let i = open; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x22 /* " */) {
      for (i++; i < s.length; i++) {
        const d = s.charCodeAt(i);
        if (d === 0x5c /* \ */) i++;
        else if (d === 0x22) break;
      }
    } else if (c === 0x7b /* { */) depth++;
    else if (c === 0x7d /* } */) {
      depth--;
      if (depth === 0) return i;
    }
  }
  return -1;
}

const obj = (v: unknown): Record<string, unknown> | null => (v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null);
const str = (v: unknown): string | null => (typeof v === 'string' ? v : null);

/** A count or duration that the page writes as a decimal string ("213", "1234567"). */
function count(v: unknown): number | null {
  const s = typeof v === 'number' ? String(v) : str(v);
  if (s === null || !/^\d{1,15}$/.test(s)) return null;
  return Number(s);
}

/** YouTube's text objects: `{simpleText}` or `{runs: [{text}]}`. */
function textOf(v: unknown): string {
  const o = obj(v);
  if (!o) return str(v) ?? '';
  if (typeof o['simpleText'] === 'string') return o['simpleText'];
  if (Array.isArray(o['runs'])) return o['runs'].map((r) => str(obj(r)?.['text']) ?? '').join('');
  return '';
}

function playabilityOf(player: Record<string, unknown>): WatchPage['playability'] {
  const p = obj(player['playabilityStatus']);
  if (!p) return null;
  return { status: str(p['status']) ?? 'UNKNOWN', reason: str(p['reason'])?.slice(0, 500) ?? null };
}

function detailsOf(player: Record<string, unknown>): VideoDetails | null {
  const d = obj(player['videoDetails']);
  if (!d) return null;
  const videoId = str(d['videoId']);
  if (!videoId) return null;
  const tags = Array.isArray(d['keywords'])
    ? d['keywords']
        .filter((k): k is string => typeof k === 'string')
        .slice(0, MAX_TAGS)
        .map((k) => k.slice(0, 200))
    : [];
  return {
    video_id: videoId.slice(0, 64),
    title: (str(d['title']) ?? '').slice(0, MAX_TITLE_CHARS),
    channel: (str(d['author']) ?? '').slice(0, MAX_TITLE_CHARS),
    channel_id: str(d['channelId'])?.slice(0, 64) ?? null,
    duration_s: count(d['lengthSeconds']),
    views: count(d['viewCount']),
    description: (str(d['shortDescription']) ?? '').slice(0, MAX_DESCRIPTION_CHARS),
    tags,
    is_live: d['isLiveContent'] === true,
  };
}

function tracksOf(player: Record<string, unknown>): CaptionTrack[] {
  const list = obj(obj(player['captions'])?.['playerCaptionsTracklistRenderer'])?.['captionTracks'];
  if (!Array.isArray(list)) return [];
  const out: CaptionTrack[] = [];
  for (const raw of list.slice(0, MAX_TRACKS)) {
    const t = obj(raw);
    const baseUrl = str(t?.['baseUrl']);
    const language = str(t?.['languageCode']);
    if (!t || !baseUrl || !language || baseUrl.length > 2048 || !/^[A-Za-z0-9-]{1,35}$/.test(language)) continue;
    out.push({ base_url: baseUrl, language, kind: t['kind'] === 'asr' ? 'asr' : 'manual', name: textOf(t['name']).slice(0, 200) || language });
  }
  return out;
}

export interface Json3Input {
  body: Uint8Array;
  /** The pool's result cap (TOOL_MAX_RESULT_BYTES): the segments stop before their JSON would pass it. */
  max_result_bytes: number;
}

export interface Json3Output {
  /** Segment starts and durations in seconds (millisecond precision), and texts, in the track's order. */
  starts: number[];
  durs: number[];
  texts: string[];
  /** The track passed MAX_TRANSCRIPT_CHARS, MAX_SEGMENTS or the result cap: the segments after that are left out. */
  truncated: boolean;
}

/** Transcript caps: the text stays within the catalogue's 400k characters and the pool's 1 MB result. */
export const MAX_TRANSCRIPT_CHARS = 400_000;
export const MAX_SEGMENTS = 20_000;

/**
 * yt_json3: a json3 caption track, `{events: [{tStartMs, dDurationMs, segs: [{utf8}]}]}`, as segments.
 * An event's text is its segs joined, line breaks as spaces, white space collapsed; events without
 * text (window and style events, the line breaks of automatic captions) are left out. null when the
 * body is not a json3 track.
 */
export function parseJson3Task({ body, max_result_bytes }: Json3Input): Json3Output | null {
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder('utf-8').decode(body));
  } catch {
    return null;
  }
  const events = obj(doc)?.['events'];
  if (!Array.isArray(events)) return null;
  const out: Json3Output = { starts: [], durs: [], texts: [], truncated: false };
  let chars = 0;
  // The result's JSON, as the pool measures it (UTF-8 bytes), with room for its keys and the envelope.
  let bytes = 200;
  for (const raw of events) {
    const e = obj(raw);
    if (!e || !Array.isArray(e['segs'])) continue;
    const text = e['segs']
      .map((s) => str(obj(s)?.['utf8']) ?? '')
      .join('')
      .replace(/\s+/g, ' ')
      .trim();
    if (!text) continue;
    const start = Math.round(typeof e['tStartMs'] === 'number' && Number.isFinite(e['tStartMs']) ? Math.max(0, e['tStartMs']) : 0) / 1000;
    const dur = Math.round(typeof e['dDurationMs'] === 'number' && Number.isFinite(e['dDurationMs']) ? Math.max(0, e['dDurationMs']) : 0) / 1000;
    const cost = Buffer.byteLength(JSON.stringify(text)) + String(start).length + String(dur).length + 3;
    if (out.texts.length >= MAX_SEGMENTS || chars + text.length > MAX_TRANSCRIPT_CHARS || bytes + cost > max_result_bytes) {
      out.truncated = true;
      break;
    }
    chars += text.length + 1;
    bytes += cost;
    out.starts.push(start);
    out.durs.push(dur);
    out.texts.push(text);
  }
  return out;
}

/** A chapter line of a description: a timestamp and a title. */
export interface DescriptionChapter {
  start: number;
  title: string;
}

const STAMP = String.raw`(?:(\d{1,2}):)?(\d{1,2}):(\d{2})`;
/** `0:00 Intro`, `[01:02] Setup`, `1:02:03 - Part two`, `• 3:15 — Q&A` (timestamp first)... */
const LEAD = new RegExp(String.raw`^\s*(?:[-*•▶►]\s*)?[\[(]?${STAMP}[\])]?\s*(?:[-–—:|.)]\s*)?(.+?)\s*$`);
/** ...or `Intro - 0:00`, `Setup (1:02)` (timestamp last). */
const TRAIL = new RegExp(String.raw`^\s*(?:[-*•▶►]\s*)?(.+?)\s*(?:[-–—:|]\s*)?[\[(]?${STAMP}[\])]?\s*$`);

/**
 * Chapters written in a description, YouTube's way: one per line, a timestamp (m:ss, mm:ss or
 * h:mm:ss) at the start of the line (or at its end, lines with a URL aside), then the title. The list
 * starts at the first 0:00 line (or the first timestamped line when none is 0:00) and runs while the
 * times ascend and stay within the video's duration (when known); it counts with two or more
 * chapters, otherwise there are none ([]).
 */
export function descriptionChapters(description: string, durationS: number | null): DescriptionChapter[] {
  const found: DescriptionChapter[] = [];
  for (const line of description.split(/\r?\n/)) {
    if (line.length > 300) continue;
    let m = LEAD.exec(line);
    let h: string | undefined, mm: string, ss: string, title: string;
    if (m) [, h, mm, ss, title] = m as unknown as [string, string | undefined, string, string, string];
    else if (!line.includes('://') && (m = TRAIL.exec(line))) [, title, h, mm, ss] = m as unknown as [string, string, string | undefined, string, string];
    else continue;
    const minutes = Number(mm);
    const seconds = Number(ss);
    if (seconds > 59 || (h !== undefined && minutes > 59)) continue;
    const start = Number(h ?? 0) * 3600 + minutes * 60 + seconds;
    const clean = title.replace(/^[-–—:|.\s]+|[-–—:|\s]+$/g, '').trim();
    if (!clean || /^\d{1,2}(:\d{2}){1,2}$/.test(clean)) continue;
    found.push({ start, title: clean.slice(0, 200) });
  }
  const zero = found.findIndex((c) => c.start === 0);
  const out: DescriptionChapter[] = [];
  for (const c of found.slice(Math.max(0, zero))) {
    if (out.length && c.start <= out[out.length - 1]!.start) break;
    if (durationS !== null && durationS > 0 && c.start >= durationS) break;
    out.push(c);
  }
  return out.length >= 2 ? out : [];
}
