/** Rewrites the README's tool table from the registry: `npm run docs:tools`. */
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { withToolTable } from '../src/ops/tool-table.js';

const path = fileURLToPath(new URL('../README.md', import.meta.url));
writeFileSync(path, withToolTable(readFileSync(path, 'utf8')));
