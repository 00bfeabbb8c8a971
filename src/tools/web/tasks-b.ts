/** Sandbox tasks of grabr_scrape, grabr_contact, grabr_sitemap, grabr_batch (combined in ./tasks.ts). */
// eslint-disable-next-line @typescript-eslint/no-empty-interface
export interface WebTaskTypesB {}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;
void moduleUrl;

export const WEB_TASKS_B: { [K in keyof WebTaskTypesB]: { module: string; export: string } } = {};
