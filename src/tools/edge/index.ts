import type { AnyTool } from '../types.js';
import { cfCacheRules, cfDevMode, cfPurgeAll, cfPurgeCache } from './cache.js';
import { cfBulkDns, cfCreateDns, cfDeleteDns, cfGetDns, cfListDns, cfUpdateDns } from './dns.js';
import { cfAnalytics, cfBandwidth, cfThreats } from './insight.js';
import { cfCreatePageRule, cfDeletePageRule, cfListPageRules, cfUpdatePageRule } from './page-rules.js';
import { cfPointToServer } from './point-to-server.js';
import { cfBlockIp, cfFirewallRules, cfUnderAttack } from './security.js';
import { cfSetupEmail } from './setup-email.js';
import { cfSslMode, cfSslStatus } from './ssl.js';
import { cfDeployWorker, cfDeleteWorker, cfListWorkers } from './workers.js';
import { cfCreateZone, cfFindZone, cfGetZone, cfListZones } from './zones.js';

/** The edge-network suite: 31 tools over Cloudflare's API v4, each needing the caller's token. */
export const edgeTools: AnyTool[] = [
  // zones
  cfListZones,
  cfGetZone,
  cfCreateZone,
  cfFindZone,
  // DNS
  cfListDns,
  cfGetDns,
  cfCreateDns,
  cfUpdateDns,
  cfDeleteDns,
  cfBulkDns,
  // SSL
  cfSslStatus,
  cfSslMode,
  // cache
  cfPurgeCache,
  cfPurgeAll,
  cfDevMode,
  cfCacheRules,
  // security
  cfUnderAttack,
  cfBlockIp,
  cfFirewallRules,
  cfThreats,
  // insight
  cfAnalytics,
  cfBandwidth,
  // page rules
  cfListPageRules,
  cfCreatePageRule,
  cfUpdatePageRule,
  cfDeletePageRule,
  // workers
  cfListWorkers,
  cfDeployWorker,
  cfDeleteWorker,
  // convenience
  cfPointToServer,
  cfSetupEmail,
];
