import { describe, expect, it } from 'vitest';
import type { z } from 'zod';
import { webTools } from '../../../src/tools/web/index.js';

describe('web tool family', () => {
  it('registers page_fetch and domain_check first, as free web tools; every tool here is of the web family', () => {
    expect(webTools.slice(0, 2).map((t) => [t.name, t.family, t.tier, t.priceCents, t.qField])).toEqual([
      ['page_fetch', 'web', 'free', 0, 'url'],
      ['domain_check', 'web', 'free', 0, 'domain'],
    ]);
    expect(webTools.every((t) => t.family === 'web')).toBe(true);
  });

  it.each(webTools.map((t) => [t.name, t] as const))('%s: q fills a described input field and every example parses', (_name, tool) => {
    // Unwrap refinements and transforms (ZodEffects) down to the object.
    let schema: z.ZodTypeAny = tool.input;
    while ((schema as { _def: { schema?: z.ZodTypeAny } })._def.schema) schema = (schema as { _def: { schema: z.ZodTypeAny } })._def.schema;
    const shape = (schema as z.AnyZodObject).shape as Record<string, z.ZodTypeAny>;
    expect(shape[tool.qField]?.description).toBeTruthy();
    expect(tool.examples.length).toBeGreaterThan(0);
    for (const ex of tool.examples) expect(tool.input.safeParse(ex).success).toBe(true);
  });
});
