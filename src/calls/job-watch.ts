import type { AppError } from '../errors.js';
import type { CompletionDispatcher, JobEvent } from '../queue/dispatcher.js';
import type { CallResult } from '../queue/call-job.js';

export type Finished =
  | { state: 'completed'; jobId: string; value: CallResult }
  | { state: 'failed'; jobId: string; error: AppError }
  /** The watch was stopped (the client went away) before the job finished. */
  | { state: 'stopped' };

/**
 * Follows one job from before it is queued until it completes or fails, for endpoints that wait as
 * long as their client does (chat completions, MCP tools/call) rather than the sync timeout of
 * POST /tools/{name}. Pass `attach` as CallOptions.onJobId so no event can slip past; events that
 * arrive before a listener is set are kept and replayed to it in order.
 */
export class JobWatch {
  private jobId: string | null = null;
  private unsubscribe: () => void = () => {};
  private listener: ((e: JobEvent) => void) | null = null;
  private readonly buffered: JobEvent[] = [];
  private settle!: (f: Finished) => void;
  private settled = false;
  readonly finished: Promise<Finished>;

  constructor(
    private readonly dispatcher: CompletionDispatcher,
    /** Keep progress events for a listener; without one they are dropped (nothing would read them). */
    private readonly keepProgress: boolean,
  ) {
    this.finished = new Promise((resolve) => {
      this.settle = resolve;
    });
  }

  readonly attach = (jobId: string): void => {
    this.jobId = jobId;
    this.unsubscribe = this.dispatcher.subscribe(jobId, (e) => this.receive(e));
  };

  /** Delivers the events seen so far, then each new one as it comes, the final one included. */
  listen(listener: (e: JobEvent) => void): void {
    this.listener = listener;
    for (const e of this.buffered.splice(0)) listener(e);
  }

  stop(): void {
    this.finish({ state: 'stopped' });
  }

  private receive(e: JobEvent): void {
    if (this.settled) return;
    if (e.type !== 'progress' || this.keepProgress) {
      if (this.listener) this.listener(e);
      else this.buffered.push(e);
    }
    if (e.type === 'completed') this.finish({ state: 'completed', jobId: e.jobId, value: e.value });
    else if (e.type === 'failed') this.finish({ state: 'failed', jobId: e.jobId, error: e.error });
  }

  private finish(f: Finished): void {
    if (this.settled) return;
    this.settled = true;
    this.unsubscribe();
    this.settle(f);
  }

  get id(): string | null {
    return this.jobId;
  }
}
