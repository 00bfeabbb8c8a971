import type { FastifyInstance } from 'fastify';
import { parseProtocolRequest } from '../services/protocol.js';
import { edgeTokenHeader, sendIdempotent, wantsAsync } from './calls.js';
import { lastEventCursor, protocolServices, resumeEventStream, startEventStream } from './stream.js';

/** POST /: the root protocol (direct, chain, parallel, stream). Shapes in src/services/protocol.ts. */
export async function rootRoutes(app: FastifyInstance): Promise<void> {
  const { protocol } = protocolServices(app.container);

  app.post('/', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const at = lastEventCursor(req);
    if (at) return resumeEventStream(app, req, reply, caller, at);
    const request = parseProtocolRequest(req.body);
    const opts = { requestId: req.id, edgeToken: edgeTokenHeader(req), respondAsync: wantsAsync(req) };
    if (request.stream) return startEventStream(app, req, reply, caller, () => protocol.start(caller, request, opts));
    return sendIdempotent(req, reply, caller, () => protocol.answer(caller, request, opts));
  });
}
