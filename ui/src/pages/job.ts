// A job: its instances (paged, filterable by state) with kill and restart actions,
// its configs, its update in progress or last update with its history, and recent
// task events, and for a job with `announce` its announced endpoints. Redrawn from
// the change stream when one of its tasks changes.

import { ApiError, get, jobPath, post } from "../api";
import { badge, confirmAction, counts, h, link, notify, pager, table, time } from "../dom";
import type { Ctx, Page } from "../page";
import { refresher } from "../page";
import type { InstanceView, JobView, ServiceView, TaskEvent } from "../types";
import { ALL_STATES } from "../types";
import { errorBox } from "./common";

const PAGE = 100;
/** How often the page re-reads a job whose update runs. */
const UPDATE_POLL_MS = 2000;
/** Update states that change without a task changing. */
const RUNNING_UPDATE: ReadonlySet<string> = new Set(["ROLLING_FORWARD", "ROLLING_BACK"]);

export function jobPage(root: HTMLElement, ctx: Ctx, [role, env, name]: string[]): Page {
  const key = `${role}/${env}/${name}`;
  const body = h("div", { "aria-busy": "true" }, "Loading…");
  root.append(
    h(
      "p",
      { class: "crumbs" },
      link("/ui/roles", "Roles"),
      " / ",
      link(`/ui/roles/${encodeURIComponent(role)}`, role),
      " / ",
    ),
    h("h1", {}, `Job ${key}`),
    body,
  );
  let view: JobView | null = null;
  let service: ServiceView | null = null;
  let page = 0;
  let filter = "";

  const act = async (verb: "kill" | "restart", instances: string | null) => {
    const what = instances === null ? `every instance of ${key}` : `instance ${instances} of ${key}`;
    const label = verb === "kill" ? "Kill" : "Restart";
    const explain =
      verb === "kill"
        ? "Killed instances are not replaced."
        : instances === null
          ? "A rolling restart: batch by batch (the job's update batch size), each task withdrawn, drained and replaced, the next batch once the replacements run."
          : "Each task is killed and replaced by a new one.";
    if (!(await confirmAction(`${label} ${what}? ${explain}`, label))) return;
    try {
      const r = await post<{ tasks: string[]; update?: string }>(
        `${jobPath(key)}/${verb}`,
        instances === null ? {} : { instances },
      );
      if (r.update) {
        notify(`Rolling restart started (update ${r.update}): its progress is in the job's update.`, "info");
      } else {
        notify(`${label}: ${r.tasks.length} task(s) ${verb === "kill" ? "being killed" : "replaced"}.`, "info");
      }
      refresh.trigger();
    } catch (e) {
      notify(e instanceof ApiError ? `${label} refused: ${e.message}` : `${label} failed: ${e}`);
    }
  };

  const draw = () => {
    if (!view) return;
    const v = view;
    const spec = v.spec as { service?: boolean; tier?: string; priority?: number };
    const type = v.cron ? "cron" : spec.service ? "service" : "batch";
    const list = v.instances.filter((i) => !filter || i.current?.state === filter);
    const pages = Math.max(1, Math.ceil(list.length / PAGE));
    page = Math.min(page, pages - 1);
    const shown = list.slice(page * PAGE, (page + 1) * PAGE);
    const select = h(
      "select",
      {
        id: "state-filter",
        onchange: (e: Event) => {
          filter = (e.target as HTMLSelectElement).value;
          page = 0;
          draw();
          (document.getElementById("state-filter") as HTMLSelectElement | null)?.focus();
        },
      },
      h("option", { value: "" }, "every state"),
      ALL_STATES.filter((s) => (v.state_counts[s] ?? 0) > 0 || s === filter).map((s) =>
        h("option", { value: s, selected: s === filter }, s),
      ),
    );
    const role = v.key.split("/")[0];
    body.replaceChildren(
      v.ungranted_user
        ? h(
            "p",
            { class: "alarm", role: "alert", id: "ungranted-user" },
            `Flagged: this job runs as user ${v.ungranted_user}, which role ${role} is no longer granted. `,
            "It runs on, but its next update, restart or rollback is refused until an admin grants the user again: ",
            h("code", {}, `drover role grant-user ${role} ${v.ungranted_user}`),
          )
        : "",
      h(
        "dl",
        { class: "facts" },
        h("dt", {}, "TYPE"),
        h("dd", {}, type),
        h("dt", {}, "TIER"),
        h("dd", {}, String(spec.tier ?? "-")),
        h("dt", {}, "PRIORITY"),
        h("dd", {}, String(spec.priority ?? 0)),
        h("dt", {}, "CREATED"),
        h("dd", {}, time(v.created_ms)),
        h("dt", {}, "INSTANCES"),
        h("dd", {}, String(v.instances.length), " ", counts(v.state_counts)),
        v.cron ? [h("dt", {}, "CRON"), h("dd", {}, v.cron.schedule, " next ", time(v.cron.next_fire_ms))] : null,
      ),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "button", class: "danger", onclick: () => act("kill", null) }, "Kill job"),
        h("button", { type: "button", onclick: () => act("restart", null) }, "Restart job"),
      ),
      h("h2", { id: "instances" }, "Instances"),
      h("p", {}, h("label", { for: "state-filter" }, "Show "), select),
      table(
        "Instances",
        ["INSTANCE", "TASK", "STATE", "AGENT", "CONFIG", "LAST EVENT", "ACTIONS"],
        shown.map((i) => instanceRow(i, act)),
      ),
      list.length > PAGE
        ? pager("Instances", list.length, PAGE, page, (p) => {
            page = p;
            draw();
          })
        : "",
      service ? serviceSection(service) : "",
      updateSection(v),
      configsSection(v),
      eventsSection(v),
    );
    body.removeAttribute("aria-busy");
  };

  // The change stream carries task changes, not update records: while an update
  // runs, the page also re-reads the job every UPDATE_POLL_MS so that a batch's
  // watch ending or the update finishing shows up.
  let updatePoll: number | undefined;
  const refresh = refresher(async () => {
    try {
      view = await get<JobView>(jobPath(key));
      const announce = (view.spec as { announce?: { name?: string } | null }).announce;
      service = null;
      if (announce) {
        const svc = announce.name ?? name;
        const path = `/v1/services/${[role, env, svc].map(encodeURIComponent).join("/")}`;
        service = await get<ServiceView>(path).catch(() => null);
      }
      draw();
    } catch (e) {
      body.replaceChildren(errorBox(e));
    }
    window.clearTimeout(updatePoll);
    if (view?.update && RUNNING_UPDATE.has(view.update.state)) {
      updatePoll = window.setTimeout(() => refresh.trigger(), UPDATE_POLL_MS);
    }
  }, 500);
  const unsubscribe = ctx.live.subscribe((c) => {
    if (c.reset || c.tasks.some((t) => t.job === key) || c.jobs.some((j) => j.key === key)) refresh.trigger();
  });
  return {
    dispose: () => {
      unsubscribe();
      window.clearTimeout(updatePoll);
    },
  };
}

function instanceRow(i: InstanceView, act: (verb: "kill" | "restart", instances: string) => void): HTMLElement {
  const t = i.current;
  const last = t?.events[t.events.length - 1];
  const active = t !== null && !["FINISHED", "FAILED", "KILLED", "LOST"].includes(t.state);
  return h(
    "tr",
    { "data-instance": i.instance },
    h("td", {}, String(i.instance)),
    h("td", {}, t ? link(`/ui/tasks/${encodeURIComponent(t.task_id)}`, t.task_id) : "-"),
    h("td", {}, t ? badge(t.state) : "-", t?.pending_reason ? h("div", { class: "reason" }, t.pending_reason) : null),
    h("td", {}, t?.agent_id ?? "-"),
    h("td", { class: "mono" }, i.config ? i.config.slice(0, 8) : "-"),
    h("td", {}, last ? [time(last.timestamp_ms), " ", last.message] : "-"),
    h(
      "td",
      {},
      active
        ? [
            h(
              "button",
              { type: "button", class: "small danger", "aria-label": `Kill instance ${i.instance}`, onclick: () => act("kill", String(i.instance)) },
              "Kill",
            ),
            " ",
            h(
              "button",
              { type: "button", class: "small", "aria-label": `Restart instance ${i.instance}`, onclick: () => act("restart", String(i.instance)) },
              "Restart",
            ),
          ]
        : "",
    ),
  );
}

/** The job's announced endpoints (service discovery, docs/job-spec.md `announce`). */
function serviceSection(s: ServiceView): HTMLElement {
  return h(
    "section",
    {},
    h("h2", { id: "endpoints" }, `Announced endpoints: ${s.role}/${s.environment}/${s.name}`),
    s.endpoints.length === 0
      ? h("p", { class: "note" }, "No instance is announced (an instance is while its task is RUNNING).")
      : table(
          "Announced endpoints",
          ["INSTANCE", "HOST", "IP", "PORTS", "TASK", "SINCE"],
          s.endpoints.map((e) =>
            h(
              "tr",
              {},
              h("td", {}, String(e.instance)),
              h("td", {}, e.host),
              h("td", { class: "mono" }, e.ip || "-"),
              h(
                "td",
                { class: "mono" },
                Object.entries(e.ports)
                  .map(([n, p]) => (n === s.primary_port ? `${n}=${p} (primary)` : `${n}=${p}`))
                  .join(" "),
              ),
              h("td", { class: "mono" }, link(`/ui/tasks/${encodeURIComponent(e.task_id)}`, e.task_id)),
              h("td", {}, time(e.since)),
            ),
          ),
        ),
  );
}

function updateSection(v: JobView): HTMLElement {
  const u = v.update;
  if (!u) return h("section", {}, h("h2", {}, "Update"), h("p", { class: "note" }, "This job has had no update."));
  const done = u.instances.filter((i) => i.state === "UPDATED").length;
  const running = RUNNING_UPDATE.has(u.state) || u.state === "PAUSED";
  return h(
    "section",
    {},
    h("h2", {}, running ? "Update in progress" : "Last update"),
    h(
      "p",
      {},
      `${u.id} by ${u.user || "-"}, started `,
      time(u.created_ms),
      `: ${u.state}, ${done} of ${u.instances.length} instance(s) updated, to config ${u.to_config.slice(0, 8)}`,
    ),
    running && u.waiting ? h("p", { class: "note" }, `Waiting: ${u.waiting}`) : null,
    running && u.stuck ? h("p", { class: "reason" }, `Cannot finish as things stand: ${u.stuck}`) : null,
    table(
      "Update history",
      ["TIME", "EVENT"],
      u.events
        .slice(-50)
        .reverse()
        .map((e) => h("tr", {}, h("td", {}, time(e.at_ms)), h("td", {}, e.message))),
    ),
  );
}

function configsSection(v: JobView): HTMLElement {
  const inUse = new Map<string, number>();
  for (const i of v.instances) if (i.config) inUse.set(i.config, (inUse.get(i.config) ?? 0) + 1);
  return h(
    "section",
    {},
    h("h2", {}, "Configs"),
    Object.entries(v.configs).map(([hash, spec]) =>
      h(
        "details",
        {},
        h("summary", {}, h("span", { class: "mono" }, hash.slice(0, 12)), ` used by ${inUse.get(hash) ?? 0} instance(s)`),
        h("pre", {}, JSON.stringify(spec, null, 2)),
      ),
    ),
  );
}

function eventsSection(v: JobView): HTMLElement {
  const events: (TaskEvent & { task: string; instance: number; seq: number })[] = [];
  for (const i of v.instances) {
    for (const t of [i.current, ...i.history]) {
      if (!t) continue;
      t.events.forEach((e, seq) => events.push({ ...e, task: t.task_id, instance: i.instance, seq }));
    }
  }
  // Newest first; a task's events of the same millisecond in reverse order too.
  events.sort((a, b) => b.timestamp_ms - a.timestamp_ms || b.seq - a.seq);
  return h(
    "section",
    {},
    h("h2", {}, "Recent events"),
    table(
      "Recent events",
      ["TIME", "INSTANCE", "STATE", "EVENT"],
      events.slice(0, 50).map((e) =>
        h(
          "tr",
          {},
          h("td", {}, time(e.timestamp_ms)),
          h("td", {}, link(`/ui/tasks/${encodeURIComponent(e.task)}`, String(e.instance))),
          h("td", {}, badge(e.state)),
          h("td", {}, e.message),
        ),
      ),
    ),
  );
}
