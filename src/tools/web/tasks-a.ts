import type { QueriesInput, QueriesOutput, ScoreInput, ScoreOutput } from './a-collision-nlp.js';
import type { IntelPageInput, IntelPageOutput } from './a-intel-page.js';
import type { RobotsInput, RobotsOutput } from './a-robots.js';

/** Sandbox tasks of web_search, deploy_verify, discovery_collision, grabr_intel, grabr_wayback (combined in ./tasks.ts). */
export interface WebTaskTypesA {
  /** discovery_collision: search queries from the idea's noun phrases (compromise). */
  a_collision_queries: { input: QueriesInput; output: QueriesOutput };
  /** discovery_collision: stemmed TF-IDF cosine of the idea against each search hit (and page read). */
  a_collision_score: { input: ScoreInput; output: ScoreOutput };
  /** grabr_intel: SEO basics and technology fingerprints of the home page. */
  a_intel_page: { input: IntelPageInput; output: IntelPageOutput };
  /** grabr_intel: robots.txt rules for GRABR_USER_AGENT and a summary of the file. */
  a_robots: { input: RobotsInput; output: RobotsOutput };
}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;

export const WEB_TASKS_A: { [K in keyof WebTaskTypesA]: { module: string; export: string } } = {
  a_collision_queries: { module: moduleUrl('./a-collision-nlp'), export: 'collisionQueriesTask' },
  a_collision_score: { module: moduleUrl('./a-collision-nlp'), export: 'collisionScoreTask' },
  a_intel_page: { module: moduleUrl('./a-intel-page'), export: 'intelPageTask' },
  a_robots: { module: moduleUrl('./a-robots'), export: 'robotsTask' },
};
