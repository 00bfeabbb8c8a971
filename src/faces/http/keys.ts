import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { AppError } from '../../errors.js';
import { ROTATABLE_TYPES, requireKeyOwner } from '../../access/keys.js';
import { KeyAuthenticator, LastUsedRecorder } from '../../access/auth.js';
import { KEY_TYPES, type KeyType } from '../../access/key-format.js';
import { RATE_LIMIT } from './openapi-components.js';
import { errors, input, named, ok, type RouteSchema } from './route-schema.js';

const KeyIdParams = z.object({ key_id: z.string().uuid('key_id must be a key id (uuid)').describe('A key id (GET /keys lists them).') });

const ApiKeyInfoSchema = named(
  'ApiKeyInfo',
  z
    .object({
      key_id: z.string().uuid(),
      type: z.enum(KEY_TYPES),
      display_prefix: z.string().describe('The first characters of the key, to recognise it by.'),
      name: z.string().nullable(),
      created_at: z.string().datetime(),
      last_used_at: z.string().datetime().nullable().describe('Updated at most once a minute.'),
      revoked_at: z.string().datetime().nullable(),
      expires_at: z.string().datetime().nullable().describe('Set on a rotated key: it stops working then.'),
      replaced_by_key_id: z.string().uuid().nullable().describe('Set on a rotated key: the key that replaced it.'),
    })
    .describe('A key of the account, without its secret.'),
);

const KeyListSchema = z.object({ keys: z.array(ApiKeyInfoSchema).describe('Newest first, revoked and rotated keys included.') });

const RotatedKeySchema = named(
  'RotatedKey',
  z.object({
    key_id: z.string().uuid(),
    api_key: z.string().describe('The new key, shown only in this answer.'),
    type: z.enum(ROTATABLE_TYPES as [KeyType, ...KeyType[]]).describe('The type of the key it replaces.'),
    name: z.string().nullable().describe('The name of the key it replaces.'),
    display_prefix: z.string(),
    created_at: z.string().datetime(),
    replaces: z.object({
      key_id: z.string().uuid(),
      expires_at: z.string().datetime().describe('The old key stops working then, on every replica.'),
      grace_seconds: z.number().int().describe('KEY_ROTATION_GRACE_SECONDS.'),
    }),
  }),
);

const RevokedKeySchema = z.object({
  key_id: z.string().uuid(),
  type: z.enum(KEY_TYPES),
  revoked: z.literal(true),
  revoked_at: z.string().datetime().describe('When it was first revoked (revoking a revoked key answers its first revocation).'),
});

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

  app.get(
    '/keys',
    {
      schema: {
        operationId: 'listKeys',
        tags: ['Keys'],
        summary: "The account's keys without secrets (production key only)",
        description:
          "Every key of the account, newest first: revoked and rotated keys too, never a secret or hash. Only the account's current production key " +
          'lists keys (other keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace).',
        response: { '200': ok(KeyListSchema, "The account's keys.", { headers: RATE_LIMIT }), ...errors(['403']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireKeyOwner(caller, 'list keys');
      return { keys: await accounts.listKeys(caller.accountId) };
    },
  );

  app.post(
    '/keys/:key_id/rotate',
    {
      schema: {
        operationId: 'rotateKey',
        tags: ['Keys'],
        summary: 'Replace a key with a new one of the same type (shown once); the old one works KEY_ROTATION_GRACE_SECONDS more',
        description:
          "Only the account's current production key rotates keys (agent, VIP, sandbox and sub-keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace). " +
          "It rotates the account's production, agent, VIP and sandbox keys, itself included; a sub-key: 403 forbidden (replace it through /subkeys). " +
          'The new key has the same type and name and is shown once; the old one stops at `replaces.expires_at` on every replica, ' +
          'and until then only calls tools and reads its own jobs. A key_id that is not a uuid: 400. A key of another account: 404. ' +
          'A key already rotated, revoked or expired: 409 key_not_active.',
        params: KeyIdParams,
        response: { '201': ok(RotatedKeySchema, 'The replacement (api_key shown once).', { headers: RATE_LIMIT }), ...errors(['400', '403', '404', '409']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireKeyOwner(caller, 'rotate keys');
      const { key_id: keyId } = input<typeof KeyIdParams>(req, 'params', 'Key id is invalid');
      const grace = config.KEY_ROTATION_GRACE_SECONDS;
      const r = await accounts.rotateKey(keyId, caller.accountId, grace, ROTATABLE_TYPES);
      if (!r.ok) {
        switch (r.state) {
          case 'missing':
            throw new AppError('not_found', `No key ${keyId} on this account`);
          case 'not_rotatable':
            throw new AppError('forbidden', `${r.type} keys are not rotated here: create a new sub-key with POST /subkeys/create and delete the old one`, {
              key_type: r.type,
            });
          default:
            throw new AppError(
              'key_not_active',
              `Key ${keyId} cannot be rotated: it ${r.state === 'rotated' ? 'was already rotated; rotate its replacement' : `is ${r.state}`}`,
              { state: r.state },
            );
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
    },
  );

  // Revokes a key at once, grace or not: after a leak, rotate the key, then revoke the old one.
  app.delete(
    '/keys/:key_id',
    {
      schema: {
        operationId: 'revokeKey',
        tags: ['Keys'],
        summary: 'Revoke a key of the account at once (a rotated key in its grace included); production key only',
        description:
          'Revokes any key of the account at once, whatever its type, a rotated key in its grace included; every replica refuses it within milliseconds. ' +
          "Only the account's current production key revokes keys (other keys: 403 forbidden; a rotated key in its grace: 403 key_in_grace). " +
          'After a leak: rotate the key, then revoke the old one with its replacement. A key cannot revoke itself (403). ' +
          'Revoking a revoked key answers its first revocation. A key_id that is not a uuid: 400. A key of another account: 404.',
        params: KeyIdParams,
        response: { '200': ok(RevokedKeySchema, 'The key is revoked.', { headers: RATE_LIMIT }), ...errors(['400', '403', '404']) },
      } satisfies RouteSchema,
    },
    async (req, reply) => {
      const caller = await app.authenticate(req, reply);
      requireKeyOwner(caller, 'revoke keys');
      const { key_id: keyId } = input<typeof KeyIdParams>(req, 'params', 'Key id is invalid');
      if (keyId === caller.keyId) {
        throw new AppError('forbidden', 'A key cannot revoke itself: rotate it (POST /keys/{key_id}/rotate), then revoke it with its replacement', {
          key_id: keyId,
        });
      }
      const revoked = await accounts.revokeAccountKey(keyId, caller.accountId);
      if (!revoked) throw new AppError('not_found', `No key ${keyId} on this account`);
      await forgetKeys();
      return { key_id: revoked.key_id, type: revoked.type, revoked: true, revoked_at: revoked.revoked_at };
    },
  );
}
