import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { videoIntelTask, type IntelInput } from '../../../src/tools/media/analyse.js';
import { VideoIntelOutput } from '../../../src/tools/media/video-intel.js';
import { cuesOf } from './fixtures.js';

const input = (cues: Array<{ start: number; dur: number; text: string }>, over: Partial<IntelInput> = {}): IntelInput => ({
  title: '',
  description: '',
  tags: [],
  duration_s: null,
  starts: cues.map((c) => c.start),
  durs: cues.map((c) => c.dur),
  texts: cues.map((c) => c.text),
  max_keywords: 15,
  summary_sentences: 5,
  ...over,
});

const Analysis = VideoIntelOutput.pick({ chapters: true, chapters_source: true, keywords: true, entities: true, summary: true, summary_source: true });

describe('yt_intel', () => {
  it('any transcript and description: a valid, deterministic answer; chapters ascend; summaries are said words', () => {
    const word = fc.constantFrom('coffee', 'grind', 'Redis', 'queue', 'bicycle', 'chain', 'the', 'and', 'um', 'Paris', 'Ada', 'test', '42', 'naïve', '日本');
    const text = fc.tuple(fc.array(word, { minLength: 1, maxLength: 25 }), fc.constantFrom('.', '', '!', '?')).map(([w, end]) => w.join(' ') + end);
    const cues = fc.array(fc.tuple(text, fc.double({ min: 0.1, max: 20, noNaN: true })), { maxLength: 120 }).map((xs) => {
      let t = 0;
      return xs.map(([s, d]) => {
        const cue = { start: Math.round(t * 1000) / 1000, dur: Math.round(d * 1000) / 1000, text: s };
        t += d;
        return cue;
      });
    });
    fc.assert(
      fc.property(cues, fc.string({ maxLength: 200 }), fc.option(fc.integer({ min: 0, max: 10_000 }), { nil: null }), (cs, description, duration) => {
        const inp = input(cs, { description, duration_s: duration, title: 'A title about coffee' });
        const r = videoIntelTask(inp);
        expect(Analysis.parse(r)).toBeTruthy();
        expect(JSON.stringify(videoIntelTask(inp))).toBe(JSON.stringify(r));
        for (let i = 1; i < r.chapters.length; i++) expect(r.chapters[i]!.start).toBeGreaterThan(r.chapters[i - 1]!.start);
        for (const c of r.chapters) if (c.end !== null) expect(c.end).toBeGreaterThanOrEqual(c.start);
        const joined = cs.map((c) => c.text).join(' ');
        if (r.summary_source === 'transcript') for (const c of r.chapters) if (c.summary && !c.summary.endsWith('…')) expect(joined).toContain(c.summary);
        expect(r.words).toBe(cs.length ? (joined.match(/[\p{L}\p{N}]+(?:['’][\p{L}]+)*/gu) ?? []).length : 0);
        expect(r.wpm === null).toBe(r.words === 0 || !((duration ?? 0) > 0 || cs.some((c) => c.start + c.dur > 0)));
      }),
      { numRuns: 60 },
    );
  });

  it('wpm over the duration, or over the transcript when the page gives none (live)', () => {
    const cues = [
      { start: 0, dur: 30, text: 'one two three four five six seven eight nine ten' },
      { start: 30, dur: 30, text: 'eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty' },
    ];
    expect(videoIntelTask(input(cues, { duration_s: 120 })).wpm).toBe(10);
    expect(videoIntelTask(input(cues, { duration_s: 0 })).wpm).toBe(20);
    expect(videoIntelTask(input([], { duration_s: 120 }))).toMatchObject({
      wpm: null,
      words: 0,
      chapters: [],
      chapters_source: 'none',
      summary_source: 'none',
    });
  });

  it('a repeated two-word phrase is one keyword and takes its words; overlapping phrases are not listed', () => {
    const sentences = Array.from({ length: 6 }, (_, i) => [
      `Machine learning models need data, lesson ${i}.`,
      'Training machine learning models takes time and GPUs.',
      'Evaluation shows whether machine learning helps.',
    ]).flat();
    const r = videoIntelTask(input(cuesOf(sentences)));
    const terms = r.keywords.map((k) => k.term);
    expect(r.keywords[0]).toEqual({ term: 'machine learning', score: 1, count: 18 });
    for (const t of ['machine', 'learning', 'learning models', 'Training machine', 'learning helps']) expect(terms).not.toContain(t);
    expect(terms).toEqual(expect.arrayContaining(['models', 'data', 'GPUs', 'Evaluation']));
    for (const k of r.keywords) expect(k.score).toBeGreaterThan(0);
    expect(terms.some((t) => ['the', 'and', 'takes', 'whether', 'shows'].includes(t.toLowerCase()))).toBe(false);
  });

  it('of two equally frequent words, the one in the title ranks first, then one in the description', () => {
    const sentences = Array.from({ length: 10 }, () => [
      'We deploy with Kubernetes today.',
      'We provision with Terraform today.',
      'We monitor with Grafana today.',
    ]).flat();
    const cues = cuesOf(sentences);
    const order = (title: string, description: string) =>
      videoIntelTask(input(cues, { title, description }))
        .keywords.map((k) => k.term)
        .filter((t) => ['Kubernetes', 'Terraform', 'Grafana'].includes(t));
    expect(order('', '')).toEqual(['Kubernetes', 'Terraform', 'Grafana']);
    expect(order('Grafana for beginners', 'All about Terraform.')).toEqual(['Grafana', 'Terraform', 'Kubernetes']);
  });

  it('people, organisations and places from the title, description and transcript, grouped and counted', () => {
    const cues = cuesOf([
      'Yesterday Barack Obama spoke in Chicago about clean energy.',
      "Later, Obama's team met engineers from Microsoft.",
      'Microsoft announced a new data centre near Dublin.',
      'Barack Obama thanked the volunteers.',
    ]);
    const r = videoIntelTask(input(cues, { title: 'Obama in Chicago' }));
    const byText = Object.fromEntries(r.entities.map((e) => [e.text, e]));
    expect(byText['Barack Obama']?.type ?? byText['Obama']?.type).toBe('person');
    expect(byText['Microsoft']).toMatchObject({ type: 'organisation', count: 2 });
    expect(byText['Chicago']?.type).toBe('place');
    expect(byText['Dublin']?.type).toBe('place');
    // Sorted by count, then first appearance.
    for (let i = 1; i < r.entities.length; i++) expect(r.entities[i]!.count).toBeLessThanOrEqual(r.entities[i - 1]!.count);
  });

  it('the summary takes the best-ranked sentences once each, in the order they were said, within summary_sentences', () => {
    const sentences = [
      'Queues hold jobs for workers.',
      'Workers take jobs from queues.',
      'The weather was nice.',
      'Queues hold jobs for workers.',
      'Jobs in queues wait for workers.',
    ];
    const r = videoIntelTask(input(cuesOf(sentences), { summary_sentences: 2 }));
    const parts = r.summary.split(/(?<=\.) /);
    expect(parts).toHaveLength(2);
    expect(new Set(parts).size).toBe(2);
    for (const p of parts) expect(sentences).toContain(p);
    expect(sentences.indexOf(parts[0]!)).toBeLessThan(sentences.lastIndexOf(parts[1]!));
    expect(r.summary).not.toContain('weather');
  });
});
