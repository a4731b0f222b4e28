// What every page gets and gives back: the shared change stream, navigation, and a
// way to redraw when the stream says something changed (at most a few times a
// second, never two loads at once).

import type { Live } from "./live";

export interface Ctx {
  live: Live;
  navigate(path: string): void;
}

/** A page being shown; `dispose` runs when the user leaves it. */
export interface Page {
  dispose?(): void;
}

export type PageFn = (root: HTMLElement, ctx: Ctx, params: string[]) => Page;

/**
 * Runs `load` now and again on every `trigger()`, coalescing triggers that arrive
 * while a load runs, and leaving at least `gapMs` between loads, or twice the last
 * load's time when that is longer (a job of 10,000 instances is several MB: a busy
 * job then does not keep the page loading all the time).
 */
export function refresher(load: () => Promise<void>, gapMs = 400): { trigger(): void } {
  let running = false;
  let again = false;
  let last = 0;
  let took = 0;
  const run = async (): Promise<void> => {
    if (running) {
      again = true;
      return;
    }
    running = true;
    const wait = last + Math.max(gapMs, 2 * took) - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const started = Date.now();
    try {
      await load();
    } finally {
      last = Date.now();
      took = last - started;
      running = false;
      if (again) {
        again = false;
        void run();
      }
    }
  };
  void run();
  return { trigger: () => void run() };
}
