import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { configVars, docPages, errorTable, isSecret, toolTable } from '../../src/ops/doc-tables.js';
import { ERROR_STATUS } from '../../src/errors.js';
import { TOOLS } from '../../src/tools/index.js';

const onDisk = (path: string) => {
  try {
    return readFileSync(fileURLToPath(new URL(`../../${path}`, import.meta.url)), 'utf8');
  } catch {
    return '(missing)';
  }
};

describe('the generated reference tables', () => {
  for (const { path, content } of docPages()) {
    it(`${path} is what the code generates now (run \`npm run docs\`)`, () => {
      expect(onDisk(path), `${path} is stale: run npm run docs`).toBe(content);
    });

    it(`${path} keeps every prose line under 120 characters`, () => {
      const long = content.split('\n').filter((l) => !l.startsWith('|') && l.length >= 120);
      expect(long).toEqual([]);
    });
  }

  it('generates the same pages twice (no dates, stable order)', () => {
    expect(docPages()).toEqual(docPages());
  });

  it('lists every tool but the edge suite by name, and counts them all', () => {
    const table = toolTable();
    expect(table).toContain(`${TOOLS.length} tools.`);
    for (const t of TOOLS.filter((t) => t.family !== 'edge')) expect(table).toContain(`| \`${t.name}\` |`);
    expect(table).toContain(`| ${TOOLS.filter((t) => t.family === 'edge').length} × \`cf_*\` |`);
  });

  it('lists every environment variable of the config schema, each described, no secret with a default', () => {
    const vars = configVars();
    expect(vars.length).toBeGreaterThan(100);
    expect(vars.map((v) => v.name)).toContain('DATABASE_URL');
    for (const v of vars) {
      expect(v.description.trim(), v.name).not.toBe('');
      if (isSecret(v.name)) expect(v.default, v.name).toBe('');
    }
    expect(vars.find((v) => v.name === 'PORT')?.default).toBe('`8080`');
    expect(vars.find((v) => v.name === 'REDIS_URL')?.default).toBe('`redis://127.0.0.1:6379`');
    expect(vars.find((v) => v.name === 'TRUST_PROXY')?.default).toBe('`false`');
  });

  it('lists every error code with its status', () => {
    const table = errorTable();
    for (const [code, status] of Object.entries(ERROR_STATUS)) expect(table).toContain(`| \`${code}\` | ${status} |`);
  });
});
