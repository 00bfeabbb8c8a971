import type { AnyTool } from '../types.js';
import { grabrScrape } from './grabr-scrape.js';

/** grabr_scrape, grabr_contact, grabr_sitemap, grabr_batch. */
export const webToolsB: AnyTool[] = [grabrScrape as AnyTool];
