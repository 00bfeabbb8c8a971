import type { AnyTool } from '../types.js';
import { deployVerify } from './deploy-verify.js';
import { discoveryCollision } from './discovery-collision.js';
import { grabrIntel } from './grabr-intel.js';
import { grabrWayback } from './grabr-wayback.js';
import { webSearch } from './web-search.js';

/** web_search, deploy_verify, discovery_collision, grabr_intel, grabr_wayback. */
export const webToolsA: AnyTool[] = [webSearch, deployVerify, discoveryCollision, grabrIntel, grabrWayback] as AnyTool[];
