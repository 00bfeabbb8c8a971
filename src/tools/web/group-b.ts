import type { AnyTool } from '../types.js';
import { grabrScrape } from './grabr-scrape.js';
import { grabrContact } from './grabr-contact.js';
import { grabrSitemap } from './grabr-sitemap.js';
import { grabrBatch } from './grabr-batch.js';

/** grabr_scrape, grabr_contact, grabr_sitemap, grabr_batch. */
export const webToolsB: AnyTool[] = [grabrScrape as AnyTool, grabrContact as AnyTool, grabrSitemap as AnyTool, grabrBatch as AnyTool];
