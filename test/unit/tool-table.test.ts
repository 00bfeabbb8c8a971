import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { toolTable, withToolTable } from '../../src/ops/tool-table.js';
import { TOOLS } from '../../src/tools/index.js';

describe("the README's tool table", () => {
  it('is the one the registry generates (run `npm run docs:tools` after changing a tool)', () => {
    const readme = readFileSync(fileURLToPath(new URL('../../README.md', import.meta.url)), 'utf8');
    expect(withToolTable(readme)).toBe(readme);
  });

  it('lists every tool but the edge suite by name, and counts them all', () => {
    const table = toolTable();
    expect(table).toContain(`${TOOLS.length} tools.`);
    for (const t of TOOLS.filter((t) => t.family !== 'edge')) expect(table).toContain(`| \`${t.name}\` |`);
  });
});
