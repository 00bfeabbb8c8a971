import { z } from 'zod';
import { defineTool } from '../types.js';

/**
 * fico_score: an educational FICO-style estimate from self-reported factors. It does not score other
 * people: the schema is strict and has no identity fields. The category weights are myFICO's public
 * figures (35/30/15/10/10); the sub-score tables below are this tool's own, documented in the README;
 * estimate = 300 + 5.5 · Σ w·s with s in 0..100 and Σ w = 1, so a perfect profile gives 850.
 * Every table is monotonic, so improving one factor never lowers the estimate.
 */

export const FICO_DISCLAIMER =
  'Educational estimate from self-reported factors; this is not a FICO® Score and no lender uses it. ' +
  'It applies the category weights myFICO publishes (payment history 35%, amounts owed 30%, length of credit history 15%, ' +
  'new credit 10%, credit mix 10%) to simple sub-score tables of our own; real FICO® Scores come from your credit reports ' +
  'through models that are not public. FICO is a registered trademark of Fair Isaac Corporation. ' +
  'Use it only about your own credit: it is not for decisions about other people (FCRA, ECOA).';

/** A table: the first row whose `upTo` the value does not exceed gives the sub-score (or penalty). */
type Table = ReadonlyArray<{ upTo: number; value: number; label: string }>;

/** Penalties (points off 100) for the payment-history sub-score. */
export const LATE_30_PENALTY: Table = [
  { upTo: 0, value: 0, label: '0' },
  { upTo: 1, value: 15, label: '1' },
  { upTo: 2, value: 25, label: '2' },
  { upTo: 4, value: 35, label: '3-4' },
  { upTo: Infinity, value: 45, label: '5+' },
];
export const LATE_60_PENALTY: Table = [
  { upTo: 0, value: 0, label: '0' },
  { upTo: 1, value: 25, label: '1' },
  { upTo: 2, value: 40, label: '2' },
  { upTo: Infinity, value: 55, label: '3+' },
];
export const DEROGATORY_PENALTY: Table = [
  { upTo: 0, value: 0, label: '0' },
  { upTo: 1, value: 45, label: '1' },
  { upTo: Infinity, value: 65, label: '2+' },
];
/** Sub-scores. Utilisation in percent: a row holds values below its bound. */
export const UTILISATION: Table = [
  { upTo: 10, value: 100, label: 'under 10%' },
  { upTo: 30, value: 85, label: '10 to under 30%' },
  { upTo: 50, value: 65, label: '30 to under 50%' },
  { upTo: 75, value: 40, label: '50 to under 75%' },
  { upTo: 90, value: 20, label: '75 to under 90%' },
  { upTo: Infinity, value: 0, label: '90-100%' },
];
/** Years, descending tables read from the top: the highest bound the value reaches. */
export const OLDEST_ACCOUNT: Table = [
  { upTo: 2, value: 10, label: 'under 2 years' },
  { upTo: 5, value: 30, label: '2-5' },
  { upTo: 10, value: 50, label: '5-10' },
  { upTo: 15, value: 70, label: '10-15' },
  { upTo: 25, value: 85, label: '15-25' },
  { upTo: Infinity, value: 100, label: '25+' },
];
export const AVERAGE_AGE: Table = [
  { upTo: 1, value: 10, label: 'under 1 year' },
  { upTo: 3, value: 30, label: '1-3' },
  { upTo: 5, value: 50, label: '3-5' },
  { upTo: 7, value: 70, label: '5-7' },
  { upTo: 10, value: 85, label: '7-10' },
  { upTo: Infinity, value: 100, label: '10+' },
];
export const INQUIRIES: Table = [
  { upTo: 0, value: 100, label: '0' },
  { upTo: 1, value: 85, label: '1' },
  { upTo: 2, value: 70, label: '2' },
  { upTo: 4, value: 50, label: '3-4' },
  { upTo: 6, value: 30, label: '5-6' },
  { upTo: Infinity, value: 10, label: '7+' },
];
export const NEW_ACCOUNTS: Table = [
  { upTo: 0, value: 100, label: '0' },
  { upTo: 1, value: 85, label: '1' },
  { upTo: 2, value: 65, label: '2' },
  { upTo: Infinity, value: 40, label: '3+' },
];
export const MIX = { none: 0, installment_only: 50, revolving_only: 60, both: 100 } as const;

/** Utilisation and age tables use "below the bound" (under 2 years → first row); the count tables "at most". */
function lookup(table: Table, v: number, strictlyBelow = false): number {
  for (const row of table) if (strictlyBelow ? v < row.upTo : v <= row.upTo) return row.value;
  return table[table.length - 1]!.value;
}

export const BANDS = [
  { min: 300, max: 579, band: 'poor' },
  { min: 580, max: 669, band: 'fair' },
  { min: 670, max: 739, band: 'good' },
  { min: 740, max: 799, band: 'very good' },
  { min: 800, max: 850, band: 'exceptional' },
] as const;

const count = (max: number, what: string) => z.number().int().min(0).max(max).describe(what);

export const FicoProfile = z
  .object({
    late_payments_30: count(100, 'Payments 30-59 days late in the last 7 years'),
    late_payments_60_plus: count(100, 'Payments 60 or more days late in the last 7 years'),
    derogatory_marks: count(50, 'Collections, charge-offs, bankruptcies, foreclosures or other public records on file'),
    utilization_percent: z.number().min(0).max(100).describe('Revolving balances as a percent of total revolving credit limits (0-100)'),
    oldest_account_years: z.number().min(0).max(80).describe('Age of your oldest account, in years'),
    average_account_age_years: z.number().min(0).max(80).describe('Average age of your accounts, in years (not more than the oldest)'),
    hard_inquiries_12m: count(100, 'Hard credit inquiries in the last 12 months'),
    new_accounts_12m: count(100, 'Accounts opened in the last 12 months'),
    revolving_accounts: count(200, 'Open revolving accounts (credit cards, lines of credit)'),
    installment_accounts: count(200, 'Open or recent installment loans (mortgage, auto, student, personal)'),
  })
  .strict()
  .refine((p) => p.average_account_age_years <= p.oldest_account_years, {
    message: 'average_account_age_years cannot exceed oldest_account_years',
    path: ['average_account_age_years'],
  });
export type FicoProfileT = z.output<typeof FicoProfile>;

const FicoInput = z
  .object({ profile: FicoProfile.describe('Your own self-reported credit factors (no names, numbers or identifiers: unknown keys are refused)') })
  .strict();

const FACTORS = ['payment_history', 'amounts_owed', 'length_of_history', 'new_credit', 'credit_mix'] as const;
const WEIGHTS: Record<(typeof FACTORS)[number], number> = { payment_history: 35, amounts_owed: 30, length_of_history: 15, new_credit: 10, credit_mix: 10 };

const FicoOutput = z.object({
  estimate: z.number().int().min(300).max(850),
  range: z.object({ low: z.number().int(), high: z.number().int() }).describe('The estimate ± 25 points, within 300-850: the tables are approximate'),
  band: z.enum(['poor', 'fair', 'good', 'very good', 'exceptional']),
  factors: z.array(
    z.object({
      factor: z.enum(FACTORS),
      weight: z.number().describe('Weight in percent (myFICO)'),
      subscore: z.number().min(0).max(100),
      points: z.number().describe('Points above 300 this factor contributes: 5.5 · weight/100 · subscore'),
      max_points: z.number(),
    }),
  ),
  levers: z
    .array(z.object({ factor: z.enum(FACTORS), action: z.string(), potential_points: z.number().int() }))
    .describe('What would raise the estimate most, largest first'),
  disclaimer: z.string(),
  not_a_fico_score: z.literal(true),
});
type FicoResult = z.infer<typeof FicoOutput>;

export function subscores(p: FicoProfileT): Record<(typeof FACTORS)[number], number> {
  const payment = Math.max(
    0,
    100 - lookup(LATE_30_PENALTY, p.late_payments_30) - lookup(LATE_60_PENALTY, p.late_payments_60_plus) - lookup(DEROGATORY_PENALTY, p.derogatory_marks),
  );
  const history = (lookup(OLDEST_ACCOUNT, p.oldest_account_years, true) + lookup(AVERAGE_AGE, p.average_account_age_years, true)) / 2;
  const newCredit = (lookup(INQUIRIES, p.hard_inquiries_12m) + lookup(NEW_ACCOUNTS, p.new_accounts_12m)) / 2;
  const mix =
    p.revolving_accounts > 0 && p.installment_accounts > 0
      ? MIX.both
      : p.revolving_accounts > 0
        ? MIX.revolving_only
        : p.installment_accounts > 0
          ? MIX.installment_only
          : MIX.none;
  return {
    payment_history: payment,
    amounts_owed: lookup(UTILISATION, p.utilization_percent, true),
    length_of_history: history,
    new_credit: newCredit,
    credit_mix: mix,
  };
}

/** 300 + 5.5 · Σ (w/100)·s, in integer hundredths so the sum is exact; rounded half up. */
function scoreOf(s: Record<(typeof FACTORS)[number], number>): number {
  const weighted = FACTORS.reduce((sum, f) => sum + WEIGHTS[f] * s[f] * 2, 0); // Σ w·s doubled (s may end in .5)
  return 300 + Math.floor((weighted * 55) / 2000 + 0.5);
}

const ACTIONS: Record<(typeof FACTORS)[number], string> = {
  payment_history: 'Pay every bill on time; late payments and collections weigh less as they age',
  amounts_owed: 'Bring revolving utilisation below 10% (pay balances down before the statement date)',
  length_of_history: 'Keep your oldest accounts open; the average age grows with time',
  new_credit: 'Avoid new hard inquiries and new accounts for a while',
  credit_mix: 'A mix of revolving and installment credit helps a little; do not borrow only for this',
};

export function estimateFico(p: FicoProfileT): FicoResult {
  const s = subscores(p);
  const estimate = scoreOf(s);
  const band = BANDS.find((b) => estimate >= b.min && estimate <= b.max)!.band;
  const factors = FACTORS.map((f) => ({
    factor: f,
    weight: WEIGHTS[f],
    subscore: s[f],
    points: Math.round(5.5 * WEIGHTS[f] * s[f]) / 100,
    max_points: (5.5 * WEIGHTS[f] * 100) / 100,
  }));
  const levers = FACTORS.map((f) => ({ factor: f, action: ACTIONS[f], potential_points: scoreOf({ ...s, [f]: 100 }) - estimate }))
    .filter((l) => l.potential_points > 0)
    .sort((a, b) => b.potential_points - a.potential_points || FACTORS.indexOf(a.factor) - FACTORS.indexOf(b.factor));
  return {
    estimate,
    range: { low: Math.max(300, estimate - 25), high: Math.min(850, estimate + 25) },
    band,
    factors,
    levers,
    disclaimer: FICO_DISCLAIMER,
    not_a_fico_score: true,
  };
}

const perfect = {
  late_payments_30: 0,
  late_payments_60_plus: 0,
  derogatory_marks: 0,
  utilization_percent: 4,
  oldest_account_years: 28,
  average_account_age_years: 12,
  hard_inquiries_12m: 0,
  new_accounts_12m: 0,
  revolving_accounts: 4,
  installment_accounts: 1,
};

export const ficoScore = defineTool({
  name: 'fico_score',
  description:
    'Educational FICO-style estimate (not a FICO® Score) from your own self-reported factors, with the published category weights, bands and what would raise it.',
  tier: 'pro',
  priceCents: 0,
  family: 'math',
  input: FicoInput,
  qField: 'profile',
  qParse: 'json',
  output:
    '{estimate, range{low, high}, band, factors[{factor, weight, subscore, points, max_points}], levers[{factor, action, potential_points}], disclaimer, not_a_fico_score}',
  outputSchema: FicoOutput,
  examples: [
    { profile: perfect },
    {
      profile: {
        late_payments_30: 1,
        late_payments_60_plus: 0,
        derogatory_marks: 0,
        utilization_percent: 34,
        oldest_account_years: 6,
        average_account_age_years: 3.5,
        hard_inquiries_12m: 2,
        new_accounts_12m: 1,
        revolving_accounts: 3,
        installment_accounts: 1,
      },
    },
  ],
  isolated: import.meta.url,
  limits: { timeMs: 1000, memoryMb: 64 },
  largestInput: () => ({
    profile: {
      late_payments_30: 100,
      late_payments_60_plus: 100,
      derogatory_marks: 50,
      utilization_percent: 100,
      oldest_account_years: 80,
      average_account_age_years: 80,
      hard_inquiries_12m: 100,
      new_accounts_12m: 100,
      revolving_accounts: 200,
      installment_accounts: 200,
    },
  }),
  handler: async ({ profile }) => estimateFico(profile),
});
