import type { QueriesInput, QueriesOutput, ScoreInput, ScoreOutput } from './collision-nlp.js';
import type { IntelPageInput, IntelPageOutput } from './intel-page.js';
import type { RobotsInput, RobotsOutput } from './intel-robots.js';
import type { RobotsCheckInput, RobotsCheckOutput } from './robots-task.js';
import type { MetaTaskInput, MetaTaskOutput, ScrapeTaskInput, ScrapeTaskOutput } from './scrape-html.js';
import type { ContactPageInput, ContactPageOutput } from './contact-parse.js';
import type { SitemapTaskInput, SitemapTaskOutput } from './sitemap-task.js';

/**
 * The web family's CPU tasks for the sandbox pool (see src/tools/tasks.ts): parsing what a site sent
 * (HTML, XML, robots.txt) and scoring runs in a thread, never on the worker's event loop. A thread
 * imports only the module of the task it runs.
 */
export interface WebTaskTypes {
  /** discovery_collision: search queries from the idea's noun phrases (compromise). */
  collision_queries: { input: QueriesInput; output: QueriesOutput };
  /** discovery_collision: stemmed TF-IDF cosine of the idea against each search hit (and page read). */
  collision_score: { input: ScoreInput; output: ScoreOutput };
  /** grabr_intel: SEO basics and technology fingerprints of the home page. */
  intel_page: { input: IntelPageInput; output: IntelPageOutput };
  /** grabr_intel: robots.txt rules for GRABR_USER_AGENT and a summary of the file. */
  intel_robots: { input: RobotsInput; output: RobotsOutput };
  /** robots.ts: parse a robots.txt (robots-parser) and check URLs for GRABR_USER_AGENT. */
  robots_check: { input: RobotsCheckInput; output: RobotsCheckOutput };
  /** grabr_scrape / grabr_batch scrape mode: CSS-selector fields, metadata, JSON-LD, links, text. */
  scrape_html: { input: ScrapeTaskInput; output: ScrapeTaskOutput };
  /** grabr_batch meta mode: title, description, canonical, lang, og:*, JSON-LD types. */
  page_meta: { input: MetaTaskInput; output: MetaTaskOutput };
  /** grabr_contact: the contact points of one page and its contact-like links. */
  contact_page: { input: ContactPageInput; output: ContactPageOutput };
  /** grabr_sitemap: one sitemap file, capped gunzip, DOCTYPE refused, filtered entries. */
  sitemap_file: { input: SitemapTaskInput; output: SitemapTaskOutput };
}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;

export const WEB_TASKS: { [K in keyof WebTaskTypes]: { module: string; export: string } } = {
  collision_queries: { module: moduleUrl('./collision-nlp'), export: 'collisionQueriesTask' },
  collision_score: { module: moduleUrl('./collision-nlp'), export: 'collisionScoreTask' },
  intel_page: { module: moduleUrl('./intel-page'), export: 'intelPageTask' },
  intel_robots: { module: moduleUrl('./intel-robots'), export: 'robotsTask' },
  robots_check: { module: moduleUrl('./robots-task'), export: 'robotsCheckTask' },
  scrape_html: { module: moduleUrl('./scrape-html'), export: 'scrapeTask' },
  page_meta: { module: moduleUrl('./scrape-html'), export: 'metaTask' },
  contact_page: { module: moduleUrl('./contact-parse'), export: 'contactPageTask' },
  sitemap_file: { module: moduleUrl('./sitemap-task'), export: 'sitemapTask' },
};
