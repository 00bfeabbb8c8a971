import { z } from 'zod';
import { runTask } from '../tasks.js';
import { defineTool } from '../types.js';
import { LangsField, loadTrack, loadVideo, noCaptions, PreferField, selectTrack, VideoField, type LoadedTranscript } from './youtube.js';

/**
 * grabr_video_intel: a video's metadata plus an analysis of its transcript, computed in code (task
 * yt_intel, ./analyse.ts): chapters (the description's timestamps, else lexical segmentation of the
 * transcript), TF-IDF keywords, named entities, an extractive summary (TextRank) and words per minute.
 *
 * A video without captions in the wanted languages is a fact about the video, not a failure: by
 * default the call still answers with the metadata, the description's chapters, keywords and entities
 * of the title and description, and `transcript.available: false` (reason no_captions). With
 * `require_captions: true` it is 404 no_captions instead, uncharged. Failures of the site (down, 5xx,
 * the empty-caption gate) are always 503 tool_unavailable, uncharged.
 */

const Input = z.object({
  video: VideoField,
  langs: LangsField,
  prefer: PreferField,
  require_captions: z
    .boolean()
    .default(false)
    .describe('Fail with 404 no_captions (uncharged) when the video has no captions in the wanted languages, instead of answering from metadata alone'),
  max_keywords: z.number().int().min(1).max(50).default(15).describe('Keywords to return (1-50, default 15)'),
  summary_sentences: z.number().int().min(1).max(20).default(5).describe('Sentences in the summary (1-20, default 5)'),
});

const Chapter = z.object({
  start: z.number().nonnegative(),
  end: z.number().nonnegative().nullable(),
  title: z.string().min(1),
  summary: z.string().nullable(),
});

export const VideoIntelOutput = z.object({
  video: z.object({
    id: z.string(),
    title: z.string().nullable(),
    channel: z.string().nullable(),
    duration_s: z.number().int().nonnegative().nullable(),
    views: z.number().int().nonnegative().nullable(),
  }),
  transcript: z.object({
    available: z.boolean(),
    language: z.string().nullable(),
    kind: z.enum(['manual', 'asr']).nullable(),
    /** Why there is none: no_captions. */
    reason: z.enum(['no_captions']).nullable(),
    truncated: z.boolean(),
    /** Every caption language the video has (to ask again with `langs`). */
    available_languages: z.array(z.string()),
  }),
  chapters: z.array(Chapter),
  chapters_source: z.enum(['description', 'transcript', 'none']),
  keywords: z.array(z.object({ term: z.string(), score: z.number().min(0).max(1), count: z.number().int().positive() })),
  entities: z.array(z.object({ text: z.string(), type: z.enum(['person', 'organisation', 'place']), count: z.number().int().positive() })),
  summary: z.string(),
  summary_source: z.enum(['transcript', 'description', 'none']),
  stats: z.object({ words: z.number().int().nonnegative(), wpm: z.number().nonnegative().nullable() }),
});
export type VideoIntelOutput = z.infer<typeof VideoIntelOutput>;

export const grabrVideoIntel = defineTool({
  name: 'grabr_video_intel',
  description:
    "A video's metadata, chapters, keywords, named entities, extractive summary and speaking rate, computed from its page and captions without a model. Needs YOUTUBE_BASE_URL (off by default: YouTube's terms restrict automated access).",
  tier: 'enterprise',
  priceCents: 12,
  family: 'media',
  input: Input,
  qField: 'video',
  qParse: 'text',
  needs: ['youtube'],
  progress: true,
  output:
    '{video{id,title,channel,duration_s,views}, transcript{available,language,kind,reason,truncated,available_languages}, chapters[{start,end,title,summary}], chapters_source: description|transcript|none, ' +
    'keywords[{term,score,count}], entities[{text,type: person|organisation|place,count}], summary, summary_source: transcript|description|none, stats{words,wpm}}; ' +
    'no captions: answered from metadata with transcript.available false (or 404 no_captions with require_captions); the site failing: 503 tool_unavailable, uncharged',
  outputSchema: VideoIntelOutput,
  examples: [
    { video: 'https://www.youtube.com/watch?v=jNQXAC9IVRw' },
    { video: 'jNQXAC9IVRw', langs: ['en'], require_captions: true, max_keywords: 10, summary_sentences: 3 },
  ],
  // Parsing and the analysis run in the pool (tasks yt_watch_page, yt_json3, yt_intel) under these limits.
  limits: { timeMs: 30_000, memoryMb: 512 },
  handler: async (input, ctx): Promise<VideoIntelOutput> => {
    const video = await loadVideo(input.video, ctx);
    const track = selectTrack(video.tracks, input.langs, input.prefer);
    if (!track && input.require_captions) throw noCaptions(video, input.langs);
    const transcript: LoadedTranscript | null = track ? await loadTrack(track, ctx) : null;
    await ctx.progress({ stage: 'analysing' });
    const d = video.details;
    const segments = transcript?.segments ?? [];
    const analysis = await runTask(ctx, 'yt_intel', {
      title: d?.title ?? '',
      description: d?.description ?? '',
      tags: d?.tags ?? [],
      duration_s: d?.duration_s ?? null,
      starts: segments.map((s) => s.start),
      durs: segments.map((s) => s.dur),
      texts: segments.map((s) => s.text),
      max_keywords: input.max_keywords,
      summary_sentences: input.summary_sentences,
    });
    return {
      video: { id: video.video_id, title: d?.title ?? null, channel: d?.channel ?? null, duration_s: d?.duration_s ?? null, views: d?.views ?? null },
      transcript: {
        available: transcript !== null,
        language: transcript?.track.language ?? null,
        kind: transcript?.track.kind ?? null,
        reason: transcript ? null : 'no_captions',
        truncated: transcript?.truncated ?? false,
        available_languages: [...new Set(video.tracks.map((t) => t.language))],
      },
      chapters: analysis.chapters,
      chapters_source: analysis.chapters_source,
      keywords: analysis.keywords,
      entities: analysis.entities,
      summary: analysis.summary,
      summary_source: analysis.summary_source,
      stats: { words: analysis.words, wpm: analysis.wpm },
    };
  },
});
