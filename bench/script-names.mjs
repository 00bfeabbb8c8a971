/**
 * Preloaded into the breakdown's children (`--import ./bench/script-names.mjs`; plain JS, so it needs no loader): records the
 * SHA-1 of every Lua script a process defines with ioredis's defineCommand (the project's scripts and
 * BullMQ's), with its name, in BENCH_SCRIPT_NAMES, so EVALSHA counts can be shown by name.
 */
import { createHash } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import { Redis } from 'ioredis';

const file = process.env.BENCH_SCRIPT_NAMES;
let proto = Redis.prototype;
while (proto && !Object.prototype.hasOwnProperty.call(proto, 'defineCommand')) proto = Object.getPrototypeOf(proto);
if (file && proto) {
  const original = proto.defineCommand;
  const seen = new Set();
  proto.defineCommand = function (name, def) {
    const sha = createHash('sha1').update(def.lua).digest('hex');
    if (!seen.has(sha)) {
      seen.add(sha);
      appendFileSync(file, `${sha} ${name}\n`);
    }
    return original.call(this, name, def);
  };
}
