import type { AnyTool } from '../types.js';
import { grabrTranscript } from './transcript.js';
import { grabrVideoIntel } from './video-intel.js';

/** grabr_transcript, grabr_video_intel: a video page's player response and caption tracks at YOUTUBE_BASE_URL. */
export const mediaTools: AnyTool[] = [grabrTranscript, grabrVideoIntel];
