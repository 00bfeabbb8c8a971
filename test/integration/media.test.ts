import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { json, startHarness, type Harness } from '../helpers/harness.js';
import { startFakeYoutube, type FakeYoutube } from '../helpers/fake-youtube.js';
import { TranscriptOutput } from '../../src/tools/media/transcript.js';
import { VideoIntelOutput } from '../../src/tools/media/video-intel.js';
import { findTool } from '../../src/tools/index.js';

/**
 * The media tools through the whole service (HTTP, queue, media worker, sandbox pool threads for the
 * page, the json3 track and the analysis, settlement) against the fake video site: exact results,
 * charged their price on success and nothing on failure; without YOUTUBE_BASE_URL, 503 at admission.
 */

let h: Harness;
let yt: FakeYoutube;
let other: FakeYoutube;

const CUES = [
  { start: 0, dur: 3.5, text: 'Welcome to the queue deep dive.' },
  { start: 3.5, dur: 4, text: 'We start with Redis streams.' },
  { start: 62, dur: 5.25, text: 'Then workers pick up jobs and report progress.' },
  { start: 130.5, dur: 2, text: 'Thanks for watching!' },
];
const DESCRIPTION = 'How our queues work.\n\n0:00 Welcome\n1:02 Workers\n2:10 Outro\n\nSlides: https://example.com/slides';

beforeAll(async () => {
  yt = await startFakeYoutube();
  other = await startFakeYoutube();
  yt.add({
    id: 'queuetalk01',
    title: 'Queue deep dive',
    author: 'Tollgate',
    lengthSeconds: 140,
    viewCount: 5120,
    description: DESCRIPTION,
    tracks: [
      { lang: 'en', kind: 'asr', cues: CUES.map((c) => ({ ...c, text: c.text.toLowerCase().replace(/[.!]/g, '') })) },
      { lang: 'en', cues: CUES },
      { lang: 'es', cues: [{ start: 0, dur: 2, text: 'Bienvenidos.' }] },
    ],
  });
  yt.add({ id: 'emptytrack1', title: 'Gated', tracks: [{ lang: 'en', empty: true }] });
  yt.add({ id: 'brokentrack', title: 'Broken', tracks: [{ lang: 'en', status: 500 }] });
  other.add({ id: 'redirected1', tracks: [{ lang: 'en', cues: CUES }] });
  yt.add({ id: 'redirected1', title: 'Elsewhere', tracks: [{ lang: 'en', baseUrl: `${other.url}/api/timedtext?v=redirected1&lang=en` }] });
  h = await startHarness({ YOUTUBE_BASE_URL: yt.url }, { workers: ['media'] });
});

afterAll(async () => {
  await h?.close();
  await yt?.close();
  await other?.close();
});

async function uncharged(accountId: string, before: number, charges: number) {
  expect(await h.credits(accountId)).toBe(before);
  expect(await h.ledgerCharges(accountId)).toBe(charges);
}

describe('grabr_transcript through the service', () => {
  it('exact segments of the manual track, read as json3 in the pool; charged 8 cents once', async () => {
    const acct = await h.account('enterprise', 1000);
    const res = await h.call('grabr_transcript', { video: 'https://www.youtube.com/watch?v=queuetalk01', format: 'timestamped' }, acct.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const body = json(res);
    expect(body.cost_cents).toBe(8);
    expect(TranscriptOutput.parse(body.result)).toEqual(body.result);
    expect(body.result).toMatchObject({ video_id: 'queuetalk01', title: 'Queue deep dive', language: 'en', kind: 'manual', segments: CUES, truncated: false });
    expect(body.result.text).toBe(
      '[0:00] Welcome to the queue deep dive.\n[0:03] We start with Redis streams.\n[1:02] Then workers pick up jobs and report progress.\n[2:10] Thanks for watching!',
    );
    expect(body.result.tracks.map((t: any) => `${t.language}/${t.kind}`)).toEqual(['en/asr', 'en/manual', 'es/manual']);
    expect(yt.captionRequests().at(-1)!.params).toMatchObject({ v: 'queuetalk01', lang: 'en', fmt: 'json3' });
    expect(await h.credits(acct.accountId)).toBe(1000 - 8);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
    // The media family has no isolated tool, so the pool starts threads only for its tasks (yt_watch_page, yt_json3).
    const pool = (h.container.runner as unknown as { deps: { sandbox: { stats(): { started: number } } } }).deps.sandbox;
    expect(pool.stats().started).toBeGreaterThan(0);
  });

  it('langs and prefer choose the track', async () => {
    const acct = await h.account('enterprise', 1000);
    const asr = json(await h.call('grabr_transcript', { video: 'queuetalk01', prefer: 'asr' }, acct.apiKey)).result;
    expect([asr.kind, asr.segments[0].text]).toEqual(['asr', 'welcome to the queue deep dive']);
    const es = json(await h.call('grabr_transcript', { video: 'queuetalk01', langs: ['es'] }, acct.apiKey)).result;
    expect([es.language, es.text]).toEqual(['es', 'Bienvenidos.']);
    expect(await h.credits(acct.accountId)).toBe(1000 - 16);
  });

  it('no track in the languages asked for: 404 no_captions, uncharged', async () => {
    const acct = await h.account('enterprise', 1000);
    const res = await h.call('grabr_transcript', { video: 'queuetalk01', langs: ['ja', 'ko'] }, acct.apiKey);
    expect(res.statusCode).toBe(404);
    expect(json(res).error).toMatchObject({ code: 'no_captions', video_id: 'queuetalk01', available_languages: ['en', 'es'] });
    await uncharged(acct.accountId, 1000, 0);
  });

  it('an empty caption body: 503 tool_unavailable, uncharged', async () => {
    const acct = await h.account('enterprise', 1000);
    const res = await h.call('grabr_transcript', { video: 'emptytrack1' }, acct.apiKey);
    expect(res.statusCode).toBe(503);
    expect(json(res).error).toMatchObject({ code: 'tool_unavailable', reason: 'empty_captions' });
    await uncharged(acct.accountId, 1000, 0);
  });

  it('the site answering 500 (track, then page) or 429: 503, uncharged', async () => {
    const acct = await h.account('enterprise', 1000);
    const track = await h.call('grabr_transcript', { video: 'brokentrack' }, acct.apiKey);
    expect(track.statusCode).toBe(503);
    expect(json(track).error).toMatchObject({ code: 'tool_unavailable', upstream_status: 500 });
    yt.failWith = 500;
    try {
      const page = await h.call('grabr_transcript', { video: 'queuetalk01' }, acct.apiKey);
      expect(page.statusCode).toBe(503);
      expect(json(page).error).toMatchObject({ code: 'tool_unavailable', upstream_status: 500 });
      // Rate limited: the site's Retry-After reaches the caller.
      yt.failWith = 429;
      const limited = await h.call('grabr_transcript', { video: 'queuetalk01' }, acct.apiKey);
      expect(limited.statusCode).toBe(503);
      expect(json(limited).error).toMatchObject({ code: 'tool_unavailable', upstream_status: 429, retry_after: 30 });
      expect(limited.headers['retry-after']).toBe('30');
    } finally {
      yt.failWith = null;
    }
    await uncharged(acct.accountId, 1000, 0);
  });

  it('a caption track on another origin is not fetched: 503, uncharged, and the other host saw nothing', async () => {
    const acct = await h.account('enterprise', 1000);
    const res = await h.call('grabr_transcript', { video: 'redirected1' }, acct.apiKey);
    expect(res.statusCode).toBe(503);
    expect(json(res).error).toMatchObject({ code: 'tool_unavailable', reason: 'caption_origin' });
    expect(other.requests).toEqual([]);
    await uncharged(acct.accountId, 1000, 0);
  });

  it('a bad video is 400 before anything is fetched', async () => {
    const acct = await h.account('enterprise', 1000);
    const before = yt.requests.length;
    const res = await h.call('grabr_transcript', { video: 'https://vimeo.com/1' }, acct.apiKey);
    expect(res.statusCode).toBe(400);
    expect(json(res).error.code).toBe('invalid_input');
    expect(yt.requests.length).toBe(before);
  });
});

describe('grabr_video_intel through the service', () => {
  it("chapters equal the description's timestamps; metadata, summary, wpm; charged 12 cents", async () => {
    const acct = await h.account('enterprise', 1000);
    const res = await h.call('grabr_video_intel', { video: 'youtu.be/queuetalk01' }, acct.apiKey);
    expect(res.statusCode, res.body).toBe(200);
    const body = json(res);
    expect(body.cost_cents).toBe(12);
    const r = VideoIntelOutput.parse(body.result);
    expect(r).toEqual(body.result);
    expect(r.video).toEqual({ id: 'queuetalk01', title: 'Queue deep dive', channel: 'Tollgate', duration_s: 140, views: 5120 });
    expect(r.chapters_source).toBe('description');
    expect(r.chapters).toEqual([
      { start: 0, end: 62, title: 'Welcome', summary: expect.stringMatching(/^(Welcome to the queue deep dive\.|We start with Redis streams\.)$/) },
      { start: 62, end: 130, title: 'Workers', summary: 'Then workers pick up jobs and report progress.' },
      { start: 130, end: 140, title: 'Outro', summary: 'Thanks for watching!' },
    ]);
    const words = CUES.map((c) => c.text.split(' ').length).reduce((a, b) => a + b, 0);
    expect(r.stats).toEqual({ words, wpm: Math.round((words / (140 / 60)) * 10) / 10 });
    expect(r.transcript).toMatchObject({ available: true, language: 'en', kind: 'manual' });
    expect(await h.credits(acct.accountId)).toBe(1000 - 12);
    expect(await h.ledgerCharges(acct.accountId)).toBe(1);
  });

  it('an empty caption body is 503 here too, uncharged; require_captions turns a missing language into 404', async () => {
    const acct = await h.account('enterprise', 1000);
    const gated = await h.call('grabr_video_intel', { video: 'emptytrack1' }, acct.apiKey);
    expect(gated.statusCode).toBe(503);
    const strict = await h.call('grabr_video_intel', { video: 'queuetalk01', langs: ['ja'], require_captions: true }, acct.apiKey);
    expect(strict.statusCode).toBe(404);
    expect(json(strict).error.code).toBe('no_captions');
    await uncharged(acct.accountId, 1000, 0);
  });

  it('the root protocol: q fills video for both tools in parallel; charged 8 + 12', async () => {
    const acct = await h.account('enterprise', 1000);
    const res = await h.request({
      method: 'POST',
      url: '/',
      headers: { authorization: `Bearer ${acct.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ parallel: ['grabr_transcript', 'grabr_video_intel'], q: 'https://www.youtube.com/watch?v=queuetalk01' }),
    });
    expect(res.statusCode, res.body).toBe(200);
    const body = json(res);
    expect(body.results.grabr_transcript.result.segments).toEqual(CUES);
    expect(body.results.grabr_video_intel.result.chapters.map((c: any) => c.start)).toEqual([0, 62, 130]);
    expect(body.cost_cents).toBe(20);
    expect(await h.credits(acct.accountId)).toBe(1000 - 20);
  });
});

describe('without YOUTUBE_BASE_URL', () => {
  let bare: Harness;
  beforeAll(async () => {
    bare = await startHarness({}, { workers: ['media'] });
  });
  afterAll(async () => {
    await bare?.close();
  });

  it.each(['grabr_transcript', 'grabr_video_intel'])('%s is 503 tool_unavailable at admission: nothing queued, fetched or charged', async (tool) => {
    const acct = await bare.account('enterprise', 1000);
    const before = yt.requests.length;
    const res = await bare.call(tool, findTool(tool)!.examples[0], acct.apiKey);
    expect(res.statusCode).toBe(503);
    expect(json(res).error).toMatchObject({ code: 'tool_unavailable', needs: ['youtube'], message: expect.stringMatching(/YOUTUBE_BASE_URL/) });
    expect(res.headers['x-job-id']).toBeUndefined();
    expect(yt.requests.length).toBe(before);
    expect(await bare.credits(acct.accountId)).toBe(1000);
    expect(await bare.ledgerCharges(acct.accountId)).toBe(0);
  });
});
