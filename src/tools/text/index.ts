import type { AnyTool } from '../types.js';
import { beaconScan } from './beacon-scan.js';
import { quickVibe } from './quick-vibe.js';
import { beaconCompress } from './beacon-compress.js';
import { beaconRank } from './beacon-rank.js';
import { beaconExtract } from './beacon-extract.js';
import { beaconFocus } from './beacon-focus.js';
import { contextHealth } from './context-health.js';
import { contextCompress } from './context-compress.js';
import { conversationDiagnostic } from './conversation-diagnostic.js';
import { contextExtract } from './context-extract.js';
import { cviVerify } from './cvi-verify.js';
import { handoff } from './handoff.js';
import { cviLoop } from './cvi-loop.js';

/** The text family: CPU work on caller text, no upstream (each tool's work runs in the sandbox pool). */
export const textTools: AnyTool[] = [
  beaconScan,
  quickVibe,
  beaconCompress,
  beaconRank,
  beaconExtract,
  beaconFocus,
  contextHealth,
  contextCompress,
  conversationDiagnostic,
  contextExtract,
  cviVerify,
  handoff,
  cviLoop,
] as AnyTool[];
