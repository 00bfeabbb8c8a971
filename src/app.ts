import { randomUUID } from 'node:crypto';
import Fastify, { LogController, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { Container } from './container.js';
import { registerFaces } from './faces/index.js';
import { connectionOptions, installConnectionLimits } from './faces/http/plugins/connections.js';
import { AuthFailureThrottle, type KeyCaller } from './access/auth.js';
import { rateLimitHeaders, type DeferredHit } from './access/rate-limit.js';
import { logRequest, logRequests } from './faces/http/plugins/request-log.js';

declare module 'fastify' {
  interface FastifyRequest {
    caller?: KeyCaller;
  }
  interface FastifyInstance {
    container: Container;
    /** Authenticates the request's API key (401s as in DECISIONS) and applies its rate limit. */
    authenticate(req: FastifyRequest, reply: FastifyReply, opts?: { audience?: string }): Promise<KeyCaller>;
    /**
     * Authenticates, and leaves the rate-limit hit to be counted by admission's script (a tool call:
     * one Redis round trip fewer). `rate.now()` counts it on its own if the request ends before then
     * (the route calls it on every path that does not reach admission); it is counted exactly once.
     */
    authenticateDeferred(req: FastifyRequest, reply: FastifyReply, opts?: { audience?: string }): Promise<{ caller: KeyCaller; rate: DeferredHit }>;
  }
}

const REQUEST_ID_RE = /^[A-Za-z0-9._:-]{8,128}$/;

export interface AppOptions {
  logger?: Logger;
}

/** Builds the HTTP app around a container. Tests build it and call `inject()`. */
export async function buildApp(container: Container, opts: AppOptions = {}): Promise<FastifyInstance> {
  const api = container.api;
  if (!api) throw new Error('buildApp needs a container with the API services');
  const { config } = container;
  // Typed as the default instance: the pino logger passed in is a FastifyBaseLogger at heart.
  const app: FastifyInstance = Fastify({
    ...(opts.logger ? { loggerInstance: opts.logger } : { logger: false }),
    // Fastify's own two lines per request (incoming, completed) are replaced by one (`logRequests`).
    logController: new LogController({ disableRequestLogging: true }),
    ...connectionOptions(config),
    bodyLimit: config.BODY_LIMIT,
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && REQUEST_ID_RE.test(given) ? given : randomUUID();
    },
  }) as unknown as FastifyInstance;
  installConnectionLimits(app.server, config, (address) => app.log.debug({ address }, 'connection refused: too many open from this address'));
  app.decorate('container', container);
  // The front door's throttles are wired here, where the HTTP server is built: whatever the
  // container was built for, no HTTP replica can run without them.
  api.auth.configure({
    negativeTtlMs: config.KEY_NEGATIVE_CACHE_SECONDS * 1000,
    throttle: new AuthFailureThrottle(container.redis, config.REDIS_PREFIX, config.AUTH_FAIL_PER_MINUTE, config.RATE_LIMIT_WINDOW_MS, app.log),
  });
  api.payPerCall?.limitPayers(api.limiter, config.X402_RPM);
  app.decorate('authenticateDeferred', async (req: FastifyRequest, reply: FastifyReply, opts: { audience?: string } = {}) => {
    // req.ip is the socket's peer, or with TRUST_PROXY the address the proxy in front saw. OAuth
    // access tokens authenticate only where their audience is (/mcp passes its own).
    const caller = await api.auth.authenticate(req.headers.authorization, req.ip, opts);
    req.caller = caller;
    const rate = api.limiter.deferred(caller.accountId, api.limiter.limitFor(caller.plan, caller.rpm), (state) => reply.headers(rateLimitHeaders(state)));
    return { caller, rate };
  });
  app.decorate('authenticate', async (req: FastifyRequest, reply: FastifyReply, opts: { audience?: string } = {}) => {
    const { caller, rate } = await app.authenticateDeferred(req, reply, opts);
    await rate.now();
    return caller;
  });
  app.addHook('onSend', async (req, reply) => {
    reply.header('x-request-id', req.id);
  });
  // Requests and their times by route pattern (never the raw URL), for GET /metrics, and one log line each.
  const { metrics } = container;
  logRequests(app);
  app.addHook('onResponse', async (req, reply) => {
    const route = req.routeOptions.url ?? '(unmatched)';
    metrics.httpRequests.inc({ route, method: req.method, status: String(reply.statusCode) });
    metrics.httpDuration.observe({ route, method: req.method }, reply.elapsedTime / 1000);
    logRequest(req, reply, route);
  });
  await registerFaces(app);
  return app;
}
