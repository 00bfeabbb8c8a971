import { isIPv4, isIPv6 } from 'node:net';
import { z } from 'zod';
import { findPhoneNumbersInText, type CountryCode } from 'libphonenumber-js';
import { defineTool } from '../types.js';
import { MAX_TEXT_CHARS, splitSentences } from './text-kit.js';
import { largeReportA } from './worst-cases.js';
import { nlp } from '../heavy.js';

/** Loads compromise while the sandbox thread loads this module (src/tools/heavy.ts). */
export const warm = (): void => void nlp();

/**
 * beacon_extract: entities with offsets, found by rules (regular expressions, libphonenumber-js for
 * phones, compromise for people, organisations and places) and facts (sentences that state a figure).
 * Every entity's `text` is `input.slice(start, end)` (UTF-16 offsets, end exclusive). `value` is the
 * normalised form where there is one: phones in E.164, emails lower-cased, dates in ISO 8601 (null when
 * a numeric date is ambiguous, e.g. 03/04/2026), money as "<amount> <currency>", key_value's value.
 * Overlaps are resolved by type priority (url, email, ip, phone, date, money, quantity, path, then
 * person, organisation, place), longer first; key_value spans whole `key: value` lines and may contain
 * other entities. compromise runs on chunks of about 2,000 characters at sentence boundaries (one
 * document of 400k characters takes it over a minute).
 */

export const ENTITY_TYPES = ['email', 'url', 'phone', 'date', 'money', 'quantity', 'person', 'organisation', 'place', 'ip', 'path', 'key_value'] as const;
type EntityType = (typeof ENTITY_TYPES)[number];
const PRIORITY: EntityType[] = ['url', 'email', 'ip', 'phone', 'date', 'money', 'quantity', 'path', 'person', 'organisation', 'place', 'key_value'];
/** Result caps, so the answer stays under the pool's 1 MB result limit: past them, `truncated` is true. */
export const MAX_ENTITIES = 4_000;
export const MAX_FACT_CHARS = 200_000;

const Input = z.object({
  text: z.string().min(1).max(MAX_TEXT_CHARS).describe('The text to extract from (up to 400,000 characters)'),
  types: z.array(z.enum(ENTITY_TYPES)).min(1).max(ENTITY_TYPES.length).optional().describe('Entity types to look for (default all)'),
  default_region: z
    .string()
    .regex(/^[A-Z]{2}$/)
    .default('US')
    .describe('ISO 3166 country for phone numbers written without a country code (default US)'),
});

const Entity = z.object({ type: z.enum(ENTITY_TYPES), text: z.string(), start: z.number().int(), end: z.number().int(), value: z.string().nullable() });
const Output = z.object({
  entities: z.array(Entity),
  facts: z.array(z.object({ text: z.string(), start: z.number().int(), end: z.number().int(), entities: z.array(z.number().int()) })),
  counts: z.record(z.number().int()),
  truncated: z.boolean(),
});
type Found = z.infer<typeof Entity>;

const MONTHS = ['january', 'february', 'march', 'april', 'may', 'june', 'july', 'august', 'september', 'october', 'november', 'december'];
const MONTH =
  '(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\\.?';
const CURRENCY: Record<string, string> = {
  $: 'USD',
  '€': 'EUR',
  '£': 'GBP',
  '¥': 'JPY',
  '₹': 'INR',
  dollars: 'USD',
  dollar: 'USD',
  euros: 'EUR',
  euro: 'EUR',
  pounds: 'GBP',
};
const SCALE: Record<string, number> = { k: 1e3, thousand: 1e3, m: 1e6, million: 1e6, bn: 1e9, b: 1e9, billion: 1e9 };

const RULES: Array<{ type: EntityType; re: RegExp; value?: (m: RegExpExecArray) => string | null; trim?: boolean }> = [
  { type: 'url', re: /\b(?:https?:\/\/|www\.)[^\s<>"'`]+/gi, trim: true, value: (m) => m[0] },
  { type: 'email', re: /(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b/g, value: (m) => m[0].toLowerCase() },
  { type: 'ip', re: /\b(?:\d{1,3}\.){3}\d{1,3}\b/g, value: (m) => (isIPv4(m[0]) ? m[0] : null) },
  {
    type: 'ip',
    re: /(?<![\w:])(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}(?![\w:])|(?<![\w:])(?:[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4})*)?::(?:[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4})*)?(?![\w:])/g,
    value: (m) => (isIPv6(m[0]) && m[0].length > 2 ? m[0].toLowerCase() : null),
  },
  {
    type: 'date',
    re: /\b(\d{4})-(\d{2})-(\d{2})(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b/g,
    value: (m) => ymd(+m[1]!, +m[2]!, +m[3]!),
  },
  { type: 'date', re: /\b(\d{1,2})[/.](\d{1,2})[/.](\d{4})\b/g, value: (m) => numericDate(+m[1]!, +m[2]!, +m[3]!) },
  { type: 'date', re: new RegExp(`\\b(\\d{1,2})(?:st|nd|rd|th)? (${MONTH}),? (\\d{4})\\b`, 'gi'), value: (m) => ymd(+m[3]!, month(m[2]!), +m[1]!) },
  { type: 'date', re: new RegExp(`\\b(${MONTH}) (\\d{1,2})(?:st|nd|rd|th)?,? (\\d{4})\\b`, 'gi'), value: (m) => ymd(+m[3]!, month(m[1]!), +m[2]!) },
  {
    type: 'money',
    re: /(?:([$€£¥₹])\s?(\d[\d,]*(?:\.\d+)?)(?:\s?(k|m|bn|million|billion|thousand)\b)?)|(?<![\w.,])(\d[\d,]*(?:\.\d+)?)\s?(million|billion|thousand)?\s?(USD|EUR|GBP|JPY|CHF|CAD|AUD|INR|dollars?|euros?|pounds)\b/gi,
    value: (m) => {
      const amount = Number((m[2] ?? m[4]!).replace(/,/g, '')) * (SCALE[(m[3] ?? m[5] ?? '').toLowerCase()] ?? 1);
      const cur = m[1] ? CURRENCY[m[1]]! : (CURRENCY[m[6]!.toLowerCase()] ?? m[6]!.toUpperCase());
      return Number.isFinite(amount) ? `${+amount.toFixed(6)} ${cur}` : null;
    },
  },
  {
    type: 'quantity',
    re: /(?<![\w.])\d+(?:[.,]\d+)?\s?(?:%|(?:percent|kg|mg|g|lbs?|oz|km|cm|mm|m|mi|miles?|ft|feet|inch(?:es)?|in|ml|l|litres?|liters?|[kmgt]b|ms|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?|months?|years?|°[cf]|kwh|kw|w|mph|km\/h|users?|requests?|items?|tokens?)\b)/gi,
    value: (m) => m[0].replace(/\s+/g, ' '),
  },
  {
    type: 'path',
    re: /(?<![\w/:.~-])(?:~|\.{1,2})?(?:\/[\w.@-]+){2,}\/?|(?<![\w/.~-])(?:~|\.{1,2})\/[\w.@-]+(?:\/[\w.@-]+)*\/?|\b[A-Za-z]:\\(?:[\w .@-]+\\)*[\w.@-]+/g,
    trim: true,
  },
];

export const beaconExtract = defineTool({
  name: 'beacon_extract',
  description:
    'Extracts entities (emails, URLs, phones in E.164, dates, money, quantities, people, organisations, places, IPs, paths, key: value pairs) and facts, with offsets.',
  tier: 'pro',
  priceCents: 1,
  family: 'text',
  input: Input,
  qField: 'text',
  qParse: 'text',
  output: '{entities[{type,text,start,end,value}], facts[{text,start,end,entities}], counts, truncated}',
  outputSchema: Output,
  examples: [
    { text: 'Email ops@example.com or call +1 (415) 555-2671 before March 3, 2026. The fix costs $1,200 and saves 35% of CPU time.' },
    {
      text: 'Angela Merkel visited Google in Paris.\nhost: 10.0.0.12\nlog file: /var/log/app/error.log',
      types: ['person', 'organisation', 'place', 'ip', 'path', 'key_value'],
    },
    { text: 'Ring 020 7946 0958 on 03/04/2026.', default_region: 'GB' },
  ],
  isolated: import.meta.url,
  progress: true,
  limits: { timeMs: 30_000, memoryMb: 512 },
  largestInput: () => ({ text: largeReportA(MAX_TEXT_CHARS) }),
  handler: async ({ text, types, default_region }, ctx) => {
    const want = new Set<EntityType>(types ?? ENTITY_TYPES);
    const found: Found[] = [];
    const add = (type: EntityType, start: number, end: number, value: string | null) => {
      if (end > start) found.push({ type, text: text.slice(start, end), start, end, value });
    };
    await ctx.progress({ stage: 'patterns' });
    let i = 0;
    for (const rule of RULES) {
      if (!want.has(rule.type)) continue;
      rule.re.lastIndex = 0;
      for (let m = rule.re.exec(text); m; m = rule.re.exec(text)) {
        if ((++i & 0x3ff) === 0 && ctx.signal.aborted) throw new Error('aborted');
        let end = m.index + m[0].length;
        if (rule.trim) end = m.index + trimUrl(m[0]).length;
        const value = rule.trim ? null : rule.value ? rule.value(m) : null;
        if (rule.type === 'ip' && value === null) continue;
        add(rule.type, m.index, end, rule.trim ? text.slice(m.index, end) : value);
      }
    }
    if (want.has('phone')) {
      for (const p of findPhoneNumbersInText(text, default_region as CountryCode)) add('phone', p.startsAt, p.endsAt, p.number.number);
    }
    if (want.has('person') || want.has('organisation') || want.has('place')) {
      await ctx.progress({ stage: 'names' });
      // Sentences over 2,000 characters are cut (at white space where there is some) so no chunk is longer.
      const spans = splitSentences(text, ctx.signal).flatMap((sp) => cut(text, sp, 2_000));
      for (let k = 0; k < spans.length; ) {
        if (ctx.signal.aborted) throw new Error('aborted');
        const from = spans[k]!.start;
        let to = spans[k]!.end;
        k++;
        while (k < spans.length && spans[k]!.end - from <= 2_000) to = spans[k++]!.end;
        const chunk = text.slice(from, to);
        // Names start with a capital letter: a chunk without one has none to find.
        if (!/\p{Lu}\p{Ll}/u.test(chunk)) continue;
        const doc = nlp()(chunk);
        const groups: Array<[EntityType, unknown]> = [];
        if (want.has('person')) groups.push(['person', doc.people()]);
        if (want.has('organisation')) groups.push(['organisation', doc.organizations()]);
        if (want.has('place')) groups.push(['place', doc.places()]);
        for (const [type, view] of groups) {
          for (const j of (view as { json(o: object): Array<{ offset?: { start: number; length: number } }> }).json({ offset: true })) {
            if (!j.offset) continue;
            let s = j.offset.start;
            let e = s + j.offset.length;
            // Trim punctuation and white space compromise keeps around a name.
            while (s < e && /[\s.,;:!?"'()[\]]/.test(chunk[s]!)) s++;
            while (e > s && /[\s.,;:!?"'()[\]]/.test(chunk[e - 1]!) && !/\p{Lu}\.$/u.test(chunk.slice(s, e))) e--;
            if (s >= 0 && e <= chunk.length && e > s) add(type, from + s, from + e, null);
          }
        }
      }
    }
    if (want.has('key_value')) {
      const re = /^[ \t]*([A-Za-z][\w-]*(?:[ \t][\w-]+){0,3})[ \t]*[:=][ \t]*(?!\/\/)(\S[^\n]*)$/gm;
      for (let m = re.exec(text); m; m = re.exec(text)) {
        const start = m.index + m[0].indexOf(m[1]!);
        const value = m[2]!.trimEnd();
        add('key_value', start, m.index + m[0].length - (m[2]!.length - value.length), value);
      }
    }
    await ctx.progress({ stage: 'resolving' });
    const entities = resolve(found);
    const truncated = entities.length > MAX_ENTITIES;
    if (truncated) entities.length = MAX_ENTITIES;
    const counts: Record<string, number> = {};
    for (const e of entities) counts[e.type] = (counts[e.type] ?? 0) + 1;
    // Facts: sentences holding a figure (date, money, quantity) with the entities inside them.
    const facts: z.infer<typeof Output>['facts'] = [];
    let factChars = 0;
    let factsCut = false;
    if (entities.some((e) => e.type === 'date' || e.type === 'money' || e.type === 'quantity')) {
      let first = 0;
      for (const s of splitSentences(text, ctx.signal)) {
        if (factChars + (s.end - s.start) > MAX_FACT_CHARS) {
          factsCut = true;
          break;
        }
        while (first < entities.length && entities[first]!.start < s.start) first++;
        const inside: number[] = [];
        let figure = false;
        for (let k = first; k < entities.length && entities[k]!.start < s.end; k++) {
          const e = entities[k]!;
          if (e.end > s.end || e.type === 'key_value') continue;
          inside.push(k);
          if (e.type === 'date' || e.type === 'money' || e.type === 'quantity') figure = true;
        }
        if (figure) {
          facts.push({ text: text.slice(s.start, s.end), start: s.start, end: s.end, entities: inside });
          factChars += s.end - s.start;
        }
      }
    }
    return { entities, facts, counts, truncated: truncated || factsCut };
  },
});

/** Non-overlapping entities by priority (then length, then position); key_value lines are kept alongside. */
function resolve(found: Found[]): Found[] {
  const rank = (t: EntityType) => PRIORITY.indexOf(t);
  const candidates = found.filter((e) => e.type !== 'key_value');
  candidates.sort((a, b) => rank(a.type) - rank(b.type) || b.end - b.start - (a.end - a.start) || a.start - b.start);
  const taken: Found[] = [];
  const occupied: Array<[number, number]> = [];
  for (const e of candidates) {
    // occupied is sorted by start; binary search the first span ending after e.start.
    let lo = 0;
    let hi = occupied.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (occupied[mid]![1] <= e.start) lo = mid + 1;
      else hi = mid;
    }
    if (lo < occupied.length && occupied[lo]![0] < e.end) continue;
    occupied.splice(lo, 0, [e.start, e.end]);
    taken.push(e);
  }
  const seen = new Set<string>();
  const all = [...taken, ...found.filter((e) => e.type === 'key_value')].filter((e) => {
    const k = `${e.type}:${e.start}:${e.end}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
  return all.sort((a, b) => a.start - b.start || rank(a.type) - rank(b.type) || a.end - b.end);
}

/** A URL or path without trailing punctuation; a closing bracket stays when it closes one inside. */
function trimUrl(u: string): string {
  let open = 0;
  let close = 0;
  let openSq = 0;
  let closeSq = 0;
  for (const ch of u) {
    if (ch === '(') open++;
    else if (ch === ')') close++;
    else if (ch === '[') openSq++;
    else if (ch === ']') closeSq++;
  }
  let end = u.length;
  for (;;) {
    const last = u[end - 1];
    if (last && '.,;:!?\'"'.includes(last)) end--;
    else if (last === ')' && open < close) {
      end--;
      close--;
    } else if (last === ']' && openSq < closeSq) {
      end--;
      closeSq--;
    } else return u.slice(0, end);
  }
}

/** A span cut into pieces of at most `max` characters, at white space where there is some. */
function cut(text: string, span: { start: number; end: number }, max: number): Array<{ start: number; end: number }> {
  const out: Array<{ start: number; end: number }> = [];
  let s = span.start;
  while (span.end - s > max) {
    let c = text.lastIndexOf(' ', s + max);
    if (c <= s + max / 2) c = s + max;
    if (/[\uD800-\uDBFF]/.test(text[c - 1]!)) c--;
    out.push({ start: s, end: c });
    s = c;
  }
  out.push({ start: s, end: span.end });
  return out;
}

function month(name: string): number {
  const n = name.toLowerCase().replace('.', '');
  return MONTHS.findIndex((m) => m.startsWith(n.slice(0, 3))) + 1;
}

function ymd(y: number, m: number, d: number): string | null {
  if (m < 1 || m > 12 || d < 1) return null;
  const days = new Date(Date.UTC(y, m, 0)).getUTCDate();
  if (d > days) return null;
  return `${String(y).padStart(4, '0')}-${String(m).padStart(2, '0')}-${String(d).padStart(2, '0')}`;
}

/** a/b/yyyy: day first when a > 12, month first when b > 12, else ambiguous (null). */
function numericDate(a: number, b: number, y: number): string | null {
  if (a > 12 && b <= 12) return ymd(y, b, a);
  if (b > 12 && a <= 12) return ymd(y, a, b);
  if (a === b) return ymd(y, a, b);
  return null;
}
