// The cluster overview: eviction guard, hosts, capacity used and free, instances by
// state across all jobs, and why tasks are pending (from the change stream's tasks).

import { get } from "../api";
import { counts, cores, h, humanBytes, link, table } from "../dom";
import type { Ctx, Page } from "../page";
import { refresher } from "../page";
import type { AgentView, ClusterView, JobSummary, StateCounts, TaskState } from "../types";
import { errorBox, getIfAllowed, notAllowed } from "./common";

export function overviewPage(root: HTMLElement, ctx: Ctx): Page {
  const body = h("div", { "aria-busy": "true" }, "Loading…");
  root.append(h("h1", {}, "Cluster"), body);
  const load = async () => {
    try {
      const [cluster, agents, jobs] = await Promise.all([
        getIfAllowed<ClusterView>("/v1/cluster"),
        getIfAllowed<AgentView[]>("/v1/agents"),
        get<JobSummary[]>("/v1/jobs"),
      ]);
      body.replaceChildren(...render(ctx, cluster, agents, jobs));
      body.removeAttribute("aria-busy");
    } catch (e) {
      body.replaceChildren(errorBox(e));
    }
  };
  const r = refresher(load, 1000);
  const unsubscribe = ctx.live.subscribe(() => r.trigger());
  return { dispose: unsubscribe };
}

function render(
  ctx: Ctx,
  cluster: ClusterView | null,
  agents: AgentView[] | null,
  jobs: JobSummary[],
): Node[] {
  const out: Node[] = [];
  if (cluster?.eviction_guard.engaged) {
    out.push(
      h(
        "p",
        { class: "alarm", role: "alert" },
        h("strong", {}, "Eviction guard engaged: "),
        cluster.eviction_guard.message,
      ),
    );
  }
  // Hosts and capacity.
  out.push(h("h2", {}, "Hosts"));
  if (agents === null) {
    out.push(notAllowed("Hosts and capacity"));
  } else {
    const modes = new Map<string, number>();
    for (const a of agents) modes.set(a.maintenance, (modes.get(a.maintenance) ?? 0) + 1);
    const reachable = agents.filter((a) => a.reachable).length;
    out.push(
      h(
        "p",
        {},
        `${agents.length} host(s), ${reachable} reachable; maintenance: `,
        [...modes].map(([m, n]) => `${m} ${n}`).join(", ") || "none",
        " · ",
        link("/ui/hosts", "all hosts"),
      ),
    );
    const sum = (f: (a: AgentView) => number) => agents.reduce((s, a) => s + f(a), 0);
    const row = (what: string, total: number, free: number, fmt: (n: number) => string) =>
      h("tr", {}, h("th", { scope: "row" }, what), h("td", {}, fmt(total - free)), h("td", {}, fmt(free)), h("td", {}, fmt(total)));
    out.push(
      table("Capacity", ["RESOURCE", "USED", "FREE", "TOTAL"], [
        row("cpu", sum((a) => a.resources.cpu), sum((a) => a.free.cpu), cores),
        row("ram", sum((a) => a.resources.ram_bytes), sum((a) => a.free.ram_bytes), humanBytes),
        row("disk", sum((a) => a.resources.disk_bytes), sum((a) => a.free.disk_bytes), humanBytes),
      ]),
    );
  }
  // Instances by state.
  const total: StateCounts = {};
  for (const j of jobs) {
    for (const [s, n] of Object.entries(j.state_counts)) {
      total[s as TaskState] = (total[s as TaskState] ?? 0) + (n ?? 0);
    }
  }
  out.push(
    h("h2", {}, "Tasks by state"),
    h("p", {}, counts(total), ` across ${jobs.length} job(s) · `, link("/ui/roles", "jobs by role")),
  );
  // Pending reasons, from the stream's latest view of every task.
  out.push(h("h2", {}, "Why tasks are pending"));
  if (!ctx.live.loaded) {
    out.push(h("p", { class: "note" }, "Waiting for the change stream…"));
  } else {
    const reasons = new Map<string, { n: number; jobs: Set<string> }>();
    for (const t of ctx.live.tasks.values()) {
      if (t.state !== "PENDING") continue;
      const reason = t.pending_reason ?? "not tried yet";
      const r = reasons.get(reason) ?? { n: 0, jobs: new Set<string>() };
      r.n += 1;
      r.jobs.add(t.job);
      reasons.set(reason, r);
    }
    const top = [...reasons].sort((a, b) => b[1].n - a[1].n).slice(0, 10);
    out.push(
      top.length === 0
        ? h("p", {}, "No task is pending.")
        : table(
            "Pending reasons",
            ["TASKS", "REASON", "JOBS"],
            top.map(([reason, r]) =>
              h(
                "tr",
                {},
                h("td", {}, String(r.n)),
                h("td", {}, reason),
                h("td", {}, [...r.jobs].slice(0, 5).flatMap((k, i) => [i ? ", " : "", jobLink(k)]), r.jobs.size > 5 ? ` and ${r.jobs.size - 5} more` : ""),
              ),
            ),
          ),
    );
  }
  return out;
}

/** A link to a job's page. */
export function jobLink(key: string): HTMLAnchorElement {
  return link("/ui/jobs/" + key.split("/").map(encodeURIComponent).join("/"), key);
}
