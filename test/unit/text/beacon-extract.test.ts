import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { beaconExtract, MAX_ENTITIES } from '../../../src/tools/text/beacon-extract.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const run = (input: unknown) => beaconExtract.handler(beaconExtract.input.parse(input), makeToolContext().ctx);

const PIECES = [
  'Email Ops@Example.com today.',
  'Call +44 20 7946 0958 or (415) 555-2671.',
  'Due 2026-01-15 or 15 January 2026.',
  'Budget: $2.5 million, or 300 EUR.',
  'It weighs 12 kg and uses 35% CPU.',
  'Barack Obama met Angela Merkel in Paris.',
  'Server 192.168.1.20 and ::1 and 2001:db8::8a2e:370:7334.',
  'Logs in /var/log/app.log and C:\\Users\\me\\file.txt.',
  'See https://example.com/a_(b) now.',
  'status: ok',
  '\n',
];

describe('beacon_extract', () => {
  it('every slice equals its entity; offsets ordered; same input, same output', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.oneof(fc.constantFrom(...PIECES), fc.string({ maxLength: 30 })), { minLength: 1, maxLength: 25 }), async (parts) => {
        const text = parts.join(' ');
        if (!text) return;
        const r = await run({ text });
        expect(beaconExtract.outputSchema!.parse(r)).toEqual(r);
        for (const e of r.entities) expect(text.slice(e.start, e.end)).toBe(e.text);
        for (const f of r.facts) expect(text.slice(f.start, f.end)).toBe(f.text);
        for (let k = 1; k < r.entities.length; k++) expect(r.entities[k]!.start).toBeGreaterThanOrEqual(r.entities[k - 1]!.start);
        expect(JSON.stringify(await run({ text }))).toBe(JSON.stringify(r));
      }),
      { numRuns: 60 },
    );
  });

  it('phone numbers are in E.164', async () => {
    const r = await run({ text: 'Call +44 20 7946 0958 or (415) 555-2671, fax 020 7946 0000.', types: ['phone'] });
    expect(r.entities.map((e) => [e.text, e.value])).toEqual([
      ['+44 20 7946 0958', '+442079460958'],
      ['(415) 555-2671', '+14155552671'],
    ]);
    const gb = await run({ text: 'Ring 020 7946 0958.', default_region: 'GB' });
    expect(gb.entities).toEqual([{ type: 'phone', text: '020 7946 0958', start: 5, end: 18, value: '+442079460958' }]);
    for (const e of [...r.entities, ...gb.entities]) expect(e.value).toMatch(/^\+[1-9]\d{6,14}$/);
  });

  it('finds each type with normalised values', async () => {
    const text =
      'Write to Ops@Example.com or see https://example.com/docs. On January 5, 2026 and 2026-02-01 we paid $1,200 and 30 EUR for 12 kg.\n' +
      'Host 10.0.0.1 serves /srv/app/main.js.\nBarack Obama spoke at Google in Paris.\nowner: platform team';
    const r = await run({ text });
    const by = (t: string) => r.entities.filter((e) => e.type === t).map((e) => [e.text, e.value]);
    expect(by('email')).toEqual([['Ops@Example.com', 'ops@example.com']]);
    expect(by('url')).toEqual([['https://example.com/docs', 'https://example.com/docs']]);
    expect(by('date')).toEqual([
      ['January 5, 2026', '2026-01-05'],
      ['2026-02-01', '2026-02-01'],
    ]);
    expect(by('money')).toEqual([
      ['$1,200', '1200 USD'],
      ['30 EUR', '30 EUR'],
    ]);
    expect(by('quantity')).toEqual([['12 kg', '12 kg']]);
    expect(by('ip')).toEqual([['10.0.0.1', '10.0.0.1']]);
    expect(by('path')).toEqual([['/srv/app/main.js', '/srv/app/main.js']]);
    expect(by('person')).toEqual([['Barack Obama', null]]);
    expect(by('organisation')).toEqual([['Google', null]]);
    expect(by('place')).toEqual([['Paris', null]]);
    expect(by('key_value')).toEqual([['owner: platform team', 'platform team']]);
    expect(r.facts.map((f) => f.text)).toEqual(['On January 5, 2026 and 2026-02-01 we paid $1,200 and 30 EUR for 12 kg.']);
    expect(r.facts[0]!.entities.map((k) => r.entities[k]!.type)).toEqual(['date', 'date', 'money', 'money', 'quantity']);
  });

  it('leaves ambiguous numeric dates without a value and refuses invalid ones', async () => {
    const r = await run({ text: 'On 03/04/2026, 25/12/2026 and 2026-02-30.', types: ['date'] });
    expect(r.entities.map((e) => e.value)).toEqual([null, '2026-12-25', null]);
  });

  it('refuses text past 400,000 characters and bad regions (schema)', () => {
    expect(beaconExtract.input.safeParse({ text: 'a'.repeat(400_001) }).success).toBe(false);
    expect(beaconExtract.input.safeParse({ text: 'a', default_region: 'gb' }).success).toBe(false);
    expect(beaconExtract.input.safeParse({ text: 'a', types: ['nope'] }).success).toBe(false);
  });

  it('largestInput finishes inside its limits and truncates at the entity cap', async () => {
    const input = beaconExtract.largestInput!();
    expect(input.text.length).toBe(400_000);
    const t = cpuNow();
    const r = await run(input);
    expect(cpuNow() - t).toBeLessThan(beaconExtract.limits!.timeMs!);
    expect(r.entities.length).toBe(MAX_ENTITIES);
    expect(r.truncated).toBe(true);
  }, 60_000);
});
