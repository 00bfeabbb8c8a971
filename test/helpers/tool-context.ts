import pino from 'pino';
import { loadConfig, type Config } from '../../src/config.js';
import type { ToolContext, ToolProgress } from '../../src/tools/types.js';
import { createGuardedHttp } from '../../src/tools/web/guarded-http.js';
import { createResolver } from '../../src/tools/web/resolver.js';
import { createSearch } from '../../src/tools/web/search-client.js';
import { createLlm } from '../../src/tools/llm/structured.js';

/**
 * A ToolContext for calling a tool's handler directly in unit tests, built as the runner builds it:
 * guarded `http` and `dns` always, `search` with SEARCH_BASE_URL, `llm` with LLM_BASE_URL (pass them
 * in `env`). Progress reports and recorded usage are collected so tests can assert on them.
 */
export function makeToolContext(overrides: Partial<ToolContext> & { env?: Record<string, string> } = {}) {
  const { env, ...rest } = overrides;
  const config: Config = rest.config ?? loadConfig({}, { LOG_LEVEL: 'silent', ...env });
  const progress: ToolProgress[] = [];
  const usage: Array<Record<string, number>> = [];
  const ctx: ToolContext = {
    config,
    log: pino({ level: 'silent' }),
    signal: new AbortController().signal,
    progress: async (p) => {
      progress.push(p);
    },
    sandbox: false,
    accountId: '00000000-0000-0000-0000-000000000001',
    keyId: null,
    balance: async () => ({ credits: 1000, plan: 'pro', used_this_month: 0 }),
    recordUsage: (u) => {
      usage.push(u);
    },
    ...rest,
  };
  const dns = ctx.dns ?? createResolver(config);
  ctx.dns = dns;
  ctx.http ??= createGuardedHttp({ config, resolver: dns, tool: 'test', signal: ctx.signal, progress: ctx.progress });
  if (config.SEARCH_BASE_URL) ctx.search ??= createSearch(config, ctx.signal);
  if (config.LLM_BASE_URL) ctx.llm ??= createLlm(ctx);
  return { ctx, progress, usage };
}
