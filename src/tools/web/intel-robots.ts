import robotsParserModule from 'robots-parser';

type RobotsParser = typeof robotsParserModule.default;
// A CommonJS module whose export is the function itself; its types declare it as `default`.
const robotsParser: RobotsParser = typeof robotsParserModule === 'function' ? (robotsParserModule as unknown as RobotsParser) : robotsParserModule.default;

/**
 * grabr_intel's robots.txt pool task (tasks.ts `intel_robots`): whether a user agent may fetch some
 * URLs, and a summary of the file. A robots.txt is a stranger's text, so it is parsed in a sandbox
 * thread. A missing robots.txt (4xx) allows everything; one that could not be read (5xx) is treated
 * as disallowing everything, as RFC 9309 asks. The module loads without side effects.
 */

export interface RobotsInput {
  /** The robots.txt URL (its origin scopes the rules). */
  url: string;
  /** The HTTP status it answered with, or null when it could not be fetched at all. */
  status: number | null;
  text: string;
  userAgent: string;
  /** Absolute URLs to judge. */
  urls: string[];
}

export interface RobotsOutput {
  allowed: boolean[];
  /** The robots.txt exists (2xx) and was read. */
  found: boolean;
  sitemaps: string[];
  crawl_delay: number | null;
  /** User-agent names the file has groups for, in file order. */
  user_agents: string[];
  disallow_rules: number;
  allow_rules: number;
}

const MAX_LIST = 50;

export function robotsTask(input: RobotsInput): RobotsOutput {
  const status = input.status;
  if (status === null || status < 200 || status >= 300) {
    // RFC 9309 2.3.1.3/2.3.1.4: unavailable (4xx) means no rules; unreachable (5xx) means complete disallow.
    const unreachable = status !== null && status >= 500;
    return { allowed: input.urls.map(() => !unreachable), found: false, sitemaps: [], crawl_delay: null, user_agents: [], disallow_rules: 0, allow_rules: 0 };
  }
  const robots = robotsParser(input.url, input.text);
  const userAgents: string[] = [];
  let disallow = 0;
  let allow = 0;
  for (const raw of input.text.split(/\r\n|\r|\n/)) {
    const line = raw.replace(/#.*$/, '').trim();
    const m = /^([a-z-]+)\s*:\s*(.*)$/i.exec(line);
    if (!m) continue;
    const key = m[1]!.toLowerCase();
    const value = m[2]!.trim();
    if (key === 'user-agent' && value && !userAgents.includes(value) && userAgents.length < MAX_LIST) userAgents.push(value);
    else if (key === 'disallow' && value) disallow += 1;
    else if (key === 'allow' && value) allow += 1;
  }
  return {
    allowed: input.urls.map((u) => robots.isAllowed(u, input.userAgent) !== false),
    found: true,
    sitemaps: robots.getSitemaps().slice(0, MAX_LIST),
    crawl_delay: robots.getCrawlDelay(input.userAgent) ?? null,
    user_agents: userAgents,
    disallow_rules: disallow,
    allow_rules: allow,
  };
}
