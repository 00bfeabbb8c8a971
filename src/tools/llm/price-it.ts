import { Decimal } from 'decimal.js';
import { z } from 'zod';
import { defineTool, type LlmDataBlock } from '../types.js';
import { LlmMetaSchema, META_OUTPUT, clean, cleanList, llmOf, unusableReply } from './tool-kit.js';

/**
 * price_it: price tiers from the model, unit economics from code. The model proposes tiers (name,
 * price, rationale) and anchoring tactics; code rounds each price half-up to the currency's minor unit
 * (cents; whole yen), drops negative or
 * duplicate-named tiers, orders tiers by price (ties in model order), and computes with decimal.js:
 * - margin_pct = (price - unit_cost) / price * 100, rounded half-up to 4 decimal places
 *   (cost 10 at price 25 is exactly 60); null at price 0;
 * - break_even_units = ceil(fixed_costs / (price - unit_cost)); null when price <= unit_cost.
 * Competitor prices (when given) are summarised in code: count, min, median, max.
 */

export const PROMPT_VERSION = 'price_it/1';
const MAX_PRODUCT_CHARS = 8_000;
const MAX_TOKENS = 1_500;
const MAX_TIERS = 6;
/** Largest amount accepted anywhere (prices, costs): beyond it the model or caller is not pricing a product. */
const MAX_AMOUNT = 1e12;

const Dec = Decimal.clone({ precision: 40, rounding: Decimal.ROUND_HALF_UP });

export const PriceItModelSchema = z.object({
  tiers: z
    .array(
      z.object({
        name: z.string().describe('Tier name, e.g. "Starter".'),
        price: z.number().describe('Price per unit (or per month for subscriptions) in the given currency, as a plain number.'),
        rationale: z.string().describe('One or two sentences on who this tier is for and why this price.'),
      }),
    )
    .describe(`Two to ${MAX_TIERS} tiers, cheapest first.`),
  anchors: z.array(z.string()).describe('Price-anchoring tactics for presenting these tiers (decoy tier, annual discount, reference price...).'),
});
type ModelPrices = z.infer<typeof PriceItModelSchema>;

const Amount = z
  .union([
    z.number(),
    z
      .string()
      .trim()
      .regex(/^\d{1,13}(?:\.\d{1,6})?$/, 'a non-negative decimal such as "12.50" (at most 6 decimal places)'),
  ])
  .refine((v) => typeof v === 'string' || (Number.isFinite(v) && v >= 0), 'a non-negative, finite amount')
  .refine((v) => new Dec(v).lte(MAX_AMOUNT), `at most ${MAX_AMOUNT}`);

export const PriceItInput = z.object({
  product: z.string().trim().min(1).max(MAX_PRODUCT_CHARS).describe(`The product and its buyers (at most ${MAX_PRODUCT_CHARS} characters).`),
  currency: z
    .string()
    .trim()
    .toUpperCase()
    .pipe(z.string().regex(/^[A-Z]{3}$/, 'an ISO 4217 code such as "USD"'))
    .default('USD')
    .describe('ISO 4217 currency code (default USD).'),
  unit_cost: Amount.default(0).describe('Variable cost of one unit (number or decimal string; default 0).'),
  fixed_costs: Amount.default(0).describe('Fixed costs to recover (number or decimal string; default 0).'),
  competitor_prices: z
    .array(z.object({ name: z.string().trim().min(1).max(200).optional(), price: Amount }))
    .max(20)
    .default([])
    .describe('Up to 20 competitor prices, each {name?, price}.'),
});
type PriceItIn = z.output<typeof PriceItInput>;

export const PriceItOutput = z.object({
  currency: z.string().regex(/^[A-Z]{3}$/),
  tiers: z
    .array(z.object({ name: z.string().min(1), price: z.number().nonnegative(), rationale: z.string() }))
    .min(1)
    .max(MAX_TIERS),
  anchors: z.array(z.string()),
  economics: z.array(
    z.object({
      tier: z.string(),
      price: z.number().nonnegative(),
      unit_cost: z.number().nonnegative(),
      unit_margin: z.number().describe('price - unit_cost (exact decimal).'),
      margin_pct: z.number().nullable().describe('(price - unit_cost) / price * 100, half-up to 4 places; null at price 0.'),
      break_even_units: z.number().int().nonnegative().nullable().describe('ceil(fixed_costs / (price - unit_cost)); null when price <= unit_cost.'),
    }),
  ),
  competitors: z
    .object({ count: z.number().int().min(1), min: z.number(), median: z.number(), max: z.number() })
    .nullable()
    .describe('Summary of the competitor prices given, or null.'),
  meta: LlmMetaSchema,
});
export type PriceItResult = z.infer<typeof PriceItOutput>;

/** Exact unit economics of one price. */
export function economicsOf(price: Decimal.Value, unitCost: Decimal.Value, fixedCosts: Decimal.Value) {
  const p = new Dec(price);
  const c = new Dec(unitCost);
  const f = new Dec(fixedCosts);
  const unitMargin = p.minus(c);
  const marginPct = p.isZero() ? null : unitMargin.div(p).times(100).toDecimalPlaces(4, Decimal.ROUND_HALF_UP);
  const breakEven = unitMargin.lte(0) ? null : f.div(unitMargin).ceil();
  return {
    unit_margin: unitMargin.toNumber(),
    margin_pct: marginPct === null ? null : marginPct.toNumber(),
    break_even_units: breakEven === null ? null : breakEven.toNumber(),
  };
}

function median(sorted: Decimal[]): Decimal {
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : sorted[mid - 1]!.plus(sorted[mid]!).div(2);
}

/** Decimal places of the currency's minor unit (JPY 0, USD 2, KWD 3); 2 when Intl does not know it. */
export function minorUnits(currency: string): number {
  try {
    return new Intl.NumberFormat('en', { style: 'currency', currency }).resolvedOptions().maximumFractionDigits ?? 2;
  } catch {
    return 2;
  }
}

/** Model reply + caller figures -> result (without meta). */
export function buildPricing(
  v: ModelPrices,
  input: Pick<PriceItIn, 'currency' | 'unit_cost' | 'fixed_costs' | 'competitor_prices'>,
): Omit<PriceItResult, 'meta'> {
  const seen = new Set<string>();
  const places = minorUnits(input.currency);
  const tiers = v.tiers
    .map((t, i) => ({
      i,
      name: clean(t.name),
      rationale: clean(t.rationale),
      price: Number.isFinite(t.price) ? new Dec(t.price).toDecimalPlaces(places, Decimal.ROUND_HALF_UP) : null,
    }))
    .filter((t): t is typeof t & { price: Decimal } => {
      if (!t.name || t.price === null || t.price.isNegative() || t.price.gt(MAX_AMOUNT)) return false;
      const key = t.name.toLowerCase();
      if (seen.has(key)) return false;
      seen.add(key);
      return true;
    })
    .slice(0, MAX_TIERS)
    .sort((a, b) => a.price.comparedTo(b.price) || a.i - b.i);
  if (!tiers.length) throw unusableReply('price_it', 'no tier with a name and a non-negative price');
  const unitCost = new Dec(input.unit_cost);
  const competitorPrices = input.competitor_prices.map((c) => new Dec(c.price)).sort((a, b) => a.comparedTo(b));
  return {
    currency: input.currency,
    tiers: tiers.map((t) => ({ name: t.name, price: t.price.toNumber(), rationale: t.rationale })),
    anchors: cleanList(v.anchors),
    economics: tiers.map((t) => ({
      tier: t.name,
      price: t.price.toNumber(),
      unit_cost: unitCost.toNumber(),
      ...economicsOf(t.price, unitCost, input.fixed_costs),
    })),
    competitors: competitorPrices.length
      ? {
          count: competitorPrices.length,
          min: competitorPrices[0]!.toNumber(),
          median: median(competitorPrices).toNumber(),
          max: competitorPrices.at(-1)!.toNumber(),
        }
      : null,
  };
}

export const priceIt = defineTool({
  name: 'price_it',
  description:
    'Price tiers with rationales and anchoring tactics from the model, plus exact unit economics computed in code with decimal.js (margin % and break-even units per tier).',
  tier: 'starter',
  priceCents: 5,
  family: 'llm',
  input: PriceItInput,
  examples: [
    { product: 'A browser extension that summarises long email threads for sales teams.', unit_cost: 10, fixed_costs: 30000 },
    {
      product: 'Hand-made ceramic coffee mugs sold online.',
      currency: 'EUR',
      unit_cost: '7.40',
      fixed_costs: '2500',
      competitor_prices: [{ name: 'Etsy average', price: 28 }, { price: 35 }],
    },
  ],
  qField: 'product',
  needs: ['llm'],
  progress: true,
  output: `{currency, tiers[{name, price, rationale}], anchors[], economics[{tier, price, unit_cost, unit_margin, margin_pct, break_even_units}], competitors{count,min,median,max}|null, ${META_OUTPUT}}`,
  outputSchema: PriceItOutput,
  handler: async (input, ctx): Promise<PriceItResult> => {
    const figures = [
      `Currency: ${input.currency}`,
      `Variable cost per unit: ${new Dec(input.unit_cost).toString()}`,
      `Fixed costs to recover: ${new Dec(input.fixed_costs).toString()}`,
    ].join('\n');
    const data: LlmDataBlock[] = [{ name: 'product', text: input.product }];
    if (input.competitor_prices.length) {
      data.push({
        name: 'competitors',
        text: input.competitor_prices.map((c, i) => `${c.name ?? `Competitor ${i + 1}`}: ${new Dec(c.price).toString()}`).join('\n'),
      });
    }
    const { value, meta } = await llmOf(ctx, 'price_it').structured({
      name: 'price_it',
      promptVersion: PROMPT_VERSION,
      instructions: `You are a pricing strategist. Propose two to ${MAX_TIERS} price tiers for the product in the data block "product"${
        input.competitor_prices.length ? ', taking the competitor prices in the data block "competitors" into account' : ''
      }.
${figures}
- Prices are plain numbers in ${input.currency}, above the variable cost unless a tier is deliberately free or a loss leader (say so in its rationale).
- Each rationale says who the tier is for and why the price fits; do not compute margins or break-even (they are computed separately).
- Anchors are short tactics for presenting the tiers.`,
      data,
      schema: PriceItModelSchema,
      maxTokens: MAX_TOKENS,
      temperature: 0.3,
    });
    return { ...buildPricing(value, input), meta };
  },
});
