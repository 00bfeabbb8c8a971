import robotsParserModule from 'robots-parser';

type RobotsParser = typeof robotsParserModule.default;
// A CommonJS module whose export is the function itself; its types declare it as `default`.
const robotsParser: RobotsParser = typeof robotsParserModule === 'function' ? (robotsParserModule as unknown as RobotsParser) : robotsParserModule.default;

/**
 * The robots.txt pool task of the grabr_* tools: parses a robots.txt (at most ROBOTS_MAX_BYTES) with
 * robots-parser and answers, for each URL, whether `userAgent` may fetch it. Matching rules with
 * wildcards costs pattern length × path length per rule, so a hostile robots.txt is CPU work on
 * fetched content and runs in the sandbox pool, never on the worker's event loop.
 */

export interface RobotsCheckInput {
  /** The robots.txt URL (origin + "/robots.txt"): its rules apply to URLs of that origin only. */
  robotsUrl: string;
  text: string;
  userAgent: string;
  urls: string[];
}

export interface RobotsCheckOutput {
  /** Per URL, in order: false when a Disallow rule (longest match wins, Allow on ties) forbids it. */
  allowed: boolean[];
  /** The file's Sitemap: lines, in order. */
  sitemaps: string[];
}

export function robotsCheckTask({ robotsUrl, text, userAgent, urls }: RobotsCheckInput): RobotsCheckOutput {
  const robots = robotsParser(robotsUrl, text);
  // isAllowed is undefined for a URL of another origin: that file says nothing about it.
  const allowed = urls.map((u) => robots.isAllowed(u, userAgent) !== false);
  return { allowed, sitemaps: robots.getSitemaps() };
}
