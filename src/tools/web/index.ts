import type { AnyTool } from '../types.js';
import { domainCheck } from './domain-check.js';
import { pageFetch } from './page-fetch.js';
import { webSearch } from './web-search.js';
import { deployVerify } from './deploy-verify.js';
import { discoveryCollision } from './discovery-collision.js';
import { grabrIntel } from './grabr-intel.js';
import { grabrWayback } from './grabr-wayback.js';
import { grabrScrape } from './grabr-scrape.js';
import { grabrContact } from './grabr-contact.js';
import { grabrSitemap } from './grabr-sitemap.js';
import { grabrBatch } from './grabr-batch.js';

export const webTools: AnyTool[] = [
  pageFetch,
  domainCheck,
  webSearch,
  deployVerify,
  discoveryCollision,
  grabrIntel,
  grabrWayback,
  grabrScrape,
  grabrContact,
  grabrSitemap,
  grabrBatch,
] as AnyTool[];
