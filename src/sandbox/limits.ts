import type { Config } from '../config.js';
import { AppError } from '../errors.js';
import type { ToolLimits } from '../tools/types.js';

export type { ToolLimits };

export interface ResolvedLimits {
  timeMs: number;
  memoryMb: number;
  /** Largest result, as JSON bytes, measured in the thread before it is sent back. */
  maxResultBytes: number;
}

export type LimitKind = 'time' | 'memory' | 'size';

/** V8's default thread stack; set explicitly so a thread never inherits an unusual one. */
export const THREAD_STACK_MB = 4;

export function resolveLimits(config: Config, limits: ToolLimits | undefined): ResolvedLimits {
  return {
    timeMs: limits?.timeMs ?? config.TOOL_TIME_MS,
    memoryMb: limits?.memoryMb ?? config.TOOL_MEMORY_MB,
    maxResultBytes: config.TOOL_MAX_RESULT_BYTES,
  };
}

/**
 * The young generation counts towards a thread's heap too; a small fixed share keeps scavenges
 * cheap without letting short-lived garbage slip past the old-generation cap.
 */
export function youngGenerationMb(memoryMb: number): number {
  return Math.max(2, Math.min(32, Math.floor(memoryMb / 8)));
}

const UNIT: Record<LimitKind, string> = { time: 'ms', memory: 'MB', size: 'bytes' };
const WHAT: Record<LimitKind, string> = {
  time: 'ran longer than its time limit',
  memory: 'used more than its memory limit',
  size: 'produced a result larger than its size limit',
};

/** The one error every exceeded limit becomes: 422, not retried, not charged. */
export function limitExceeded(label: string, limit: LimitKind, value: number): AppError {
  const stopped = limit === 'size' ? '' : ' and was stopped';
  return new AppError('limit_exceeded', `${label} ${WHAT[limit]} of ${value} ${UNIT[limit]}${stopped}`, {
    limit,
    limit_value: value,
  });
}
