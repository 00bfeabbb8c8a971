import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { ROTATABLE_TYPES, requireKeyOwner } from '../../access/keys.js';
import { KeyAuthenticator, LastUsedRecorder } from '../../access/auth.js';
import { parseOrThrow } from '../../errors.js';

const KeyIdParams = z.object({ key_id: z.string().uuid('key_id must be a key id (uuid)') });

export async function keyRoutes(app: FastifyInstance): Promise<void> {
  const { accounts, redis, config } = app.container;
  const auth = app.container.api!.auth;
  // last_used_at for GET /keys: one guarded write a minute per key, wired with the routes that show it.
  auth.configure({ lastUsed: new LastUsedRecorder(redis, config.REDIS_PREFIX, accounts, app.log) });

  /** Every replica forgets cached key records: this one now, the others on the broadcast. */
  const forgetKeys = async () => {
    auth.clear();
    await KeyAuthenticator.broadcast(redis, config.REDIS_PREFIX);
  };

  app.get('/keys', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireKeyOwner(caller, 'list keys');
    return { keys: await accounts.listKeys(caller.accountId) };
  });

  app.post<{ Params: { key_id: string } }>('/keys/:key_id/rotate', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireKeyOwner(caller, 'rotate keys');
    const { key_id: keyId } = parseOrThrow(KeyIdParams, req.params, 'Key id is invalid');
    const grace = config.KEY_ROTATION_GRACE_SECONDS;
    const r = await accounts.rotateKey(keyId, caller.accountId, grace, ROTATABLE_TYPES);
    if (!r.ok) {
      switch (r.state) {
        case 'missing':
          throw new AppError('not_found', `No key ${keyId} on this account`);
        case 'not_rotatable':
          throw new AppError('forbidden', `${r.type} keys are not rotated here: create a new sub-key with POST /subkeys/create and delete the old one`, { key_type: r.type });
        default:
          throw new AppError('key_not_active', `Key ${keyId} cannot be rotated: it ${r.state === 'rotated' ? 'was already rotated; rotate its replacement' : `is ${r.state}`}`, { state: r.state });
      }
    }
    // The old key's record in every replica's cache lacks its new expires_at (and its grace state).
    // Authentication also checks expires_at on every request.
    await forgetKeys();
    return reply.status(201).send({
      key_id: r.created.key_id,
      api_key: r.created.api_key,
      type: r.old.type,
      name: r.old.name,
      display_prefix: r.created.display_prefix,
      created_at: r.created.created_at,
      replaces: { key_id: r.old.key_id, expires_at: r.old.expires_at, grace_seconds: grace },
    });
  });

  // Revokes a key at once, grace or not: after a leak, rotate the key, then revoke the old one.
  app.delete<{ Params: { key_id: string } }>('/keys/:key_id', async (req, reply) => {
    const caller = await app.authenticate(req, reply);
    requireKeyOwner(caller, 'revoke keys');
    const { key_id: keyId } = parseOrThrow(KeyIdParams, req.params, 'Key id is invalid');
    if (keyId === caller.keyId) {
      throw new AppError('forbidden', 'A key cannot revoke itself: rotate it (POST /keys/{key_id}/rotate), then revoke it with its replacement', { key_id: keyId });
    }
    const revoked = await accounts.revokeAccountKey(keyId, caller.accountId);
    if (!revoked) throw new AppError('not_found', `No key ${keyId} on this account`);
    await forgetKeys();
    return { key_id: revoked.key_id, type: revoked.type, revoked: true, revoked_at: revoked.revoked_at };
  });
}
