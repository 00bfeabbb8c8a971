import { describe, expect, it } from 'vitest';
import { averageLinkage, foldClusterTask, similarityMatrix } from '../../../src/tools/llm/fold-cluster.js';
import { findVerbatim, jaccard, mapSettled, mergeMeta, stems } from '../../../src/tools/llm/tool-kit.js';
import { chunkSpans, selectPassagesTask } from '../../../src/tools/llm/plus-passages.js';
import { consensusOf } from '../../../src/tools/llm/hints-parade.js';
import { countTokensA } from '../../../src/tools/text/tiktoken-count.js';
import { runTaskInline } from '../../../src/tools/tasks.js';

/** The pure parts of llm group B: clustering, consensus, verbatim matching, passage selection. */

describe('stems and jaccard', () => {
  it('stems content words and drops stop words', () => {
    expect(stems('The customers are inviting their friends')).toEqual(['custom', 'invit', 'friend']);
    expect(stems('Invites a friend')).toEqual(['invit', 'friend']);
  });
  it('jaccard of sets', () => {
    expect(jaccard(new Set(['a', 'b']), new Set(['b', 'c']))).toBeCloseTo(1 / 3);
    expect(jaccard(new Set(), new Set())).toBe(0);
  });
});

describe('idea_fold clustering', () => {
  const ideas = [
    'Offer a referral discount to customers who invite friends', // 0
    'Rewrite the onboarding emails to be shorter', // 1
    'Customers who invite friends get a referral discount', // 2
    'Sponsor a local running club', // 3
    'Shorter onboarding emails, rewritten', // 4
    '!!!', // 5: no content words
  ];

  it('puts paraphrases in one cluster and leaves unrelated ideas alone', () => {
    const { clusters, cohesion } = foldClusterTask({ texts: ideas, threshold: 0.3 });
    expect(clusters).toEqual([[0, 2], [1, 4], [3], [5]]);
    expect(cohesion[0]).toBeGreaterThan(0.3);
    expect(cohesion[2]).toBe(1);
  });

  it('is deterministic, and the same through the task table', async () => {
    const a = foldClusterTask({ texts: ideas, threshold: 0.3 });
    const b = await runTaskInline('idea_fold_cluster', { texts: ideas, threshold: 0.3 });
    expect(b).toEqual(a);
  });

  it('threshold 0.95 keeps near-duplicates only; a low threshold folds more', () => {
    const texts = ['fix the login bug', 'fix the login bug', 'login bug fix for mobile', 'paint the office'];
    expect(foldClusterTask({ texts, threshold: 0.95 }).clusters).toEqual([[0, 1], [2], [3]]);
    expect(foldClusterTask({ texts, threshold: 0.2 }).clusters).toEqual([[0, 1, 2], [3]]);
  });

  it('breaks ties by input order', () => {
    // Three identical similarities: the first pair in input order merges first.
    const sim = [Float64Array.of(1, 0.5, 0.5), Float64Array.of(0.5, 1, 0.5), Float64Array.of(0.5, 0.5, 1)];
    expect(averageLinkage(sim, 0.5).clusters).toEqual([[0, 1, 2]]);
    expect(averageLinkage(sim, 0.51).clusters).toEqual([[0], [1], [2]]);
    const sim2 = [Float64Array.of(1, 0.6, 0, 0), Float64Array.of(0.6, 1, 0, 0), Float64Array.of(0, 0, 1, 0.6), Float64Array.of(0, 0, 0.6, 1)];
    expect(averageLinkage(sim2, 0.5).clusters).toEqual([
      [0, 1],
      [2, 3],
    ]);
  });

  it('uses average linkage, not single linkage', () => {
    // 0-1 are close, 2 is close to 1 only: average similarity of {0,1} to 2 is 0.35 < 0.4.
    const sim = [Float64Array.of(1, 0.9, 0), Float64Array.of(0.9, 1, 0.7), Float64Array.of(0, 0.7, 1)];
    expect(averageLinkage(sim, 0.4).clusters).toEqual([[0, 1], [2]]);
    expect(averageLinkage(sim, 0.3).clusters).toEqual([[0, 1, 2]]);
  });

  it('similarities are symmetric cosines in [0, 1]', () => {
    const sim = similarityMatrix(ideas);
    for (let i = 0; i < ideas.length; i++)
      for (let j = 0; j < ideas.length; j++) {
        expect(sim[i]![j]).toBeCloseTo(sim[j]![i]!);
        expect(sim[i]![j]!).toBeGreaterThanOrEqual(0);
        expect(sim[i]![j]!).toBeLessThanOrEqual(1 + 1e-9);
      }
    expect(sim[5]![0]).toBe(0);
  });

  it('clusters the largest input (200 ideas of 2,000 characters) quickly', () => {
    const vocab = Array.from({ length: 3000 }, (_, i) => `w${i.toString(36)}x`);
    let seed = 7;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const texts = Array.from({ length: 200 }, () => {
      let s = '';
      while (s.length < 1990) s += `${vocab[Math.floor(rnd() * vocab.length)]} `;
      return s.slice(0, 2000);
    });
    const t0 = performance.now();
    const { clusters } = foldClusterTask({ texts, threshold: 0.3 });
    expect(performance.now() - t0).toBeLessThan(5_000);
    expect(clusters.flat().sort((a, b) => a - b)).toEqual(texts.map((_, i) => i));
  });
});

describe('hints_parade consensus', () => {
  it('groups similar hints of different personas and keeps the rest unique', () => {
    const { consensus, unique } = consensusOf(
      [
        { persona: 'debugger', hint: 'Add logging around the CSV import to find the slow step' },
        { persona: 'debugger', hint: 'Check whether the partner files grew' },
        { persona: 'performance', hint: 'Profile the CSV import to find the slow step' },
        { persona: 'ops', hint: 'Look at the database disk metrics' },
        { persona: 'ops', hint: 'Add logging to the CSV import and find the slow step' },
      ],
      ['debugger', 'performance', 'ops'],
      0.35,
    );
    expect(consensus).toHaveLength(1);
    expect(consensus[0]!.personas).toEqual(['debugger', 'performance', 'ops']);
    expect(consensus[0]!.support).toBe(3);
    // The member most similar to the others stands for the group.
    expect(consensus[0]!.hint).toBe('Add logging to the CSV import and find the slow step');
    expect(unique).toEqual([
      { persona: 'debugger', hint: 'Check whether the partner files grew' },
      { persona: 'ops', hint: 'Look at the database disk metrics' },
    ]);
  });

  it('never makes consensus out of one persona agreeing with itself', () => {
    const { consensus, unique } = consensusOf(
      [
        { persona: 'tester', hint: 'Write a regression test for the bug' },
        { persona: 'tester', hint: 'Write a regression test for the bug' },
      ],
      ['tester'],
      0.35,
    );
    expect(consensus).toEqual([]);
    expect(unique).toHaveLength(2);
  });
});

describe('findVerbatim', () => {
  const text = 'Rust is  faster\nthan Python, they say.';
  it('matches exactly, or with white space runs as one space', () => {
    expect(findVerbatim(text, 'faster than Python')).toEqual({ start: 9, end: 27 });
    expect(text.slice(9, 27)).toBe('faster\nthan Python');
    expect(findVerbatim(text, 'Rust is faster')).toEqual({ start: 0, end: 15 });
    expect(findVerbatim(text, '  they say. ')).toEqual({ start: 29, end: 38 });
  });
  it('refuses changed words, case, and empty quotes', () => {
    expect(findVerbatim(text, 'Rust is quicker')).toBeNull();
    expect(findVerbatim(text, 'rust is faster')).toBeNull();
    expect(findVerbatim(text, '   ')).toBeNull();
  });
});

describe('mergeMeta and mapSettled', () => {
  it('sums usage and keeps null when no call reported it', () => {
    const u = { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 };
    expect(
      mergeMeta(
        [
          { model: 'm', usage: u, prompt_version: 'x' },
          { model: 'm', usage: null, prompt_version: 'x' },
          { model: 'm', usage: u, prompt_version: 'x' },
        ],
        'p/1',
        'd',
      ),
    ).toEqual({
      model: 'm',
      usage: { prompt_tokens: 2, completion_tokens: 4, total_tokens: 6 },
      prompt_version: 'p/1',
    });
    expect(mergeMeta([], 'p/1', 'd')).toEqual({ model: 'd', usage: null, prompt_version: 'p/1' });
  });

  it('starts nothing after a failure and waits for the calls in flight', async () => {
    const started: number[] = [];
    let finished = 0;
    const err = await mapSettled([0, 1, 2, 3, 4, 5], 2, async (i) => {
      started.push(i);
      await new Promise((r) => setTimeout(r, i === 0 ? 1 : 20));
      finished++;
      if (i === 0) throw new Error('boom');
      return i;
    }).catch((e: Error) => e);
    expect((err as Error).message).toBe('boom');
    expect(started).toEqual([0, 1]);
    expect(finished).toBe(2);
  });
});

describe('genius_plus passages', () => {
  const a = 'Intro line of the page.\nHTTP/2 prioritisation in RFC 9113 deprecates the dependency tree of RFC 7540.\nFooter text here with links.';
  const b = `${'Unrelated filler sentence about gardening and tomatoes. '.repeat(60)}\nThe extensible priority scheme of RFC 9218 replaces it.`;

  it('slices verbatim, orders by source then offset, and holds the budget', () => {
    const { passages, tokens } = selectPassagesTask({
      query: 'RFC 9113 prioritisation dependency tree',
      sources: [
        { n: 1, text: a },
        { n: 2, text: b },
      ],
      budgetTokens: 60,
    });
    expect(passages.length).toBeGreaterThan(0);
    for (const p of passages) expect(p.text).toBe((p.n === 1 ? a : b).slice(p.start, p.end));
    expect(passages.map((p) => [p.n, p.start])).toEqual([...passages.map((p) => [p.n, p.start])].sort((x, y) => x[0]! - y[0]! || x[1]! - y[1]!));
    expect(tokens).toBeLessThanOrEqual(60);
    expect(passages.reduce((t, p) => t + countTokensA(p.text), 0)).toBe(tokens);
    expect(passages.some((p) => p.text.includes('deprecates the dependency tree'))).toBe(true);
  });

  it('cuts long lines into sentence runs of at most 1,200 characters', () => {
    const spans = chunkSpans(b);
    for (const s of spans) expect(s.end - s.start).toBeLessThanOrEqual(1200);
    expect(spans.length).toBeGreaterThan(2);
  });
});
