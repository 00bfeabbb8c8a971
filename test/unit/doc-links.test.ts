import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * The documentation is README.md and docs/**: every relative link and image must reach a file of the
 * repository, and every #fragment a heading of the file it names (GitHub's slugs).
 */
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

function markdownFiles(dir: string): string[] {
  const found: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) found.push(...markdownFiles(path));
    else if (entry.name.endsWith('.md')) found.push(path);
  }
  return found;
}

const FILES = [join(ROOT, 'README.md'), ...markdownFiles(join(ROOT, 'docs'))].sort();

/** The lines outside fenced code blocks, with their 1-based numbers. */
function proseLines(text: string): Array<{ line: string; n: number }> {
  const out: Array<{ line: string; n: number }> = [];
  let fence: string | null = null;
  text.split('\n').forEach((line, i) => {
    const marker = /^\s*(`{3,}|~{3,})/.exec(line)?.[1];
    if (marker && (fence === null || marker.startsWith(fence))) {
      fence = fence === null ? marker : null;
      return;
    }
    if (fence === null) out.push({ line, n: i + 1 });
  });
  return out;
}

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
function slugs(text: string): Set<string> {
  const seen = new Map<string, number>();
  const result = new Set<string>();
  for (const { line } of proseLines(text)) {
    const m = /^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = m[1]!!
      .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\p{M}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    result.add(count === 0 ? base : `${base}-${count}`);
  }
  return result;
}

/** Inline links and images outside code: [text](target) and ![alt](target), text may span lines. */
function links(text: string): Array<{ target: string; n: number }> {
  const lines = proseLines(text);
  const prose = lines.map(({ line }) => line.replace(/`[^`]*`/g, (code) => ' '.repeat(code.length))).join('\n');
  const found: Array<{ target: string; n: number }> = [];
  for (const m of prose.matchAll(/!?\[(?:[^\][]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)/g)) {
    const row = prose.slice(0, m.index).split('\n').length - 1;
    found.push({ target: m[1]!, n: lines[row]!.n });
  }
  return found;
}

const slugCache = new Map<string, Set<string>>();
function slugsOf(path: string): Set<string> {
  let s = slugCache.get(path);
  if (!s) {
    s = slugs(readFileSync(path, 'utf8'));
    slugCache.set(path, s);
  }
  return s;
}

describe('the documentation', () => {
  it('is README.md and the pages under docs/', () => {
    expect(FILES.length).toBeGreaterThan(1);
    expect(readFileSync(join(ROOT, 'README.md'), 'utf8').split('\n')[0]).toBe('# Tollgate');
  });

  it('has no link that leads nowhere', () => {
    const broken: string[] = [];
    for (const file of FILES) {
      const where = relative(ROOT, file);
      for (const { target, n } of links(readFileSync(file, 'utf8'))) {
        if (target === '') {
          broken.push(`${where}:${n}: empty link target`);
          continue;
        }
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) {
          if (/^https?:/i.test(target)) {
            let ok = false;
            try {
              ok = ['http:', 'https:'].includes(new URL(target).protocol) && new URL(target).hostname.includes('.');
            } catch {}
            if (!ok) broken.push(`${where}:${n}: malformed URL ${target}`);
          } else if (!/^mailto:/i.test(target)) broken.push(`${where}:${n}: unexpected scheme in ${target}`);
          continue;
        }
        const hash = target.indexOf('#');
        const pathPart = decodeURIComponent(hash === -1 ? target : target.slice(0, hash));
        const fragment = hash === -1 ? null : decodeURIComponent(target.slice(hash + 1));
        const resolved = pathPart === '' ? file : join(dirname(file), pathPart);
        if (!resolved.startsWith(ROOT)) {
          broken.push(`${where}:${n}: ${target} leaves the repository`);
          continue;
        }
        if (!existsSync(resolved)) {
          broken.push(`${where}:${n}: ${target}: no such file`);
          continue;
        }
        if (fragment !== null) {
          if (statSync(resolved).isDirectory() || !resolved.endsWith('.md')) broken.push(`${where}:${n}: ${target}: a fragment on a file that is not Markdown`);
          else if (!slugsOf(resolved).has(fragment)) broken.push(`${where}:${n}: ${target}: ${relative(ROOT, resolved)} has no heading #${fragment}`);
        }
      }
    }
    expect(broken).toEqual([]);
  });

  it('keeps the README a front door: at most 250 lines', () => {
    const lines = readFileSync(join(ROOT, 'README.md'), 'utf8').replace(/\n$/, '').split('\n');
    expect(lines.length).toBeLessThanOrEqual(250);
  });

  it('has no prose line over 120 characters (tables and code blocks aside)', () => {
    const long: string[] = [];
    for (const file of FILES) {
      for (const { line, n } of proseLines(readFileSync(file, 'utf8'))) {
        if (line.trimStart().startsWith('|')) continue;
        const length = [...line].length;
        if (length > 120) long.push(`${relative(ROOT, file)}:${n}: ${length} characters`);
      }
    }
    expect(long).toEqual([]);
  });

  it('computes GitHub-style slugs', () => {
    const s = slugs(
      '# Tollgate\n## Keys: `GET /keys`, `POST /keys/{key_id}/rotate`\n## Root protocol: `POST /`\n## Tests\n## Tests\n```\n# not a heading\n```\n',
    );
    expect([...s]).toEqual(['tollgate', 'keys-get-keys-post-keyskey_idrotate', 'root-protocol-post-', 'tests', 'tests-1']);
  });
});
