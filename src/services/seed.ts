import type { Container } from '../container.js';
import { AdminService } from './admin.js';

/** SEED_DEMO=true: one pro account with $10 of credits, its key printed so the README's examples work. */
export async function seedDemo(c: Container): Promise<void> {
  const admin = new AdminService({ accounts: c.accounts, credits: c.credits, redis: c.redis, prefix: c.config.REDIS_PREFIX });
  const demo = await admin.createAccount('pro', 1000, 'demo');
  process.stdout.write(`\nDemo account ${demo.account_id}\n  export TOLLGATE_KEY=${demo.api_key}\n\n`);
}
