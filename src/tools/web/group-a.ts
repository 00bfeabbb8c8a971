import type { AnyTool } from '../types.js';

/** web_search, deploy_verify, discovery_collision, grabr_intel, grabr_wayback. */
export const webToolsA: AnyTool[] = [];
