// The change stream (GET /v1/changes, docs/api.md): one long poll at a time from the
// index of the last answer. Keeps the latest view of every task, job summary and
// agent it has seen, and tells the open page what changed so it redraws without a
// reload.

import { ApiError, get } from "./api";
import type { AgentView, ChangesView, JobSummary, TaskView } from "./types";

export type Listener = (c: ChangesView) => void;

/** What the stream has delivered so far, kept current. */
export class Live {
  index = 0;
  tasks = new Map<string, TaskView>();
  jobs = new Map<string, JobSummary>();
  agents = new Map<string, AgentView>();
  /** At least one answer arrived (the maps hold the whole cluster). */
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
        const c = await get<ChangesView>(
          `/v1/changes?index=${this.index}&wait_ms=25000`,
          this.controller.signal,
        );
        backoff = 500;
        this.apply(c);
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
    if (c.reset) {
      this.tasks.clear();
      this.jobs.clear();
      this.agents.clear();
    }
    for (const t of c.tasks) this.tasks.set(t.task_id, t);
    for (const j of c.jobs) this.jobs.set(j.key, j);
    for (const a of c.agents) this.agents.set(a.agent_id, a);
    this.index = c.index;
    const first = !this.loaded;
    this.loaded = true;
    if (first || c.reset || c.tasks.length || c.jobs.length || c.agents.length) {
      for (const f of this.listeners) f(c);
    }
  }
}
