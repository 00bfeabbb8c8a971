import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { CallAnswer } from '../services/calls.js';

/** `Prefer: respond-async` (RFC 7240) asks for the 202 at once. */
export function wantsAsync(req: FastifyRequest): boolean {
  const prefer = req.headers.prefer;
  return typeof prefer === 'string' && /(^|[,;\s])respond-async($|[,;\s])/i.test(prefer);
}

export function edgeTokenHeader(req: FastifyRequest): string | undefined {
  const v = req.headers['x-edge-token'];
  return typeof v === 'string' && v.trim() ? v.trim() : undefined;
}

export function sendAnswer(reply: FastifyReply, answer: CallAnswer) {
  reply.header('x-job-id', answer.jobId);
  if (answer.status === 202) reply.header('location', answer.body.status_url);
  return reply.status(answer.status).send(answer.body);
}

export async function callRoutes(app: FastifyInstance): Promise<void> {
  const { calls } = app.container.api!;

  app.post<{ Params: { name: string } }>('/tools/:name', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const answer = await calls.call(caller, req.params.name, req.body, {
      requestId: req.id,
      respondAsync: wantsAsync(req),
      edgeToken: edgeTokenHeader(req),
    });
    return sendAnswer(reply, answer);
  });

  app.get<{ Params: { id: string } }>('/jobs/:id', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const { status, body } = await calls.jobStatus(caller, req.params.id);
    return reply.status(status).send(body);
  });

  app.get('/balance', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    const { accounts } = app.container;
    const [account, used] = await Promise.all([
      accounts.getAccount(caller.accountId),
      caller.subKey ? accounts.keyUsedThisMonth(caller.subKey.keyId) : accounts.accountUsedThisMonth(caller.accountId),
    ]);
    return {
      credits: account.credits,
      plan: account.plan,
      used_this_month: used,
      ...(caller.subKey ? { monthly_limit: caller.subKey.monthlyLimitCents, key_type: 'sub' } : { key_type: caller.keyType }),
      ...(caller.sandbox ? { sandbox: true } : {}),
    };
  });
}
