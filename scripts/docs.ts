/** Writes the generated reference tables under docs/reference/: `npm run docs`. */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { docPages } from '../src/ops/doc-tables.js';

for (const { path, content } of docPages()) {
  const file = fileURLToPath(new URL(`../${path}`, import.meta.url));
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, content);
  console.log(`wrote ${path}`);
}
