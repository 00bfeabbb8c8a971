import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

/** The rooms of src/ (README, Architecture): each main file opens by saying what its room owns. */
const root = path.resolve(import.meta.dirname, '../..');
const MAIN_FILES: Record<string, string> = {
  faces: 'src/faces/index.ts',
  calls: 'src/calls/admission.ts',
  access: 'src/access/auth.ts',
  money: 'src/money/settlement.ts',
  pay: 'src/pay/x402/index.ts',
  queue: 'src/queue/queues.ts',
  db: 'src/db/pool.ts',
  sandbox: 'src/sandbox/pool.ts',
  tools: 'src/tools/index.ts',
  ops: 'src/ops/admin.ts',
};

describe('rooms', () => {
  it('has no services/ folder', () => {
    expect(existsSync(path.join(root, 'src/services'))).toBe(false);
  });

  it.each(Object.entries(MAIN_FILES))('%s/ says what it owns at the top of %s', (room, file) => {
    const text = readFileSync(path.join(root, file), 'utf8');
    expect(text.startsWith(`/**\n * ${room}/: `), file).toBe(true);
    const opening = text.slice(0, text.indexOf('*/'));
    expect(opening.split('\n').length, file).toBeGreaterThanOrEqual(3);
  });
});
