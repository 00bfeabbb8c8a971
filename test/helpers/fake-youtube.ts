import http from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A local stand-in for the video site the media tools read (what YOUTUBE_BASE_URL points at):
 * - `GET /watch?v=<id>`: an HTML watch page whose scripts assign `var ytInitialPlayerResponse = {...};`
 *   (playabilityStatus, videoDetails, captions.playerCaptionsTracklistRenderer.captionTracks), next to a
 *   `ytInitialData` decoy, like the real site. An unknown id answers 200 with playabilityStatus ERROR,
 *   as the real site does.
 * - `GET /api/timedtext?v=<id>&lang=<code>[&kind=asr]&fmt=json3`: the track as json3
 *   (`{wireMagic, events: [{tStartMs, dDurationMs, segs: [{utf8}]}]}`); without fmt=json3 it answers
 *   the site's default XML, so a client that forgets the format sees it.
 * Per video: its tracks (each may answer an empty 200, the proof-of-origin gate, or a status; its
 * page URL may be overridden, e.g. to another origin), the page's status, or a raw page. Every
 * request is recorded.
 */

export interface FakeCue {
  /** Seconds. */
  start: number;
  dur: number;
  text: string;
}

export interface FakeTrack {
  lang: string;
  /** 'asr' for automatic captions (json3 then splits each cue into word segs with line-break events, like the site). */
  kind?: 'asr';
  name?: string;
  cues?: FakeCue[];
  /** Answer 200 with an empty body (the proof-of-origin gate). */
  empty?: boolean;
  /** Answer this status instead. */
  status?: number;
  /** Answer this body as is. */
  rawBody?: string;
  /** The baseUrl the page lists (default: this server's /api/timedtext URL for the track). */
  baseUrl?: string;
}

export interface FakeVideo {
  id: string;
  title?: string;
  author?: string;
  lengthSeconds?: number;
  viewCount?: number;
  description?: string;
  keywords?: string[];
  tracks?: FakeTrack[];
  playability?: { status: string; reason?: string };
  /** Answer the watch page with this status (and an error page). */
  pageStatus?: number;
  /** With a 3xx pageStatus: where it redirects (default the site's consent page). */
  location?: string;
  /** Answer the watch page with this HTML as is. */
  rawPage?: string;
}

export interface FakeYoutubeRequest {
  path: string;
  params: Record<string, string>;
  headers: http.IncomingHttpHeaders;
}

export interface FakeYoutube {
  /** e.g. http://127.0.0.1:41234 (what YOUTUBE_BASE_URL takes). */
  url: string;
  requests: FakeYoutubeRequest[];
  videos: Map<string, FakeVideo>;
  add(video: FakeVideo): FakeVideo;
  /** Answer every request with this status until set back to null (429 with Retry-After: 30). */
  failWith: number | null;
  /** Requests for captions (path /api/timedtext). */
  captionRequests(): FakeYoutubeRequest[];
  close(): Promise<void>;
}

/** The json3 document of a track, shaped like the site's: a window event first; automatic tracks in word segs with line-break appends. */
export function json3Of(track: FakeTrack): string {
  const cues = track.cues ?? [];
  const events: unknown[] = [
    { tStartMs: 0, dDurationMs: Math.round(((cues.at(-1)?.start ?? 0) + (cues.at(-1)?.dur ?? 0)) * 1000), id: 1, wpWinPosId: 1, wsWinStyleId: 1 },
  ];
  for (const c of cues) {
    const tStartMs = Math.round(c.start * 1000);
    const dDurationMs = Math.round(c.dur * 1000);
    if (track.kind === 'asr') {
      const words = c.text.split(' ');
      events.push({
        tStartMs,
        dDurationMs,
        wWinId: 1,
        segs: words.map((w, i) => (i === 0 ? { utf8: w, acAsrConf: 0 } : { utf8: ` ${w}`, tOffsetMs: i * 200, acAsrConf: 0 })),
      });
      events.push({ tStartMs: tStartMs + dDurationMs, dDurationMs: 10, wWinId: 1, aAppend: 1, segs: [{ utf8: '\n' }] });
    } else {
      events.push({ tStartMs, dDurationMs, segs: [{ utf8: c.text }] });
    }
  }
  return JSON.stringify({ wireMagic: 'pb3', pens: [{}], wsWinStyles: [{}], wpWinPositions: [{}], events });
}

function trackUrl(base: string, id: string, t: FakeTrack): string {
  const u = new URL('/api/timedtext', base);
  u.searchParams.set('v', id);
  u.searchParams.set('ei', 'abcDEF');
  u.searchParams.set('caps', 'asr');
  u.searchParams.set('xoaf', '5');
  u.searchParams.set('hl', 'en');
  u.searchParams.set('lang', t.lang);
  if (t.kind === 'asr') u.searchParams.set('kind', 'asr');
  u.searchParams.set('sparams', 'ip,ipbits,expire,v,ei,caps,opi,xoaf');
  u.searchParams.set('signature', 'ABCDEF0123456789');
  return u.href;
}

/** What the real site's HTML escapes inside scripts. */
const scriptJson = (v: unknown) => JSON.stringify(v).replace(/</g, '\\u003c').replace(/>/g, '\\u003e').replace(/&/g, '\\u0026');

function watchPage(base: string, v: FakeVideo | undefined, id: string): string {
  const player = v
    ? {
        responseContext: { serviceTrackingParams: [{ service: 'GFEEDBACK', params: [{ key: 'is_viewed_once', value: '0' }] }] },
        playabilityStatus: v.playability ?? { status: 'OK', playableInEmbed: true },
        streamingData: { expiresInSeconds: '21540', formats: [] },
        ...(v.tracks?.length
          ? {
              captions: {
                playerCaptionsTracklistRenderer: {
                  captionTracks: v.tracks.map((t) => ({
                    baseUrl: t.baseUrl ?? trackUrl(base, v.id, t),
                    name: { simpleText: t.name ?? (t.kind === 'asr' ? `${t.lang} (auto-generated)` : t.lang) },
                    vssId: `${t.kind === 'asr' ? 'a' : ''}.${t.lang}`,
                    languageCode: t.lang,
                    ...(t.kind ? { kind: t.kind } : {}),
                    isTranslatable: true,
                    trackName: '',
                  })),
                  audioTracks: [{ captionTrackIndices: v.tracks.map((_, i) => i) }],
                  translationLanguages: [{ languageCode: 'de', languageName: { simpleText: 'German' } }],
                  defaultAudioTrackIndex: 0,
                },
              },
            }
          : {}),
        videoDetails: {
          videoId: v.id,
          title: v.title ?? 'Untitled',
          lengthSeconds: String(v.lengthSeconds ?? 0),
          keywords: v.keywords ?? [],
          channelId: 'UC0123456789abcdefghijkl',
          isOwnerViewing: false,
          shortDescription: v.description ?? '',
          isCrawlable: true,
          thumbnail: { thumbnails: [{ url: `${base}/vi/${v.id}/default.jpg`, width: 120, height: 90 }] },
          allowRatings: true,
          viewCount: String(v.viewCount ?? 0),
          author: v.author ?? 'Someone',
          isPrivate: false,
          isUnpluggedCorpus: false,
          isLiveContent: false,
        },
      }
    : { responseContext: {}, playabilityStatus: { status: 'ERROR', reason: 'Video unavailable' } };
  // A decoy before the player response: another assignment, with braces inside strings.
  const data = { contents: { note: 'not the player } response {', videoId: id } };
  return (
    '<!DOCTYPE html><html lang="en" dir="ltr"><head><title>' +
    `${v?.title ?? ''} - YouTube</title><script nonce="n0nce">var ytcfg = {"EXPERIMENT_FLAGS":{"a":true}};</script></head><body>` +
    `<script nonce="n0nce">var ytInitialPlayerResponse = ${scriptJson(player)};var meta = document.createElement('meta'); meta.name = 'referrer'; meta.content = 'origin-when-cross-origin'; document.getElementsByTagName('head')[0].appendChild(meta);</script>` +
    `<div id="player"></div><script nonce="n0nce">var ytInitialData = ${scriptJson(data)};</script>` +
    '</body></html>'
  );
}

export async function startFakeYoutube(): Promise<FakeYoutube> {
  const fake: Omit<FakeYoutube, 'url' | 'close'> & { url?: string; close?: () => Promise<void> } = {
    requests: [],
    videos: new Map(),
    add: (video) => {
      fake.videos.set(video.id, video);
      return video;
    },
    failWith: null,
    captionRequests: () => fake.requests.filter((r) => r.path === '/api/timedtext'),
  };
  const server = http.createServer((req, res) => {
    const u = new URL(req.url ?? '/', 'http://fake');
    const params = Object.fromEntries(u.searchParams.entries());
    fake.requests.push({ path: u.pathname, params, headers: req.headers });
    if (fake.failWith !== null) {
      res
        .writeHead(fake.failWith, { 'content-type': 'text/html', ...(fake.failWith === 429 ? { 'retry-after': '30' } : {}) })
        .end('<html><body>Something went wrong</body></html>');
      return;
    }
    if (u.pathname === '/watch') {
      const id = params['v'] ?? '';
      const video = fake.videos.get(id);
      if (video?.pageStatus) {
        const redirect =
          video.pageStatus >= 300 && video.pageStatus < 400
            ? { location: video.location ?? `https://consent.youtube.com/m?continue=${encodeURIComponent(req.url ?? '')}` }
            : {};
        res.writeHead(video.pageStatus, { 'content-type': 'text/html', ...redirect }).end('<html><body>error</body></html>');
        return;
      }
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(video?.rawPage ?? watchPage(fake.url!, video, id));
      return;
    }
    if (u.pathname === '/api/timedtext') {
      const video = fake.videos.get(params['v'] ?? '');
      const track = video?.tracks?.find((t) => t.lang === params['lang'] && (t.kind ?? '') === (params['kind'] ?? ''));
      if (!track) {
        res.writeHead(404).end();
        return;
      }
      if (track.status) {
        res.writeHead(track.status, { 'content-type': 'text/html' }).end('<html><body>error</body></html>');
        return;
      }
      if (track.empty) {
        res.writeHead(200, { 'content-type': 'text/html; charset=UTF-8', 'content-length': '0' }).end();
        return;
      }
      if (track.rawBody !== undefined) {
        res.writeHead(200, { 'content-type': 'application/json; charset=UTF-8' }).end(track.rawBody);
        return;
      }
      if (params['fmt'] !== 'json3') {
        const xml = (track.cues ?? []).map((c) => `<text start="${c.start}" dur="${c.dur}">${c.text}</text>`).join('');
        res.writeHead(200, { 'content-type': 'text/xml; charset=UTF-8' }).end(`<?xml version="1.0" encoding="utf-8" ?><transcript>${xml}</transcript>`);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json; charset=UTF-8' }).end(json3Of(track));
      return;
    }
    res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  fake.url = `http://127.0.0.1:${port}`;
  fake.close = () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return fake as FakeYoutube;
}
