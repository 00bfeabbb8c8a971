import type { FakeCue } from '../../helpers/fake-youtube.js';

/**
 * Transcript fixtures for the media tests: three talks on unrelated topics, each a list of
 * sentences, laid out as cues of a few seconds each.
 */

export const COFFEE = [
  'Good coffee starts with fresh beans roasted within the last few weeks.',
  'Grind the beans just before brewing so the aroma stays in the cup.',
  'A burr grinder gives an even grind, which makes the extraction even.',
  'For a pour over, use a medium grind and water just off the boil.',
  'Weigh the coffee and the water; fifteen grams of coffee to two hundred fifty grams of water is a good ratio.',
  'Bloom the grounds with a little water first and wait thirty seconds.',
  'Then pour slowly in circles and keep the coffee bed flat.',
  'If the coffee tastes sour, grind finer; if it tastes bitter, grind coarser.',
  'Espresso needs a much finer grind and a machine that holds nine bars of pressure.',
  'Clean the grinder and the brewer often, because old coffee oils taste rancid.',
  'Store beans in an airtight container away from light and heat.',
  'Tasting coffee side by side teaches you what the roast and the grind change.',
];

export const BIKES = [
  'Now let us move to bicycle maintenance, starting with the chain.',
  'A clean chain shifts smoothly and makes the drivetrain last longer.',
  'Wipe the chain with a rag, then apply one drop of lube on every roller.',
  'Check tyre pressure before every ride; the recommended range is printed on the tyre sidewall.',
  'Brake pads wear down, so look at the pads and the rim or rotor every month.',
  'If the brakes squeal, clean the rotor with alcohol and sand the pads lightly.',
  'Gear shifting problems usually mean the cable has stretched; turn the barrel adjuster a quarter turn.',
  'Spokes that are loose make a wheel wobble, and a truing stand helps fix the wheel.',
  'Tighten the stem and handlebar bolts to the torque written on the bicycle parts.',
  'A puncture kit, tyre levers and a small pump fit in a saddle bag.',
  'Replace the chain when a chain checker shows wear, before it damages the cassette.',
  'A well kept bicycle is safer, quieter and faster on every ride.',
];

export const PYTHON = [
  'Finally, some Python programming tips for writing cleaner code.',
  'Use virtual environments so each project keeps its own package versions.',
  'List comprehensions make simple loops shorter and easier to read in Python.',
  'Write functions that do one thing and give them descriptive names.',
  'Type hints help editors catch bugs before the program runs.',
  'Use pytest for unit tests and run the tests on every commit.',
  'Exceptions should be specific; never catch every exception silently.',
  'The standard library has modules for dates, paths, json and regular expressions.',
  'Profile the program before optimising, because the slow function is rarely the one you expect.',
  'Format the code with a formatter so reviews focus on logic, not style.',
  'Read error tracebacks from the bottom, where Python names the failing line.',
  'Small scripts grow into programs, so add tests and documentation early.',
];

/** Sentences as cues: each sentence one cue of 0.4 s per word, back to back from `from` seconds. */
export function cuesOf(sentences: string[], from = 0): FakeCue[] {
  const out: FakeCue[] = [];
  let t = from;
  for (const s of sentences) {
    const dur = Math.round(s.split(' ').length * 0.4 * 1000) / 1000;
    out.push({ start: Math.round(t * 1000) / 1000, dur, text: s });
    t += dur;
  }
  return out;
}

/** The three talks one after another, each repeated `times` over so lexical segmentation has enough words. */
export function threeTopics(times = 2): { cues: FakeCue[]; switches: number[] } {
  const cues: FakeCue[] = [];
  const switches: number[] = [];
  for (const topic of [COFFEE, BIKES, PYTHON]) {
    const start = cues.length ? cues.at(-1)!.start + cues.at(-1)!.dur : 0;
    switches.push(start);
    const sentences = Array.from({ length: times }, () => topic).flat();
    cues.push(...cuesOf(sentences, start));
  }
  return { cues, switches };
}
