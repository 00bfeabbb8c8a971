import type { Json3Input, Json3Output, WatchPage, WatchPageInput } from './parse.js';
import type { IntelInput, IntelOutput } from './analyse.js';

/**
 * The media family's CPU tasks for the sandbox pool (see src/tools/tasks.ts): parsing caller-chosen
 * content runs in a thread, never on the worker's event loop. Add `name: { input; output }` here and the
 * module that exports the function below; a thread imports only that module.
 */
export interface MediaTaskTypes {
  /** grabr_*: a watch page's embedded player response (video details, caption tracks). */
  yt_watch_page: { input: WatchPageInput; output: WatchPage };
  /** grabr_*: a json3 caption track as segments (null: not json3). */
  yt_json3: { input: Json3Input; output: Json3Output | null };
  /** grabr_video_intel: chapters, keywords, entities, summary and speaking rate. */
  yt_intel: { input: IntelInput; output: IntelOutput };
}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
export const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;

export const MEDIA_TASKS: { [K in keyof MediaTaskTypes]: { module: string; export: string } } = {
  yt_watch_page: { module: moduleUrl('./parse'), export: 'parseWatchPageTask' },
  yt_json3: { module: moduleUrl('./parse'), export: 'parseJson3Task' },
  yt_intel: { module: moduleUrl('./analyse'), export: 'videoIntelTask' },
};
