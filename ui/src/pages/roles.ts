// Roles, and one role's jobs arranged as pending, active and finished (Aurora's role
// page, seed 001). A job is pending while any instance waits for a host, finished
// when every instance's task is terminal, active otherwise.

import { get } from "../api";
import { counts, h, link, pager, table, time } from "../dom";
import type { Ctx, Page } from "../page";
import { refresher } from "../page";
import type { JobSummary, StateCounts } from "../types";
import { TERMINAL, WAITING } from "../types";
import { errorBox } from "./common";
import { jobLink } from "./overview";

const PAGE = 100;

/** The job's group on its role page. */
export function jobGroup(c: StateCounts): "pending" | "active" | "finished" {
  const entries = Object.entries(c).filter(([, n]) => (n ?? 0) > 0);
  if (entries.some(([s]) => WAITING.has(s))) return "pending";
  if (entries.every(([s]) => TERMINAL.has(s))) return "finished";
  return "active";
}

/** The CLI's TYPE column: service, batch or cron. */
export function jobType(j: JobSummary): string {
  return j.cron ? "cron" : j.service ? "service" : "batch";
}

export function rolesPage(root: HTMLElement, ctx: Ctx): Page {
  const body = h("div", { "aria-busy": "true" }, "Loading…");
  root.append(h("h1", {}, "Roles"), body);
  const r = refresher(async () => {
    try {
      const jobs = await get<JobSummary[]>("/v1/jobs");
      const roles = new Map<string, JobSummary[]>();
      for (const j of jobs) {
        const role = j.key.split("/")[0];
        roles.set(role, [...(roles.get(role) ?? []), j]);
      }
      const rows = [...roles].map(([role, js]) => {
        const groups = { pending: 0, active: 0, finished: 0 };
        for (const j of js) groups[jobGroup(j.state_counts)] += 1;
        return h(
          "tr",
          {},
          h("td", {}, link(`/ui/roles/${encodeURIComponent(role)}`, role)),
          h("td", {}, String(groups.pending)),
          h("td", {}, String(groups.active)),
          h("td", {}, String(groups.finished)),
        );
      });
      body.replaceChildren(
        rows.length
          ? table("Roles", ["ROLE", "PENDING JOBS", "ACTIVE JOBS", "FINISHED JOBS"], rows)
          : h("p", {}, "No jobs yet (`drover job create SPEC`)."),
      );
      body.removeAttribute("aria-busy");
    } catch (e) {
      body.replaceChildren(errorBox(e));
    }
  }, 1000);
  return { dispose: ctx.live.subscribe(() => r.trigger()) };
}

export function rolePage(root: HTMLElement, ctx: Ctx, [role]: string[]): Page {
  const body = h("div", { "aria-busy": "true" }, "Loading…");
  root.append(
    h("p", { class: "crumbs" }, link("/ui/roles", "Roles"), " / "),
    h("h1", {}, `Role ${role}`),
    body,
  );
  const pages = { pending: 0, active: 0, finished: 0 };
  let jobs: JobSummary[] = [];
  const draw = () => {
    const groups: Record<keyof typeof pages, JobSummary[]> = { pending: [], active: [], finished: [] };
    for (const j of jobs) groups[jobGroup(j.state_counts)].push(j);
    const sections = (["pending", "active", "finished"] as const).map((g) => {
      const list = groups[g];
      const page = Math.min(pages[g], Math.max(0, Math.ceil(list.length / PAGE) - 1));
      const shown = list.slice(page * PAGE, (page + 1) * PAGE);
      const title = `${g[0].toUpperCase()}${g.slice(1)} jobs`;
      return h(
        "section",
        { "aria-labelledby": `group-${g}` },
        h("h2", { id: `group-${g}` }, `${title} (${list.length})`),
        list.length === 0
          ? h("p", { class: "note" }, "None.")
          : [
              table(
                title,
                ["JOB", "TYPE", "INSTANCES", "TIER", "PRIORITY", "STATES", "NEXT CRON FIRING"],
                shown.map((j) =>
                  h(
                    "tr",
                    {},
                    h("td", {}, jobLink(j.key)),
                    h("td", {}, jobType(j)),
                    h("td", {}, String(j.instances)),
                    h("td", {}, j.tier),
                    h("td", {}, String(j.priority)),
                    h("td", {}, counts(j.state_counts)),
                    h("td", {}, j.cron ? [j.cron.schedule, " ", time(j.cron.next_fire_ms)] : "-"),
                  ),
                ),
              ),
              list.length > PAGE
                ? pager(title, list.length, PAGE, page, (p) => {
                    pages[g] = p;
                    draw();
                  })
                : null,
            ],
      );
    });
    body.replaceChildren(...sections);
    body.removeAttribute("aria-busy");
  };
  const r = refresher(async () => {
    try {
      jobs = await get<JobSummary[]>(`/v1/jobs?role=${encodeURIComponent(role)}`);
      draw();
    } catch (e) {
      body.replaceChildren(errorBox(e));
    }
  }, 1000);
  return {
    dispose: ctx.live.subscribe((c) => {
      if (c.reset || c.jobs.some((j) => j.key.startsWith(role + "/"))) r.trigger();
    }),
  };
}
