import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { grabrTranscript } from '../../../src/tools/media/transcript.js';
import { grabrVideoIntel } from '../../../src/tools/media/video-intel.js';
import { MAX_PAGE_BYTES } from '../../../src/tools/media/youtube.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { startFakeYoutube, type FakeYoutube } from '../../helpers/fake-youtube.js';
import { COFFEE, cuesOf, threeTopics } from './fixtures.js';

/** The two handlers called directly against the fake video site (parsing runs inline here; the integration test covers the pool). */

let yt: FakeYoutube;
let other: FakeYoutube;
let hang: http.Server;
let hangUrl: string;

beforeAll(async () => {
  yt = await startFakeYoutube();
  other = await startFakeYoutube();
  hang = http.createServer(() => {
    /* never answers */
  });
  await new Promise<void>((r) => hang.listen(0, '127.0.0.1', r));
  hangUrl = `http://127.0.0.1:${(hang.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await yt?.close();
  await other?.close();
  hang?.closeAllConnections();
  await new Promise<void>((r) => hang.close(() => r()));
});

const ctxFor = (env: Record<string, string> = {}) => makeToolContext({ env: { YOUTUBE_BASE_URL: yt.url, ...env } });
const transcript = (input: unknown, env?: Record<string, string>) => {
  const c = ctxFor(env);
  return grabrTranscript.handler(grabrTranscript.input.parse(input), c.ctx);
};
const intel = (input: unknown, env?: Record<string, string>) => grabrVideoIntel.handler(grabrVideoIntel.input.parse(input), ctxFor(env).ctx);

const CUES = [
  { start: 0, dur: 2.5, text: 'Hello and welcome.' },
  { start: 2.5, dur: 3.25, text: 'Today: queues & "workers" <b>bold</b>.' },
  { start: 6, dur: 1.001, text: 'Bye --> now' },
];
const ASR = [
  { start: 0.12, dur: 2.4, text: 'hello and welcome' },
  { start: 2.6, dur: 3, text: 'today queues and workers' },
];

describe('grabr_transcript', () => {
  beforeAll(() => {
    yt.add({
      id: 'vid00000001',
      title: 'Queues explained',
      author: 'Tollgate',
      lengthSeconds: 8,
      viewCount: 42,
      tracks: [
        { lang: 'de', cues: [{ start: 0, dur: 1, text: 'Hallo' }] },
        { lang: 'en', kind: 'asr', cues: ASR },
        { lang: 'en', name: 'English', cues: CUES },
        { lang: 'fr-CA', kind: 'asr', cues: [{ start: 1, dur: 1, text: 'bonjour' }] },
      ],
    });
  });

  it('reads the manual English track as json3: exact segments, rendered text, every track listed', async () => {
    const r = await transcript({ video: 'https://www.youtube.com/watch?v=vid00000001' });
    expect(grabrTranscript.outputSchema!.parse(r)).toEqual(r);
    expect(r).toEqual({
      video_id: 'vid00000001',
      title: 'Queues explained',
      language: 'en',
      kind: 'manual',
      format: 'text',
      segments: CUES,
      text: CUES.map((c) => c.text).join(' '),
      tracks: [
        { language: 'de', kind: 'manual', name: 'de' },
        { language: 'en', kind: 'asr', name: 'en (auto-generated)' },
        { language: 'en', kind: 'manual', name: 'English' },
        { language: 'fr-CA', kind: 'asr', name: 'fr-CA (auto-generated)' },
      ],
      truncated: false,
    });
    const cap = yt.captionRequests().at(-1)!;
    // The page's URL, with its signature, and json3 asked for.
    expect(cap.params).toMatchObject({ v: 'vid00000001', lang: 'en', fmt: 'json3', signature: 'ABCDEF0123456789' });
    expect(cap.params['kind']).toBeUndefined();
    // Both requests say who is asking (GRABR_USER_AGENT).
    expect(yt.requests.slice(-2).map((r) => [r.path, r.headers['user-agent']])).toEqual([
      ['/watch', 'TollgateGrabr/0.1'],
      ['/api/timedtext', 'TollgateGrabr/0.1'],
    ]);
  });

  it('prefer asr picks the automatic track; langs pick the language, "fr" matching fr-CA; a youtu.be URL works', async () => {
    const asr = await transcript({ video: 'https://youtu.be/vid00000001', prefer: 'asr' });
    expect([asr.language, asr.kind, asr.segments]).toEqual(['en', 'asr', ASR]);
    const fr = await transcript({ video: 'vid00000001', langs: ['es', 'fr'] });
    expect([fr.language, fr.kind, fr.segments]).toEqual(['fr-CA', 'asr', [{ start: 1, dur: 1, text: 'bonjour' }]]);
    const de = await transcript({ video: 'vid00000001', langs: ['de'], prefer: 'asr' });
    expect([de.language, de.kind, de.text]).toEqual(['de', 'manual', 'Hallo']);
  });

  it('formats: timestamped, srt and vtt', async () => {
    expect((await transcript({ video: 'vid00000001', format: 'timestamped' })).text).toBe(
      '[0:00] Hello and welcome.\n[0:02] Today: queues & "workers" <b>bold</b>.\n[0:06] Bye --> now',
    );
    expect((await transcript({ video: 'vid00000001', format: 'srt' })).text).toBe(
      '1\n00:00:00,000 --> 00:00:02,500\nHello and welcome.\n\n' +
        '2\n00:00:02,500 --> 00:00:05,750\nToday: queues & "workers" <b>bold</b>.\n\n' +
        '3\n00:00:06,000 --> 00:00:07,001\nBye -> now\n',
    );
    expect((await transcript({ video: 'vid00000001', format: 'vtt' })).text).toBe(
      'WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello and welcome.\n\n' +
        '00:00:02.500 --> 00:00:05.750\nToday: queues & "workers" <b>bold</b>.\n\n' +
        '00:00:06.000 --> 00:00:07.001\nBye -> now\n',
    );
  });

  it('no track in the languages asked for: no_captions with the languages there are; none at all likewise', async () => {
    await expect(transcript({ video: 'vid00000001', langs: ['ja'] })).rejects.toMatchObject({
      code: 'no_captions',
      status: 404,
      details: { video_id: 'vid00000001', available_languages: ['de', 'en', 'fr-CA'] },
    });
    yt.add({ id: 'nocaptions1', title: 'Silent film' });
    await expect(transcript({ video: 'nocaptions1' })).rejects.toMatchObject({ code: 'no_captions', details: { available_languages: [] } });
  });

  it('an empty caption body (the proof-of-origin gate) is tool_unavailable, never an empty transcript', async () => {
    yt.add({ id: 'emptybody01', tracks: [{ lang: 'en', empty: true }] });
    await expect(transcript({ video: 'emptybody01' })).rejects.toMatchObject({ code: 'tool_unavailable', status: 503, details: { reason: 'empty_captions' } });
  });

  it('a caption URL on another origin is not fetched; a relative one is read from the configured site', async () => {
    other.add({ id: 'elsewhere01', tracks: [{ lang: 'en', cues: CUES }] });
    yt.add({ id: 'elsewhere01', tracks: [{ lang: 'en', baseUrl: `${other.url}/api/timedtext?v=elsewhere01&lang=en` }] });
    const before = other.requests.length;
    await expect(transcript({ video: 'elsewhere01' })).rejects.toMatchObject({ code: 'tool_unavailable', details: { reason: 'caption_origin' } });
    expect(other.requests.length).toBe(before);
    // Same host, another port: another origin.
    yt.add({ id: 'elsewhere02', tracks: [{ lang: 'en', baseUrl: `http://localhost:${new URL(yt.url).port}/api/timedtext?v=x&lang=en` }] });
    await expect(transcript({ video: 'elsewhere02' })).rejects.toMatchObject({ details: { reason: 'caption_origin' } });
    yt.add({ id: 'relative001', tracks: [{ lang: 'en', cues: CUES, baseUrl: '/api/timedtext?v=relative001&lang=en' }] });
    expect((await transcript({ video: 'relative001' })).segments).toEqual(CUES);
  });

  it('the site failing: a 500 page, a 500 track, 429, a page without a player response, a huge page, no answer in time', async () => {
    yt.add({ id: 'trackfail01', tracks: [{ lang: 'en', status: 500 }] });
    await expect(transcript({ video: 'trackfail01' })).rejects.toMatchObject({ code: 'tool_unavailable', details: { upstream_status: 500 } });
    yt.add({ id: 'redirect001', pageStatus: 302, location: `${other.url}/watch?v=redirect001` });
    const seen = other.requests.length;
    await expect(transcript({ video: 'redirect001' })).rejects.toMatchObject({
      code: 'tool_unavailable',
      message: expect.stringMatching(/redirects are not followed/),
    });
    expect(other.requests.length).toBe(seen);
    yt.add({ id: 'pagefail001', pageStatus: 502 });
    await expect(transcript({ video: 'pagefail001' })).rejects.toMatchObject({ code: 'tool_unavailable', details: { upstream_status: 502 } });
    yt.failWith = 429;
    try {
      await expect(transcript({ video: 'vid00000001' })).rejects.toMatchObject({
        code: 'tool_unavailable',
        message: expect.stringMatching(/rate limiting/),
        details: { upstream_status: 429, retry_after: 30 },
      });
    } finally {
      yt.failWith = null;
    }
    yt.add({ id: 'consent0001', rawPage: '<html><body>Before you continue to YouTube</body></html>' });
    await expect(transcript({ video: 'consent0001' })).rejects.toMatchObject({ code: 'tool_unavailable', details: { reason: 'page_layout' } });
    yt.add({ id: 'hugepage001', rawPage: 'x'.repeat(MAX_PAGE_BYTES + 1) });
    await expect(transcript({ video: 'hugepage001' })).rejects.toMatchObject({ code: 'tool_unavailable', message: expect.stringMatching(/larger than 5 MiB/) });
    const started = Date.now();
    await expect(transcript({ video: 'vid00000001' }, { YOUTUBE_BASE_URL: hangUrl, WEB_FETCH_TIMEOUT_MS: '600' })).rejects.toMatchObject({
      code: 'tool_unavailable',
      message: expect.stringMatching(/within 600 ms/),
    });
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('an unknown video (the site says ERROR) or a 404 page is not_found; a bot check is tool_unavailable', async () => {
    await expect(transcript({ video: 'unknownvid1' })).rejects.toMatchObject({ code: 'not_found', status: 404 });
    yt.add({ id: 'gone0000001', pageStatus: 404 });
    await expect(transcript({ video: 'gone0000001' })).rejects.toMatchObject({ code: 'not_found' });
    yt.add({
      id: 'botcheck001',
      rawPage: `<script>var ytInitialPlayerResponse = ${JSON.stringify({ playabilityStatus: { status: 'LOGIN_REQUIRED', reason: "Sign in to confirm you're not a bot" } })};</script>`,
    });
    await expect(transcript({ video: 'botcheck001' })).rejects.toMatchObject({ code: 'tool_unavailable', details: { playability: 'LOGIN_REQUIRED' } });
    // Age-restricted: details shown, tracks hidden. Not "no captions": the site did not say.
    yt.add({ id: 'agerestrict', title: 'Mature', playability: { status: 'LOGIN_REQUIRED', reason: 'Sign in to confirm your age' } });
    await expect(transcript({ video: 'agerestrict' })).rejects.toMatchObject({ code: 'tool_unavailable', details: { playability: 'LOGIN_REQUIRED' } });
    await expect(intel({ video: 'agerestrict' })).rejects.toMatchObject({ code: 'tool_unavailable' });
  });

  it('without YOUTUBE_BASE_URL the handler refuses too; bad input never reaches it', async () => {
    const { ctx } = makeToolContext();
    await expect(grabrTranscript.handler(grabrTranscript.input.parse({ video: 'vid00000001' }), ctx)).rejects.toMatchObject({ code: 'tool_unavailable' });
    expect(grabrTranscript.input.safeParse({ video: 'https://vimeo.com/12345' }).success).toBe(false);
    expect(grabrTranscript.input.safeParse({ video: 'vid00000001', langs: ['english!'] }).success).toBe(false);
    expect(grabrTranscript.input.safeParse({ video: 'vid00000001', format: 'docx' }).success).toBe(false);
  });

  it('reports progress: page, parsing, captions', async () => {
    const c = ctxFor();
    await grabrTranscript.handler(grabrTranscript.input.parse({ video: 'vid00000001' }), c.ctx);
    expect(c.progress.map((p) => [p.stage, p.message])).toEqual([
      ['fetching', 'watch page'],
      ['parsing', 'watch page'],
      ['fetching', 'captions'],
      ['parsed', 'captions'],
    ]);
  });
});

describe('grabr_video_intel', () => {
  const DESCRIPTION = ['Three short talks.', '', '0:00 Coffee', '2:08 Bicycles', '4:23 Python', '', 'Music by Someone'].join('\n');
  const { cues } = threeTopics(2);
  const duration = Math.ceil(cues.at(-1)!.start + cues.at(-1)!.dur);

  beforeAll(() => {
    yt.add({
      id: 'talks000001',
      title: 'Coffee, bikes and Python',
      author: 'Talks',
      lengthSeconds: duration,
      viewCount: 1000,
      description: DESCRIPTION,
      tracks: [{ lang: 'en', cues }],
    });
    yt.add({
      id: 'talks000002',
      title: 'Coffee, bikes and Python',
      lengthSeconds: duration,
      description: 'No chapters here.',
      tracks: [{ lang: 'en', kind: 'asr', cues }],
    });
    yt.add({
      id: 'talks000003',
      title: 'Brewing with Ada Lovelace',
      lengthSeconds: 100,
      description: 'Ada Lovelace visits Google in Paris.\n0:00 Start\n0:40 Middle',
      keywords: ['coffee'],
    });
  });

  it("chapters are the description's timestamps, each summarised from its own part of the transcript", async () => {
    const r = await intel({ video: 'talks000001' });
    expect(grabrVideoIntel.outputSchema!.parse(r)).toEqual(r);
    expect(r.video).toEqual({ id: 'talks000001', title: 'Coffee, bikes and Python', channel: 'Talks', duration_s: duration, views: 1000 });
    expect(r.transcript).toEqual({ available: true, language: 'en', kind: 'manual', reason: null, truncated: false, available_languages: ['en'] });
    expect(r.chapters_source).toBe('description');
    expect(r.chapters.map((c) => [c.start, c.end, c.title])).toEqual(
      [
        [0, 128, 'Coffee'],
        [128, 263, 'Bicycles'],
        [263, duration],
      ].map(([s, e, t]) => [s, e, t ?? 'Python']),
    );
    expect(COFFEE).toContain(r.chapters[0]!.summary);
    expect(r.chapters[1]!.summary).toMatch(/tyre|chain|brake|bicycle|wheel/i);
    expect(r.chapters[2]!.summary).toMatch(/Python|test|code|program/);
    const words = cues.map((c) => c.text.split(' ').length).reduce((a, b) => a + b, 0);
    expect(r.stats.words).toBe(words);
    expect(r.stats.wpm).toBe(Math.round((words / (duration / 60)) * 10) / 10);
    expect(r.keywords[0]).toEqual({ term: 'coffee', score: 1, count: 14 });
    expect(r.keywords.map((k) => k.term.toLowerCase())).toEqual(expect.arrayContaining(['grind', 'chain', 'python']));
    expect(r.keywords.length).toBe(15);
    expect(r.summary_source).toBe('transcript');
    expect(r.summary.length).toBeGreaterThan(50);
  });

  it('without description chapters, the transcript is segmented at its topic shifts (automatic captions too)', async () => {
    const { switches } = threeTopics(2);
    const r = await intel({ video: 'talks000002', summary_sentences: 2 });
    expect(r.chapters_source).toBe('transcript');
    expect(r.chapters).toHaveLength(3);
    r.chapters.forEach((c, i) => expect(Math.abs(c.start - switches[i]!)).toBeLessThanOrEqual(25));
    expect(r.chapters[0]!.title).toMatch(/^Coffee/);
    expect(r.chapters[1]!.title.toLowerCase()).toMatch(/chain|tyre|bicycle|pads/);
    expect(r.chapters[2]!.title.toLowerCase()).toMatch(/python|tests|code/);
    expect(r.transcript.kind).toBe('asr');
  });

  it('the same video gives the same answer', async () => {
    expect(JSON.stringify(await intel({ video: 'talks000002' }))).toBe(JSON.stringify(await intel({ video: 'talks000002' })));
  });

  it('no captions: metadata, description chapters, summary and entities, transcript.available false; require_captions makes it 404', async () => {
    const r = await intel({ video: 'talks000003' });
    expect(grabrVideoIntel.outputSchema!.parse(r)).toEqual(r);
    expect(r.transcript).toEqual({ available: false, language: null, kind: null, reason: 'no_captions', truncated: false, available_languages: [] });
    expect(r.chapters).toEqual([
      { start: 0, end: 40, title: 'Start', summary: null },
      { start: 40, end: 100, title: 'Middle', summary: null },
    ]);
    expect(r.summary).toBe('Ada Lovelace visits Google in Paris.');
    expect(r.summary_source).toBe('description');
    expect(r.stats).toEqual({ words: 0, wpm: null });
    expect(r.entities).toEqual(expect.arrayContaining([expect.objectContaining({ text: 'Ada Lovelace', type: 'person', count: 2 })]));
    expect(r.entities.map((e) => e.text)).toEqual(expect.arrayContaining(['Google', 'Paris']));
    await expect(intel({ video: 'talks000003', require_captions: true })).rejects.toMatchObject({ code: 'no_captions' });
    // Captions, but not in the language asked for: answered without them, saying which there are.
    const other = await intel({ video: 'talks000001', langs: ['ja'] });
    expect(other.transcript).toEqual({ available: false, language: null, kind: null, reason: 'no_captions', truncated: false, available_languages: ['en'] });
    expect(other.chapters.map((c) => c.title)).toEqual(['Coffee', 'Bicycles', 'Python']);
    expect(other.chapters.every((c) => c.summary === null)).toBe(true);
  });

  it('the caption gate and the site failing are 503 here too: never an answer without the transcript it could not read', async () => {
    yt.add({ id: 'intelempty1', description: '0:00 A\n1:00 B', lengthSeconds: 120, tracks: [{ lang: 'en', empty: true }] });
    await expect(intel({ video: 'intelempty1' })).rejects.toMatchObject({ code: 'tool_unavailable', details: { reason: 'empty_captions' } });
    yt.add({ id: 'intelfail01', tracks: [{ lang: 'en', status: 503 }] });
    await expect(intel({ video: 'intelfail01' })).rejects.toMatchObject({ code: 'tool_unavailable' });
  });

  it('a single short cue list makes one chapter titled by its terms', async () => {
    yt.add({ id: 'shortone001', lengthSeconds: 30, tracks: [{ lang: 'en', cues: cuesOf(COFFEE.slice(0, 3)) }] });
    const r = await intel({ video: 'shortone001' });
    expect(r.chapters).toHaveLength(1);
    expect(r.chapters[0]).toMatchObject({ start: 0, end: 30 });
    expect(r.chapters[0]!.title.toLowerCase()).toMatch(/grind|beans|coffee/);
  });
});
