import type { RobotsCheckInput, RobotsCheckOutput } from './b-robots-task.js';
import type { MetaTaskInput, MetaTaskOutput, ScrapeTaskInput, ScrapeTaskOutput } from './b-html.js';
import type { ContactPageInput, ContactPageOutput } from './b-contact.js';
import type { SitemapTaskInput, SitemapTaskOutput } from './b-sitemap-task.js';

/** Sandbox tasks of grabr_scrape, grabr_contact, grabr_sitemap, grabr_batch (combined in ./tasks.ts). */
export interface WebTaskTypesB {
  /** robots.ts: parse a robots.txt (robots-parser) and check URLs for GRABR_USER_AGENT. */
  b_robots_check: { input: RobotsCheckInput; output: RobotsCheckOutput };
  /** grabr_scrape / grabr_batch scrape mode: CSS-selector fields, metadata, JSON-LD, links, text. */
  b_scrape: { input: ScrapeTaskInput; output: ScrapeTaskOutput };
  /** grabr_batch meta mode: title, description, canonical, lang, og:*, JSON-LD types. */
  b_meta: { input: MetaTaskInput; output: MetaTaskOutput };
  /** grabr_contact: the contact points of one page and its contact-like links. */
  b_contact_page: { input: ContactPageInput; output: ContactPageOutput };
  /** grabr_sitemap: one sitemap file, capped gunzip, DOCTYPE refused, filtered entries. */
  b_sitemap: { input: SitemapTaskInput; output: SitemapTaskOutput };
}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;

export const WEB_TASKS_B: { [K in keyof WebTaskTypesB]: { module: string; export: string } } = {
  b_robots_check: { module: moduleUrl('./b-robots-task'), export: 'robotsCheckTask' },
  b_scrape: { module: moduleUrl('./b-html'), export: 'scrapeTask' },
  b_meta: { module: moduleUrl('./b-html'), export: 'metaTask' },
  b_contact_page: { module: moduleUrl('./b-contact'), export: 'contactPageTask' },
  b_sitemap: { module: moduleUrl('./b-sitemap-task'), export: 'sitemapTask' },
};
