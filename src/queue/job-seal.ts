import { createCipheriv, createDecipheriv, createHash, hkdfSync, randomBytes } from 'node:crypto';
import { ConfigError, isProduction, type Config } from '../config.js';

/**
 * What a sensitive tool (passports, handoff: `sensitive` in its definition) leaves in Redis and
 * Postgres: its input in the job's data, its answer as the job's return value, in job records, event
 * logs and `job_results`, each sealed with AES-256-GCM, so neither store holds the caller's text in
 * clear. Only the worker that runs the job opens the input, and only a reader answering the caller
 * (GET /jobs/{id}, the synchronous answer, SSE, MCP and chat answers: all through ResultRefs and
 * ResultsStore) opens the answer. Other tools pay nothing: nothing here runs for them.
 *
 * The key is derived with HKDF-SHA256 from EDGE_TOKEN_KEY under a label of its own, not a new secret:
 * EDGE_TOKEN_KEY is already the key of secrets inside job data, required in production and shared by
 * the API and every family's workers (src/bootstrap.ts, docker-compose.yml), so this adds nothing an
 * operator must deploy, and the label keeps the derived key apart from the edge tokens' own.
 *
 * Rotation: every envelope names the key that sealed it (the first 4 bytes of the derived key's
 * SHA-256, in hex), and earlier EDGE_TOKEN_KEY values listed in JOB_SEAL_PREVIOUS_KEYS still open what
 * they sealed; new envelopes are always sealed under the current key.
 *
 * The GCM additional data binds an envelope to its place (the tool and account of an input, the job of
 * an answer): a blob copied into another job does not open.
 */

const LABEL = 'tollgate job seal v1';
const VERSION = 's1';

/** A sealed value as it is stored: one string, `s1.<key id>.<iv>.<tag>.<ciphertext>` (base64url). */
export interface Sealed {
  $sealed: string;
}

/** The envelope does not open here: sealed under a key this process lacks, or altered. A fault, never the caller's. */
export class JobSealError extends Error {}

export function isSealed(v: unknown): v is Sealed {
  return !!v && typeof v === 'object' && typeof (v as Sealed).$sealed === 'string' && (v as Sealed).$sealed.startsWith(`${VERSION}.`);
}

/** A 32-byte key written as 64 hex characters or base64 (how EDGE_TOKEN_KEY is given). */
function keyBytes(text: string, name: string): Buffer {
  const raw = /^[0-9a-fA-F]{64}$/.test(text) ? Buffer.from(text, 'hex') : Buffer.from(text, 'base64');
  if (raw.length !== 32) throw new ConfigError(`${name} must hold 32-byte keys, as 64 hex characters or base64`);
  return raw;
}

function derive(base: Buffer): { id: string; key: Buffer } {
  const key = Buffer.from(hkdfSync('sha256', base, Buffer.alloc(0), LABEL, 32));
  return { id: createHash('sha256').update(key).digest('hex').slice(0, 8), key };
}

export class JobSeal {
  private readonly current: { id: string; key: Buffer };
  private readonly byId = new Map<string, Buffer>();

  constructor(base: Buffer, previous: Buffer[] = []) {
    this.current = derive(base);
    for (const k of [base, ...previous].map(derive)) if (!this.byId.has(k.id)) this.byId.set(k.id, k.key);
  }

  /** The id written into new envelopes. */
  get keyId(): string {
    return this.current.id;
  }

  seal(value: unknown, bound: string): Sealed {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.current.key, iv);
    cipher.setAAD(Buffer.from(bound));
    const body = Buffer.concat([cipher.update(JSON.stringify(value) ?? 'null', 'utf8'), cipher.final()]);
    return { $sealed: [VERSION, this.current.id, iv.toString('base64url'), cipher.getAuthTag().toString('base64url'), body.toString('base64url')].join('.') };
  }

  open(sealed: Sealed, bound: string): unknown {
    const [v, id, iv, tag, body] = sealed.$sealed.split('.');
    if (v !== VERSION || !id || !iv || !tag || body === undefined) throw new JobSealError('a sealed job value has an unknown format');
    const key = this.byId.get(id);
    if (!key) {
      throw new JobSealError(
        `a sealed job value is under key ${id}, which neither EDGE_TOKEN_KEY nor JOB_SEAL_PREVIOUS_KEYS gives (this process seals under ${this.current.id})`,
      );
    }
    try {
      const decipher = createDecipheriv('aes-256-gcm', key, Buffer.from(iv, 'base64url'));
      decipher.setAAD(Buffer.from(bound));
      decipher.setAuthTag(Buffer.from(tag, 'base64url'));
      return JSON.parse(Buffer.concat([decipher.update(Buffer.from(body, 'base64url')), decipher.final()]).toString('utf8'));
    } catch {
      throw new JobSealError(`a sealed job value under key ${id} does not open: altered, or moved from another job`);
    }
  }

  /** A stored outcome whose completed result is sealed, opened (anything else as it is). */
  openOutcome<T extends { status: string; body: Record<string, unknown> }>(jobId: string, o: T): T {
    if (o.status !== 'completed' || !isSealed(o.body.result)) return o;
    return { ...o, body: { ...o.body, result: this.open(o.body.result, resultBinding(jobId)) } };
  }
}

/** What a sealed input is bound to: its tool and account (the job id is not known yet when it is sealed). */
export function inputBinding(tool: string, accountId: string | null): string {
  return `input:${tool}:${accountId ?? ''}`;
}

/** What a sealed answer is bound to: its job. */
export function resultBinding(jobId: string): string {
  return `result:${jobId}`;
}

let processBase: Buffer | null = null;
const seals = new Map<string, JobSeal>();

/**
 * The seal of a configuration, built once per key set. EDGE_TOKEN_KEY unset is refused in production
 * (as the edge-token sealer refuses it); elsewhere the entry points fill it from the data directory
 * (src/bootstrap.ts), so only a process built without them (tests) seals under a random key of its own,
 * which every container of that process shares.
 */
export function jobSeal(config: Pick<Config, 'EDGE_TOKEN_KEY' | 'JOB_SEAL_PREVIOUS_KEYS'>): JobSeal {
  const id = `${config.EDGE_TOKEN_KEY}|${config.JOB_SEAL_PREVIOUS_KEYS.join(',')}`;
  let seal = seals.get(id);
  if (seal) return seal;
  let base: Buffer;
  if (config.EDGE_TOKEN_KEY) base = keyBytes(config.EDGE_TOKEN_KEY, 'EDGE_TOKEN_KEY');
  else if (isProduction())
    throw new ConfigError('EDGE_TOKEN_KEY is required in production: sensitive tools seal their inputs and answers under a key derived from it');
  else base = processBase ??= randomBytes(32);
  seal = new JobSeal(
    base,
    config.JOB_SEAL_PREVIOUS_KEYS.map((k) => keyBytes(k, 'JOB_SEAL_PREVIOUS_KEYS')),
  );
  seals.set(id, seal);
  return seal;
}

/**
 * A sensitive tool's input as its job carries it: nothing in `input`, the input sealed beside it.
 * Spread over the job data by admission, for sensitive tools only.
 */
export function sealedInput(
  config: Pick<Config, 'EDGE_TOKEN_KEY' | 'JOB_SEAL_PREVIOUS_KEYS'>,
  tool: string,
  accountId: string | null,
  input: Record<string, unknown>,
): { input: Record<string, never>; sealedInput: Sealed } {
  return { input: {}, sealedInput: jobSeal(config).seal(input, inputBinding(tool, accountId)) };
}
