/**
 * pay/export: the usage export to billing systems (docs/guides/usage-export.md). Every ledger entry,
 * in order and once per target, to an OpenMeter-compatible CloudEvents ingest and to a Stripe meter.
 */
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { type Config, ConfigError } from '../../config.js';
import type { DatabasePool } from '../../db/pool.js';
import { UsageExporter } from './exporter.js';
import { CloudEventsTarget, type ExportTarget, StripeMeterStreamTarget, StripeMeterTarget } from './targets.js';

export { UsageExporter } from './exporter.js';
export { LedgerFeed, type Cursor, type LedgerEntry, type TargetName } from './ledger-feed.js';
export { CloudEventsTarget, StripeMeterStreamTarget, StripeMeterTarget, cloudEvent, exportId, CLOUDEVENTS_SOURCE } from './targets.js';

/** What a header value may hold (visible ASCII): anything else could split the request. */
const HEADER_SAFE = /^[\x21-\x7e]+$/;
/** Stripe meter event names: short, and nothing a form body or a dashboard would mangle. */
const EVENT_NAME = /^[A-Za-z0-9_.:-]{1,100}$/;

function httpUrl(name: string, value: string): void {
  const protocol = new URL(value).protocol;
  if (protocol !== 'http:' && protocol !== 'https:') throw new ConfigError(`${name}: must be an http(s) URL, not ${protocol}`);
}

/**
 * The configured targets, or an error naming the variable that is wrong (start-up stops on it). The
 * schema in src/config.ts has already checked the URLs parse and that a meter needs a Stripe key.
 */
export function exportTargets(config: Config): ExportTarget[] {
  const targets: ExportTarget[] = [];
  if (config.EXPORT_CLOUDEVENTS_TOKEN && !config.EXPORT_CLOUDEVENTS_URL)
    throw new ConfigError('EXPORT_CLOUDEVENTS_TOKEN: set without EXPORT_CLOUDEVENTS_URL, where would it be sent?');
  if (config.EXPORT_CLOUDEVENTS_URL) {
    httpUrl('EXPORT_CLOUDEVENTS_URL', config.EXPORT_CLOUDEVENTS_URL);
    if (config.EXPORT_CLOUDEVENTS_TOKEN && !HEADER_SAFE.test(config.EXPORT_CLOUDEVENTS_TOKEN))
      throw new ConfigError('EXPORT_CLOUDEVENTS_TOKEN: only visible ASCII characters, no spaces or line breaks');
    targets.push(new CloudEventsTarget(config.EXPORT_CLOUDEVENTS_URL, config.EXPORT_CLOUDEVENTS_TOKEN));
  }
  if (config.EXPORT_STRIPE_METER_EVENT) {
    if (!EVENT_NAME.test(config.EXPORT_STRIPE_METER_EVENT))
      throw new ConfigError('EXPORT_STRIPE_METER_EVENT: a meter event name is 1 to 100 of A-Z a-z 0-9 _ . : -');
    if (config.STRIPE_API_URL) httpUrl('STRIPE_API_URL', config.STRIPE_API_URL);
    const Meter = config.EXPORT_STRIPE_METER_API === 'v1' ? StripeMeterTarget : StripeMeterStreamTarget;
    targets.push(new Meter(config.STRIPE_SECRET_KEY, config.EXPORT_STRIPE_METER_EVENT, config.STRIPE_API_URL));
  }
  return targets;
}

/** The exporter for this process, or null when no target is configured (the export is off). */
export function createUsageExporter(config: Config, deps: { db: DatabasePool; log: Logger; registry: Registry }): UsageExporter | null {
  const targets = exportTargets(config);
  if (!targets.length) return null;
  return new UsageExporter({
    db: deps.db,
    databaseUrl: config.DATABASE_URL,
    targets,
    log: deps.log,
    registry: deps.registry,
    batchSize: config.EXPORT_BATCH_SIZE,
    intervalMs: config.EXPORT_INTERVAL_MS,
  });
}
