import { randomUUID } from 'node:crypto';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { Container } from './container.js';
import { installErrorHandling } from './plugins/errors.js';
import type { KeyCaller } from './services/auth.js';
import { metaRoutes } from './routes/meta.js';
import { callRoutes } from './routes/calls.js';
import { rootRoutes } from './routes/root.js';
import { streamRoutes } from './routes/stream.js';
import { subkeyRoutes } from './routes/subkeys.js';
import { mcpRoutes } from './routes/mcp.js';
import { openAiRoutes } from './routes/openai.js';
import { rateLimitHeaders } from './services/rate-limit.js';

declare module 'fastify' {
  interface FastifyRequest {
    caller?: KeyCaller;
  }
  interface FastifyInstance {
    container: Container;
    /** Authenticates the request's API key (401s as in DECISIONS) and applies its rate limit. */
    authenticate(req: FastifyRequest, reply: FastifyReply): Promise<KeyCaller>;
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
  // Typed as the default instance: the pino logger passed in is a FastifyBaseLogger at heart.
  const app: FastifyInstance = Fastify({
    ...(opts.logger ? { loggerInstance: opts.logger } : { logger: false }),
    bodyLimit: container.config.BODY_LIMIT,
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && REQUEST_ID_RE.test(given) ? given : randomUUID();
    },
  }) as unknown as FastifyInstance;
  app.decorate('container', container);
  app.decorate('authenticate', async (req: FastifyRequest, reply: FastifyReply) => {
    const caller = await api.auth.authenticate(req.headers.authorization);
    req.caller = caller;
    const state = await api.limiter.hit(caller.accountId, api.limiter.limitFor(caller.plan, caller.rpm));
    reply.headers(rateLimitHeaders(state));
    return caller;
  });
  app.addHook('onSend', async (req, reply) => {
    reply.header('x-request-id', req.id);
  });
  installErrorHandling(app);
  await app.register(metaRoutes);
  await app.register(callRoutes);
  await app.register(rootRoutes);
  await app.register(streamRoutes);
  await app.register(subkeyRoutes);
  await app.register(mcpRoutes);
  await app.register(openAiRoutes);
  return app;
}
