import type { AnyTool } from '../types.js';

/** grabr_scrape, grabr_contact, grabr_sitemap, grabr_batch. */
export const webToolsB: AnyTool[] = [];
