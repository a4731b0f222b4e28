// The change stream (GET /v1/changes, docs/api.md): one long poll at a time from the
// index of the last answer, in pages of at most PAGE tasks. It starts from the
// master's current index (`head`), not from 0: the pages read what they show
// themselves, so a cell of 1,000,000 tasks is not downloaded on the first load. It
// tells the open page what changed so it redraws without a reload.

import { ApiError, get } from "./api";
import type { ChangesView } from "./types";

export type Listener = (c: ChangesView) => void;

/** The most tasks one answer of the stream carries (the master's cap is 5,000). */
const PAGE = 1000;

/** Follows the stream and tells the listeners. */
export class Live {
  index = 0;
  /** The page point inside a batch when the last answer was one page (`more`). */
  private after: string | null = null;
  /** The first answer arrived: the stream follows from the master's index. */
  loaded = false;
  private listeners = new Set<Listener>();
  private stopped = false;
  private controller: AbortController | null = null;

  constructor(private readonly status: (text: string) => void) {}

  /** Calls `f` after every answer with changes; returns the unsubscribe. */
  subscribe(f: Listener): () => void {
    this.listeners.add(f);
    return () => this.listeners.delete(f);
  }

  /** Polls until `stop`; waits a little longer after each failure. */
  async run(): Promise<void> {
    let backoff = 500;
    while (!this.stopped) {
      this.controller = new AbortController();
      try {
        if (!this.loaded) {
          // Where the stream is now: one task at most, no wait; follow from `head`.
          const c = await get<ChangesView>("/v1/changes?index=0&limit=1&wait_ms=0", this.controller.signal);
          this.index = c.head;
          this.loaded = true;
        } else {
          const after = this.after === null ? "" : `&after=${encodeURIComponent(this.after)}`;
          const c = await get<ChangesView>(
            `/v1/changes?index=${this.index}&limit=${PAGE}${after}&wait_ms=25000`,
            this.controller.signal,
          );
          this.apply(c);
        }
        backoff = 500;
        this.status("live");
      } catch (e) {
        if (this.stopped) return;
        if (e instanceof ApiError && e.status === 401) return;
        this.status("reconnecting…");
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(backoff * 2, 10_000);
      }
    }
  }

  stop(): void {
    this.stopped = true;
    this.controller?.abort();
  }

  private apply(c: ChangesView): void {
    this.index = c.index;
    this.after = c.more ? (c.after ?? null) : null;
    if (c.reset || c.tasks.length || c.jobs.length || c.agents.length || (c.updates?.length ?? 0) > 0) {
      for (const f of this.listeners) f(c);
    }
  }
}
