// The cluster overview: eviction guard, hosts, capacity used and free, instances by
// state across all jobs, and why tasks are pending (from the jobs' summaries).

import { get } from "../api";
import { counts, cores, h, humanBytes, link, table } from "../dom";
import type { Ctx, Page } from "../page";
import { refresher } from "../page";
import type { ClusterView, JobSummary, StateCounts, TaskState } from "../types";
import { errorBox, getIfAllowed, notAllowed } from "./common";

export function overviewPage(root: HTMLElement, ctx: Ctx): Page {
  const body = h("div", { "aria-busy": "true" }, "Loading…");
  root.append(h("h1", {}, "Cluster"), body);
  const load = async () => {
    try {
      // The cluster's summary, not /v1/agents: an agent's view lists its tasks,
      // which in a cell of 1,000,000 tasks is tens of MB.
      const [cluster, jobs] = await Promise.all([getIfAllowed<ClusterView>("/v1/cluster"), get<JobSummary[]>("/v1/jobs")]);
      body.replaceChildren(...render(cluster, jobs));
      body.removeAttribute("aria-busy");
    } catch (e) {
      body.replaceChildren(errorBox(e));
    }
  };
  const r = refresher(load, 1000);
  const unsubscribe = ctx.live.subscribe(() => r.trigger());
  return { dispose: unsubscribe };
}

function render(cluster: ClusterView | null, jobs: JobSummary[]): Node[] {
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
  if (cluster === null) {
    out.push(notAllowed("Hosts and capacity"));
  } else {
    const modes = Object.entries(cluster.maintenance ?? {});
    out.push(
      h(
        "p",
        {},
        `${cluster.agents} host(s), ${cluster.reachable_agents} reachable; maintenance: `,
        modes.map(([m, n]) => `${m} ${n}`).join(", ") || "none",
        " · ",
        link("/ui/hosts", "all hosts"),
      ),
    );
    const { capacity: total, free } = cluster;
    const row = (what: string, total: number, free: number, fmt: (n: number) => string) =>
      h("tr", {}, h("th", { scope: "row" }, what), h("td", {}, fmt(total - free)), h("td", {}, fmt(free)), h("td", {}, fmt(total)));
    out.push(
      table("Capacity", ["RESOURCE", "USED", "FREE", "TOTAL"], [
        row("cpu", total.cpu, free.cpu, cores),
        row("ram", total.ram_bytes, free.ram_bytes, humanBytes),
        row("disk", total.disk_bytes, free.disk_bytes, humanBytes),
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
  // Pending reasons, from the jobs' summaries: each job's PENDING instances under
  // its reason (no task list is read, whatever the size of the cell).
  out.push(h("h2", {}, "Why tasks are pending"));
  const reasons = new Map<string, { n: number; jobs: Set<string> }>();
  for (const j of jobs) {
    const n = j.state_counts.PENDING ?? 0;
    if (n === 0) continue;
    const reason = j.pending_reason ?? "not tried yet";
    const r = reasons.get(reason) ?? { n: 0, jobs: new Set<string>() };
    r.n += n;
    r.jobs.add(j.key);
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
  return out;
}

/** A link to a job's page. */
export function jobLink(key: string): HTMLAnchorElement {
  return link("/ui/jobs/" + key.split("/").map(encodeURIComponent).join("/"), key);
}
