import { z } from 'zod';
import { defineTool } from '../types.js';
import { LangsField, loadTrack, loadVideo, noCaptions, PreferField, selectTrack, VideoField, type Segment } from './youtube.js';

/**
 * grabr_transcript: a video's captions from the video site at YOUTUBE_BASE_URL (see ./youtube.ts):
 * the watch page's caption tracks, one picked by language and kind, read as json3. `text` renders the
 * segments in the chosen format; `segments` are always there.
 */

export const FORMATS = ['text', 'timestamped', 'srt', 'vtt'] as const;
export type TranscriptFormat = (typeof FORMATS)[number];

const Input = z.object({
  video: VideoField,
  langs: LangsField,
  prefer: PreferField,
  format: z
    .enum(FORMATS)
    .default('text')
    .describe('How `text` renders the segments: text (one paragraph), timestamped ("[m:ss] line" per segment), srt or vtt subtitles'),
});

const Track = z.object({ language: z.string(), kind: z.enum(['manual', 'asr']), name: z.string() });

export const TranscriptOutput = z.object({
  video_id: z.string(),
  title: z.string().nullable(),
  language: z.string(),
  kind: z.enum(['manual', 'asr']),
  format: z.enum(FORMATS),
  segments: z.array(z.object({ start: z.number().nonnegative(), dur: z.number().nonnegative(), text: z.string().min(1) })),
  text: z.string(),
  tracks: z.array(Track),
  truncated: z.boolean(),
});
export type TranscriptOutput = z.infer<typeof TranscriptOutput>;

export const grabrTranscript = defineTool({
  name: 'grabr_transcript',
  description:
    "A video's captions (uploaded or automatic) as timed segments and text, in the language and kind asked for. Needs YOUTUBE_BASE_URL (off by default: YouTube's terms restrict automated access).",
  tier: 'enterprise',
  priceCents: 8,
  family: 'media',
  input: Input,
  qField: 'video',
  qParse: 'text',
  needs: ['youtube'],
  progress: true,
  output:
    '{video_id, title, language, kind: manual|asr, format, segments[{start,dur,text}] (seconds), text (rendered in format), tracks[{language,kind,name}], truncated}; ' +
    'no track in the languages asked for: 404 no_captions; the site down, failing, gating captions (empty body) or naming another host: 503 tool_unavailable; never charged on failure',
  outputSchema: TranscriptOutput,
  examples: [
    { video: 'https://www.youtube.com/watch?v=jNQXAC9IVRw' },
    { video: 'https://youtu.be/jNQXAC9IVRw', langs: ['en', 'de'], prefer: 'asr', format: 'srt' },
  ],
  // The page and the track are parsed in the pool (tasks yt_watch_page, yt_json3) under these limits.
  limits: { timeMs: 20_000, memoryMb: 512 },
  handler: async (input, ctx): Promise<TranscriptOutput> => {
    const video = await loadVideo(input.video, ctx);
    const track = selectTrack(video.tracks, input.langs, input.prefer);
    if (!track) throw noCaptions(video, input.langs);
    const { segments, truncated } = await loadTrack(track, ctx);
    return {
      video_id: video.video_id,
      title: video.details?.title ?? null,
      language: track.language,
      kind: track.kind,
      format: input.format,
      segments,
      text: render(segments, input.format),
      tracks: video.tracks.map((t) => ({ language: t.language, kind: t.kind, name: t.name })),
      truncated,
    };
  },
});

/** `m:ss`, or `h:mm:ss` from an hour on. */
export function clock(seconds: number): string {
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, '0');
  return h ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

/** `hh:mm:ss<sep>mmm`, subtitle style. */
function cue(seconds: number, sep: ',' | '.'): string {
  const ms = Math.round(seconds * 1000);
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = Math.floor((ms % 60_000) / 1000);
  const pad = (n: number, w = 2) => String(n).padStart(w, '0');
  return `${pad(h)}:${pad(m)}:${pad(s)}${sep}${pad(ms % 1000, 3)}`;
}

/** A segment's end: start + dur, or the next segment's start when the track gives no duration. */
function endOf(segments: Segment[], i: number): number {
  const s = segments[i]!;
  if (s.dur > 0) return s.start + s.dur;
  return Math.max(s.start, segments[i + 1]?.start ?? s.start);
}

/** A cue's text may not contain the timing arrow. */
const cueText = (text: string) => text.replace(/-->/g, '->');

export function render(segments: Segment[], format: TranscriptFormat): string {
  switch (format) {
    case 'text':
      return segments.map((s) => s.text).join(' ');
    case 'timestamped':
      return segments.map((s) => `[${clock(s.start)}] ${s.text}`).join('\n');
    case 'srt':
      return segments.map((s, i) => `${i + 1}\n${cue(s.start, ',')} --> ${cue(endOf(segments, i), ',')}\n${cueText(s.text)}\n`).join('\n');
    case 'vtt':
      return `WEBVTT\n\n${segments.map((s, i) => `${cue(s.start, '.')} --> ${cue(endOf(segments, i), '.')}\n${cueText(s.text)}\n`).join('\n')}`;
  }
}
