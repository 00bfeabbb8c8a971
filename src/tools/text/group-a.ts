import type { AnyTool } from '../types.js';
import { beaconScan } from './beacon-scan.js';
import { quickVibe } from './quick-vibe.js';
import { beaconCompress } from './beacon-compress.js';
import { beaconRank } from './beacon-rank.js';
import { beaconExtract } from './beacon-extract.js';
import { beaconFocus } from './beacon-focus.js';

/** Part of the text family (see index.ts); one engineer's tools per file. */
export const textToolsA: AnyTool[] = [beaconScan, quickVibe, beaconCompress, beaconRank, beaconExtract, beaconFocus];
