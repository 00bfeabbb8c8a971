/** Sandbox tasks of web_search, deploy_verify, discovery_collision, grabr_intel, grabr_wayback (combined in ./tasks.ts). */
// eslint-disable-next-line @typescript-eslint/no-empty-interface
export interface WebTaskTypesA {}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;
void moduleUrl;

export const WEB_TASKS_A: { [K in keyof WebTaskTypesA]: { module: string; export: string } } = {};
