import { countTokensA, EXACT_ENCODINGS, type ExactEncoding } from './tiktoken-count.js';

export { EXACT_ENCODINGS, encoder, type ExactEncoding } from './tiktoken-count.js';

/**
 * Token counts for the text tools. o200k_base (GPT-4o and later) and cl100k_base (GPT-4, GPT-3.5) are
 * exact, from js-tiktoken's own tables; any other encoding is chars/4, labelled `estimate`.
 */
/**
 * Exact counts through tiktoken-count.ts's counter: js-tiktoken's own `encode(text)` throws on special-token
 * spellings in caller text and merges long runs without spaces in quadratic time.
 */
export function countTokens(text: string, encoding: ExactEncoding = 'o200k_base', signal?: AbortSignal): number {
  return countTokensA(text, encoding, signal);
}

/** A count in any encoding: exact for the two above, else a chars/4 estimate that says so. */
export function tokenCount(text: string, encoding: string): { tokens: number; exact: boolean } {
  if ((EXACT_ENCODINGS as readonly string[]).includes(encoding)) return { tokens: countTokens(text, encoding as ExactEncoding), exact: true };
  return { tokens: Math.ceil(text.length / 4), exact: false };
}
