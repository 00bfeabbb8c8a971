import { execFileSync, spawn, type SpawnOptions } from 'node:child_process';
import { once } from 'node:events';
import net from 'node:net';

/** Tests that start the service as processes (`npm start`, `start:prod`): what is left running or listening. */

/** Every process below `pid`, children first. */
export function descendants(pid: number): number[] {
  let out = '';
  try {
    out = execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' });
  } catch {
    return [];
  }
  const kids = out
    .split('\n')
    .map((s) => Number(s.trim()))
    .filter((n) => n > 0);
  return kids.flatMap((k) => [k, ...descendants(k)]);
}

export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Whether anything accepts connections on 127.0.0.1:`port`. */
export function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/**
 * Runs a command to its exit: its exit code, everything it wrote (stdout and stderr) and the lines
 * the service prints for an operator (`tollgate: ...`).
 */
export async function runToExit(command: string, args: string[], opts: SpawnOptions): Promise<{ code: number | null; out: string; lines: string[] }> {
  const child = spawn(command, args, { ...opts, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const [code] = (await once(child, 'exit')) as [number | null];
  return { code, out, lines: out.split('\n').filter((l) => l.startsWith('tollgate: ')) };
}
