import pino from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../../src/config.js';
import { SandboxPool } from '../../../src/sandbox/pool.js';
import { MAX_TRANSCRIPT_CHARS } from '../../../src/tools/media/parse.js';
import { grabrTranscript } from '../../../src/tools/media/transcript.js';
import { grabrVideoIntel } from '../../../src/tools/media/video-intel.js';
import { MAX_PAGE_BYTES, MAX_TRACK_BYTES } from '../../../src/tools/media/youtube.js';
import { testEnv } from '../../helpers/harness.js';
import { BIKES, COFFEE, PYTHON } from './fixtures.js';

/**
 * The media tasks at their worst case (a watch page and a track at the 5 MiB caps, the longest
 * transcript the caps let through) run in the sandbox pool inside the tools' own limits: an honest
 * video at the caps is answered, never refused with 422 limit_exceeded.
 */

const config = loadConfig({}, testEnv({ LOG_LEVEL: 'warn' }));
const pool = new SandboxPool(config, pino({ level: 'warn' }));
const call = (label: string, limits: typeof grabrTranscript.limits) => ({ owner: 'media-limits', label, limits });

afterAll(async () => {
  await pool.close();
});

const ALL = [...COFFEE, ...BIKES, ...PYTHON];

function bigTrack(): Uint8Array {
  // Automatic-caption style: one seg per word, until the body reaches the cap.
  const events: string[] = [];
  let size = 20;
  for (let i = 0; size < MAX_TRACK_BYTES - 2_000; i++) {
    const words = `${ALL[i % ALL.length]} Ada Lovelace ${i}`.split(' ');
    const e = JSON.stringify({
      tStartMs: i * 2500,
      dDurationMs: 2500,
      wWinId: 1,
      segs: words.map((w, k) => (k ? { utf8: ` ${w}`, tOffsetMs: k * 150, acAsrConf: 0 } : { utf8: w, acAsrConf: 0 })),
    });
    events.push(e);
    size += e.length + 1;
  }
  return new TextEncoder().encode(`{"events":[${events.join(',')}]}`);
}

function bigPage(): Uint8Array {
  const tracks = Array.from({ length: 100 }, (_, i) => ({
    baseUrl: `https://www.youtube.com/api/timedtext?v=abcdefghijk&lang=l${i}&${'x'.repeat(1900)}`,
    languageCode: `l${i}`,
    name: { simpleText: `Track ${i}` },
  }));
  const player = {
    playabilityStatus: { status: 'OK' },
    videoDetails: {
      videoId: 'abcdefghijk',
      title: 'T'.repeat(100),
      author: 'A',
      lengthSeconds: '36000',
      viewCount: '1',
      shortDescription: ALL.join('\n').repeat(20).slice(0, 10_000),
    },
    captions: { playerCaptionsTracklistRenderer: { captionTracks: tracks } },
    // Filler a real page carries (streaming formats, storyboards...), with braces in strings.
    streamingData: {
      formats: Array.from({ length: 2_000 }, (_, i) => ({ itag: i, url: `https://rr1---sn.googlevideo.com/videoplayback?x={${i}}&${'q'.repeat(600)}` })),
    },
  };
  const head = '<!DOCTYPE html><html><head><script>var ytcfg = {"a":1};</script></head><body><script>var ytInitialPlayerResponse = ';
  const tail = ';</script>';
  const json = JSON.stringify(player);
  const pad = '<div>' + 'p'.repeat(Math.max(0, MAX_PAGE_BYTES - head.length - json.length - tail.length - 40)) + '</div>';
  const page = head + json + tail + pad + '</body></html>';
  expect(page.length).toBeLessThanOrEqual(MAX_PAGE_BYTES);
  expect(page.length).toBeGreaterThan(MAX_PAGE_BYTES - 1_000);
  return new TextEncoder().encode(page);
}

describe('media tasks at the caps', () => {
  it("a 5 MiB watch page and a 5 MiB track parse inside grabr_transcript's limits; the track stops at the transcript cap", async () => {
    const page = await pool.runTask('yt_watch_page', { body: bigPage() }, call('grabr_transcript/yt_watch_page', grabrTranscript.limits));
    expect(page.tracks).toHaveLength(100);
    expect(page.details?.duration_s).toBe(36000);
    const track = await pool.runTask(
      'yt_json3',
      { body: bigTrack(), max_result_bytes: config.TOOL_MAX_RESULT_BYTES },
      call('grabr_transcript/yt_json3', grabrTranscript.limits),
    );
    expect(track).not.toBeNull();
    expect(track!.truncated).toBe(true);
    expect(track!.texts.join(' ').length).toBeGreaterThan(MAX_TRANSCRIPT_CHARS * 0.9);
  }, 120_000);

  it("the longest transcript analyses inside grabr_video_intel's limits", async () => {
    const track = (await pool.runTask(
      'yt_json3',
      { body: bigTrack(), max_result_bytes: config.TOOL_MAX_RESULT_BYTES },
      call('grabr_video_intel/yt_json3', grabrVideoIntel.limits),
    ))!;
    const input = {
      title: 'A long stream',
      description: ALL.join('\n').repeat(20).slice(0, 10_000),
      tags: ['coffee'],
      duration_s: null,
      starts: track.starts,
      durs: track.durs,
      texts: track.texts,
      max_keywords: 50,
      summary_sentences: 20,
    };
    const out = await pool.runTask('yt_intel', input, call('grabr_video_intel/yt_intel', grabrVideoIntel.limits));
    expect(out.words).toBeGreaterThan(50_000);
    expect(out.keywords).toHaveLength(50);
    expect(out.chapters.length).toBeGreaterThan(0);
  }, 120_000);
});
