import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { descriptionChapters, extractPlayerResponse, parseJson3Task, parseWatchPageTask, MAX_SEGMENTS } from '../../../src/tools/media/parse.js';
import { selectTrack, videoIdOf } from '../../../src/tools/media/youtube.js';
import type { CaptionTrack } from '../../../src/tools/media/parse.js';
import { json3Of } from '../../helpers/fake-youtube.js';

const enc = (s: string) => new TextEncoder().encode(s);

describe('videoIdOf', () => {
  it.each([
    ['jNQXAC9IVRw', 'jNQXAC9IVRw'],
    ['  jNQXAC9IVRw ', 'jNQXAC9IVRw'],
    ['https://www.youtube.com/watch?v=jNQXAC9IVRw', 'jNQXAC9IVRw'],
    ['https://m.youtube.com/watch?feature=share&v=jNQXAC9IVRw&t=42s', 'jNQXAC9IVRw'],
    ['youtube.com/watch?v=jNQXAC9IVRw', 'jNQXAC9IVRw'],
    ['https://music.youtube.com/watch?v=jNQXAC9IVRw&list=RD', 'jNQXAC9IVRw'],
    ['https://youtu.be/jNQXAC9IVRw?si=abc', 'jNQXAC9IVRw'],
    ['https://www.youtube.com/shorts/jNQXAC9IVRw', 'jNQXAC9IVRw'],
    ['https://www.youtube.com/embed/jNQXAC9IVRw?start=3', 'jNQXAC9IVRw'],
    ['https://www.youtube-nocookie.com/embed/jNQXAC9IVRw', 'jNQXAC9IVRw'],
    ['https://www.youtube.com/live/jNQXAC9IVRw', 'jNQXAC9IVRw'],
  ])('%s → %s', (raw, id) => {
    expect(videoIdOf(raw)).toBe(id);
  });

  it.each([
    'jNQXAC9IVR', // 10 characters
    'jNQXAC9IVRw1',
    'https://example.com/watch?v=jNQXAC9IVRw',
    'https://evil.com/youtube.com/watch?v=jNQXAC9IVRw',
    'https://www.youtube.com/watch?v=short',
    'https://www.youtube.com/channel/UC0123456789',
    'ftp://youtube.com/watch?v=jNQXAC9IVRw',
    'not a url at all',
  ])('%s is refused', (raw) => {
    expect(videoIdOf(raw)).toBeNull();
  });
});

describe('extractPlayerResponse', () => {
  it('finds the object assigned in the page, whatever follows it, and skips braces inside strings', () => {
    const player = { videoDetails: { videoId: 'abcdefghijk', title: 'a } b { "c"', shortDescription: 'x\\"}' } };
    const html = `<script>var ytcfg = {"a":1};</script><script>var ytInitialPlayerResponse = ${JSON.stringify(player)};var meta = {};</script><script>var ytInitialData = {"b":2};</script>`;
    expect(extractPlayerResponse(html)).toEqual(player);
    expect(extractPlayerResponse(`window["ytInitialPlayerResponse"] = ${JSON.stringify(player)}\n`)).toEqual(player);
  });

  it('null when absent, unterminated or not JSON', () => {
    expect(extractPlayerResponse('<html>nothing here</html>')).toBeNull();
    expect(extractPlayerResponse('var ytInitialPlayerResponse = {"a": {"b": 1}')).toBeNull();
    expect(extractPlayerResponse('var ytInitialPlayerResponse = {a: 1};')).toBeNull();
    expect(extractPlayerResponse('var ytInitialPlayerResponse = null;')).toBeNull();
  });

  it('takes a later assignment when the first is not JSON', () => {
    expect(extractPlayerResponse('ytInitialPlayerResponse = {foo()}; ytInitialPlayerResponse = {"ok":true};')).toEqual({ ok: true });
  });

  it('never throws on arbitrary text', () => {
    fc.assert(
      fc.property(fc.string(), fc.string(), (a, b) => {
        const r = extractPlayerResponse(`${a}ytInitialPlayerResponse = {${b}`);
        expect(r === null || typeof r === 'object').toBe(true);
      }),
    );
  });
});

describe('parseWatchPageTask', () => {
  const page = (player: unknown) => enc(`<html><script>var ytInitialPlayerResponse = ${JSON.stringify(player)};</script></html>`);

  it('reads details and tracks; counts as numbers; asr kind; names from simpleText or runs; bad tracks dropped', () => {
    const r = parseWatchPageTask({
      body: page({
        playabilityStatus: { status: 'OK' },
        videoDetails: {
          videoId: 'abcdefghijk',
          title: 'T',
          author: 'A',
          lengthSeconds: '213',
          viewCount: '1234567',
          shortDescription: 'D',
          keywords: ['k1', 2, 'k2'],
        },
        captions: {
          playerCaptionsTracklistRenderer: {
            captionTracks: [
              { baseUrl: '/api/timedtext?v=x&lang=en', languageCode: 'en', name: { simpleText: 'English' } },
              {
                baseUrl: 'https://site/api/timedtext?lang=en&kind=asr',
                languageCode: 'en',
                kind: 'asr',
                name: { runs: [{ text: 'English ' }, { text: '(auto-generated)' }] },
              },
              { languageCode: 'fr' },
              { baseUrl: 'x', languageCode: 'bad code!' },
            ],
          },
        },
      }),
    });
    expect(r.found).toBe(true);
    expect(r.playability).toEqual({ status: 'OK', reason: null });
    expect(r.details).toEqual({
      video_id: 'abcdefghijk',
      title: 'T',
      channel: 'A',
      channel_id: null,
      duration_s: 213,
      views: 1234567,
      description: 'D',
      tags: ['k1', 'k2'],
      is_live: false,
    });
    expect(r.tracks).toEqual([
      { base_url: '/api/timedtext?v=x&lang=en', language: 'en', kind: 'manual', name: 'English' },
      { base_url: 'https://site/api/timedtext?lang=en&kind=asr', language: 'en', kind: 'asr', name: 'English (auto-generated)' },
    ]);
  });

  it('a page without a player response is not found; an unavailable video keeps its status', () => {
    expect(parseWatchPageTask({ body: enc('<html>consent</html>') })).toEqual({ found: false, playability: null, details: null, tracks: [] });
    const r = parseWatchPageTask({ body: page({ playabilityStatus: { status: 'ERROR', reason: 'Video unavailable' } }) });
    expect(r).toEqual({ found: true, playability: { status: 'ERROR', reason: 'Video unavailable' }, details: null, tracks: [] });
  });
});

describe('parseJson3Task', () => {
  it('manual and automatic tracks give the same segments: seconds, texts joined, empty events dropped', () => {
    const cues = [
      { start: 0.5, dur: 2.25, text: 'Hello and welcome' },
      { start: 3, dur: 1.5, text: 'to the show.' },
    ];
    for (const kind of [undefined, 'asr' as const]) {
      const r = parseJson3Task({ body: enc(json3Of({ lang: 'en', kind, cues })), max_result_bytes: 1e6 });
      expect(r).toEqual({ starts: [0.5, 3], durs: [2.25, 1.5], texts: ['Hello and welcome', 'to the show.'], truncated: false });
    }
  });

  it('line breaks inside an event become spaces; missing durations are 0; not json3 is null', () => {
    const body = JSON.stringify({
      events: [
        { tStartMs: 1000, segs: [{ utf8: 'two\nlines' }] },
        { tStartMs: 2000, segs: [{}] },
      ],
    });
    expect(parseJson3Task({ body: enc(body), max_result_bytes: 1e6 })).toEqual({ starts: [1], durs: [0], texts: ['two lines'], truncated: false });
    expect(parseJson3Task({ body: enc('<transcript/>'), max_result_bytes: 1e6 })).toBeNull();
    expect(parseJson3Task({ body: enc('{"wireMagic":"pb3"}'), max_result_bytes: 1e6 })).toBeNull();
  });

  it('stops at the segment cap and says so', () => {
    const events = Array.from({ length: MAX_SEGMENTS + 5 }, (_, i) => ({ tStartMs: i * 1000, dDurationMs: 900, segs: [{ utf8: `w${i}` }] }));
    const r = parseJson3Task({ body: enc(JSON.stringify({ events })), max_result_bytes: 10e6 })!;
    expect(r.texts).toHaveLength(MAX_SEGMENTS);
    expect(r.truncated).toBe(true);
  });

  it('stops before its JSON passes the result cap, counting UTF-8 bytes', () => {
    const events = Array.from({ length: 5000 }, (_, i) => ({ tStartMs: i * 1000, dDurationMs: 900, segs: [{ utf8: '日本語の字幕です'.repeat(10) }] }));
    for (const cap of [1024, 100_000, 1_000_000]) {
      const r = parseJson3Task({ body: enc(JSON.stringify({ events })), max_result_bytes: cap })!;
      expect(r.truncated).toBe(true);
      const size = Buffer.byteLength(JSON.stringify({ value: r, usage: {} }));
      expect(size).toBeLessThanOrEqual(cap);
      expect(size).toBeGreaterThan(cap * 0.9 - 300);
    }
  });
});

describe('descriptionChapters', () => {
  it('reads timestamp-first and timestamp-last lines, h:mm:ss, brackets and separators', () => {
    const d = [
      'A talk about queues.',
      '',
      'Chapters:',
      '0:00 Intro',
      '[01:30] - Why queues',
      '• 12:05 — Redis: the details',
      '1:02:03 Q&A',
      'Wrap-up (1:10:00)',
      '',
      'Follow me at https://example.com/12:30',
    ].join('\n');
    expect(descriptionChapters(d, 4500)).toEqual([
      { start: 0, title: 'Intro' },
      { start: 90, title: 'Why queues' },
      { start: 725, title: 'Redis: the details' },
      { start: 3723, title: 'Q&A' },
      { start: 4200, title: 'Wrap-up' },
    ]);
  });

  it('no list: one timestamp, out of order, past the duration, or impossible times', () => {
    expect(descriptionChapters('See 3:15 for the demo', 600)).toEqual([]);
    expect(descriptionChapters('0:00 Intro\n2:00 B\n1:00 C', 600)).toEqual([
      { start: 0, title: 'Intro' },
      { start: 120, title: 'B' },
    ]);
    expect(descriptionChapters('Songs: 4:10 One\n0:00 Intro\n5:00 B', 600)).toEqual([
      { start: 0, title: 'Intro' },
      { start: 300, title: 'B' },
    ]);
    expect(descriptionChapters('0:00 Intro\n0:00 Again', 600)).toEqual([]);
    expect(descriptionChapters('0:00 Intro\n15:00 B', 600)).toEqual([]);
    expect(descriptionChapters('0:00 Intro\n1:75 B', 600)).toEqual([]);
    expect(descriptionChapters('0:00 Intro\n15:00 B', null)).toHaveLength(2);
  });
});

describe('selectTrack', () => {
  const t = (language: string, kind: 'manual' | 'asr' = 'manual'): CaptionTrack => ({ base_url: `/t/${language}/${kind}`, language, kind, name: language });
  const tracks = [t('de'), t('en-GB'), t('en', 'asr'), t('fr', 'asr'), t('en')];

  it('languages in order; exact tag before the same primary language; preferred kind within a language', () => {
    expect(selectTrack(tracks, ['en'], 'manual')).toBe(tracks[4]);
    expect(selectTrack(tracks, ['en'], 'asr')).toBe(tracks[2]);
    expect(selectTrack(tracks, ['en-US'], 'manual')).toBe(tracks[1]);
    expect(selectTrack(tracks, ['en-GB'], 'asr')).toBe(tracks[1]);
    expect(selectTrack(tracks, ['es', 'fr'], 'manual')).toBe(tracks[3]);
    expect(selectTrack(tracks, ['FR'], 'manual')).toBe(tracks[3]);
    expect(selectTrack(tracks, ['es', 'it'], 'manual')).toBeNull();
  });

  it('without languages: English, else the spoken (automatic) language, else the first', () => {
    expect(selectTrack(tracks, undefined, 'manual')).toBe(tracks[1]);
    expect(selectTrack([t('de'), t('fr'), t('fr', 'asr')], undefined, 'manual')).toEqual(t('fr'));
    expect(selectTrack([t('de'), t('fr')], undefined, 'asr')).toEqual(t('de'));
    expect(selectTrack([], undefined, 'manual')).toBeNull();
  });
});
