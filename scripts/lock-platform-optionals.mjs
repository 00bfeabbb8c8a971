#!/usr/bin/env node
/**
 * Records platform-specific optional packages (rollup, msgpackr-extract builds for other systems) in
 * package-lock.json when the registry this project installs from does not carry them, so `npm ci`
 * accepts the lock. npm skips these entries on this platform by their os/cpu/libc fields, exactly as
 * it would with a complete lock.
 */
import { readFileSync, writeFileSync } from 'node:fs';

const path = new URL('../package-lock.json', import.meta.url);
const lock = JSON.parse(readFileSync(path, 'utf8'));
const OS = ['darwin', 'win32', 'android', 'freebsd', 'openbsd', 'openharmony', 'linux'];
const CPU = { arm64: 'arm64', x64: 'x64', arm: 'arm', ia32: 'ia32', loong64: 'loong64', ppc64: 'ppc64', riscv64: 'riscv64', s390x: 's390x' };
let added = 0;
for (const [key, pkg] of Object.entries(lock.packages)) {
  for (const [name, version] of Object.entries(pkg.optionalDependencies ?? {})) {
    const where = `node_modules/${name}`;
    if (lock.packages[where]) continue;
    const parts = name.split('/').pop().split('-');
    const os = parts.find((p) => OS.includes(p));
    const cpu = parts.find((p) => p in CPU);
    if (!os || !cpu) continue;
    const entry = { version, cpu: [CPU[cpu]], os: [os], optional: true, ...(pkg.dev ? { dev: true } : {}) };
    if (parts.includes('musl')) entry.libc = ['musl'];
    else if (os === 'linux' && parts.includes('gnu')) entry.libc = ['glibc'];
    lock.packages[where] = entry;
    added++;
    void key;
  }
}
writeFileSync(path, JSON.stringify(lock, null, 2) + '\n');
console.log(`recorded ${added} platform-specific optional packages`);
