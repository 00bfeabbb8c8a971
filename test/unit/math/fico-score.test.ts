import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { ficoScore, estimateFico, FicoProfile, type FicoProfileT } from '../../../src/tools/math/fico-score.js';
import { makeToolContext } from '../../helpers/tool-context.js';
import { cpuNow } from '../../helpers/cpu-clock.js';

const { ctx } = makeToolContext();
const run = async (profile: Record<string, unknown>) => {
  const out = await ficoScore.handler(ficoScore.input.parse({ profile }), ctx);
  expect(ficoScore.outputSchema!.safeParse(out).success).toBe(true);
  return out;
};

const perfect: FicoProfileT = {
  late_payments_30: 0,
  late_payments_60_plus: 0,
  derogatory_marks: 0,
  utilization_percent: 0,
  oldest_account_years: 30,
  average_account_age_years: 15,
  hard_inquiries_12m: 0,
  new_accounts_12m: 0,
  revolving_accounts: 3,
  installment_accounts: 2,
};

const profileArb: fc.Arbitrary<FicoProfileT> = fc
  .record({
    late_payments_30: fc.integer({ min: 0, max: 100 }),
    late_payments_60_plus: fc.integer({ min: 0, max: 100 }),
    derogatory_marks: fc.integer({ min: 0, max: 50 }),
    utilization_percent: fc.double({ min: 0, max: 100, noNaN: true }),
    oldest_account_years: fc.double({ min: 0, max: 80, noNaN: true }),
    average_fraction: fc.double({ min: 0, max: 1, noNaN: true }),
    hard_inquiries_12m: fc.integer({ min: 0, max: 100 }),
    new_accounts_12m: fc.integer({ min: 0, max: 100 }),
    revolving_accounts: fc.integer({ min: 0, max: 200 }),
    installment_accounts: fc.integer({ min: 0, max: 200 }),
  })
  .map(({ average_fraction, ...p }) => ({ ...p, average_account_age_years: p.oldest_account_years * average_fraction }));

describe('fico_score', () => {
  it('a perfect profile gives 850, band exceptional, no levers', async () => {
    const r = await run(perfect);
    expect(r.estimate).toBe(850);
    expect(r.band).toBe('exceptional');
    expect(r.levers).toEqual([]);
    expect(r.factors.map((f) => f.weight)).toEqual([35, 30, 15, 10, 10]);
  });

  it('the worst profile gives 300; estimate = 300 + 5.5·Σ w·s', async () => {
    const worst = {
      ...perfect,
      late_payments_30: 9,
      late_payments_60_plus: 9,
      derogatory_marks: 3,
      utilization_percent: 100,
      oldest_account_years: 0,
      average_account_age_years: 0,
      hard_inquiries_12m: 20,
      new_accounts_12m: 9,
      revolving_accounts: 0,
      installment_accounts: 0,
    };
    const r = await run(worst);
    // history (10+10)/2 = 10, new credit (10+40)/2 = 25: 300 + 5.5·(0.15·10 + 0.10·25) = 322
    expect(r.estimate).toBe(322);
    const mid = await run({
      ...perfect,
      late_payments_30: 1,
      utilization_percent: 34,
      oldest_account_years: 6,
      average_account_age_years: 3.5,
      hard_inquiries_12m: 2,
      new_accounts_12m: 1,
    });
    const sum = mid.factors.reduce((s, f) => s + (f.weight / 100) * f.subscore, 0);
    expect(mid.estimate).toBe(Math.round(300 + 5.5 * sum));
    expect(mid.estimate).toBe(710);
    expect(mid.band).toBe('good');
    expect(mid.levers[0]!.factor).toBe('amounts_owed');
  });

  it("bands are myFICO's: 579 poor, 580 fair, 669 fair, 670 good, 740 very good, 800 exceptional", async () => {
    const bandOf = (e: number) => (e < 580 ? 'poor' : e < 670 ? 'fair' : e < 740 ? 'good' : e < 800 ? 'very good' : 'exceptional');
    await fc.assert(
      fc.property(profileArb, (p) => {
        const r = estimateFico(p);
        expect(r.band).toBe(bandOf(r.estimate));
        expect(r.estimate).toBeGreaterThanOrEqual(300);
        expect(r.estimate).toBeLessThanOrEqual(850);
        expect(r.range.low).toBeLessThanOrEqual(r.estimate);
        expect(r.range.high).toBeGreaterThanOrEqual(r.estimate);
      }),
      { numRuns: 300 },
    );
  });

  it('property: improving any one factor never lowers the estimate', () => {
    type Improve = (p: FicoProfileT, by: number) => FicoProfileT;
    const improvements: Record<string, Improve> = {
      fewer_30_day_lates: (p, by) => ({ ...p, late_payments_30: Math.max(0, p.late_payments_30 - by) }),
      fewer_60_day_lates: (p, by) => ({ ...p, late_payments_60_plus: Math.max(0, p.late_payments_60_plus - by) }),
      fewer_derogatory_marks: (p, by) => ({ ...p, derogatory_marks: Math.max(0, p.derogatory_marks - by) }),
      lower_utilisation: (p, by) => ({ ...p, utilization_percent: Math.max(0, p.utilization_percent - by) }),
      older_oldest_account: (p, by) => ({ ...p, oldest_account_years: Math.min(80, p.oldest_account_years + by) }),
      older_average_age: (p, by) => ({ ...p, average_account_age_years: Math.min(p.oldest_account_years, p.average_account_age_years + by) }),
      fewer_inquiries: (p, by) => ({ ...p, hard_inquiries_12m: Math.max(0, p.hard_inquiries_12m - by) }),
      fewer_new_accounts: (p, by) => ({ ...p, new_accounts_12m: Math.max(0, p.new_accounts_12m - by) }),
      add_revolving: (p, by) => ({ ...p, revolving_accounts: Math.min(200, p.revolving_accounts + by) }),
      add_installment: (p, by) => ({ ...p, installment_accounts: Math.min(200, p.installment_accounts + by) }),
    };
    fc.assert(
      fc.property(profileArb, fc.constantFrom(...Object.keys(improvements)), fc.integer({ min: 1, max: 40 }), (p, which, by) => {
        const better = improvements[which]!(p, by);
        expect(FicoProfile.safeParse(better).success).toBe(true);
        expect(estimateFico(better).estimate).toBeGreaterThanOrEqual(estimateFico(p).estimate);
      }),
      { numRuns: 2000 },
    );
  });

  it('lower utilisation never lowers the estimate (all else equal)', () => {
    fc.assert(
      fc.property(profileArb, fc.double({ min: 0, max: 100, noNaN: true }), fc.double({ min: 0, max: 100, noNaN: true }), (p, a, b) => {
        const [lo, hi] = a <= b ? [a, b] : [b, a];
        expect(estimateFico({ ...p, utilization_percent: lo }).estimate).toBeGreaterThanOrEqual(estimateFico({ ...p, utilization_percent: hi }).estimate);
      }),
    );
  });

  it('strict schema: identity fields and other unknown keys are refused; caps', () => {
    for (const extra of [{ name: 'Jane Doe' }, { ssn: '123-45-6789' }, { date_of_birth: '1990-01-01' }, { address: 'x' }]) {
      expect(ficoScore.input.safeParse({ profile: { ...perfect, ...extra } }).success, JSON.stringify(extra)).toBe(false);
    }
    expect(ficoScore.input.safeParse({ profile: perfect, applicant: 'someone' }).success).toBe(false);
    expect(ficoScore.input.safeParse({ profile: { ...perfect, utilization_percent: 101 } }).success).toBe(false);
    expect(ficoScore.input.safeParse({ profile: { ...perfect, late_payments_30: -1 } }).success).toBe(false);
    expect(ficoScore.input.safeParse({ profile: { ...perfect, average_account_age_years: 31 } }).success).toBe(false);
    const { hard_inquiries_12m: _omit, ...missing } = perfect;
    expect(ficoScore.input.safeParse({ profile: missing }).success).toBe(false);
  });

  it('says it is an educational estimate and not a FICO® Score; deterministic; largestInput is instant', async () => {
    const r = await run(perfect);
    expect(r.disclaimer).toContain('not a FICO® Score');
    expect(r.disclaimer).toContain('Educational estimate');
    expect(r.not_a_fico_score).toBe(true);
    for (const ex of ficoScore.examples) expect(JSON.stringify(await run(ex.profile))).toBe(JSON.stringify(await run(ex.profile)));
    const t = cpuNow();
    await ficoScore.handler(ficoScore.input.parse(ficoScore.largestInput!()), ctx);
    const ms = cpuNow() - t;
    expect(ms).toBeLessThan(ficoScore.limits!.timeMs!);
    console.log(`fico_score largestInput: ${ms.toFixed(2)} ms`);
  });
});
