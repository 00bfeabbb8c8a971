import type { FoldClusterInput, FoldClusterOutput } from './fold-cluster.js';
import type { PassagesInput, PassagesOutput } from './plus-passages.js';

/**
 * The llm family's CPU tasks for the sandbox pool (see src/tools/tasks.ts): parsing caller-chosen
 * content runs in a thread, never on the worker's event loop. Add `name: { input; output }` here and the
 * module that exports the function below; a thread imports only that module.
 */
export interface LlmTaskTypes {
  /** idea_fold: stemmed TF-IDF, cosine, average-linkage clustering of the caller's ideas. */
  idea_fold_cluster: { input: FoldClusterInput; output: FoldClusterOutput };
  /** genius_plus: fetched pages cut into passages, scored by BM25+ and chosen within a token budget. */
  genius_plus_passages: { input: PassagesInput; output: PassagesOutput };
}

const EXT = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
export const moduleUrl = (path: string) => new URL(`${path}${EXT}`, import.meta.url).href;

export const LLM_TASKS: { [K in keyof LlmTaskTypes]: { module: string; export: string } } = {
  idea_fold_cluster: { module: moduleUrl('./fold-cluster'), export: 'foldClusterTask' },
  genius_plus_passages: { module: moduleUrl('./plus-passages'), export: 'selectPassagesTask' },
};
