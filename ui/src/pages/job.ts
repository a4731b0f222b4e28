// A job: its summary (counts per state and per config), its instances read from
// the master a page at a time (the first 100, then "Show more"; filterable by state
// on the master) with kill and restart actions, its configs, its update in progress
// or last update with its history, its recent task events, and for a job with
// `announce` its announced endpoints. Re-read (the summary and the instances shown)
// when the change stream says one of its tasks changed.

import { ApiError, get, jobPath, post } from "../api";
import { badge, confirmAction, counts, h, link, notify, table, time } from "../dom";
import type { Ctx, Page } from "../page";
import { refresher } from "../page";
import type { InstanceView, JobView, ServiceView } from "../types";
import { ALL_STATES } from "../types";
import { errorBox } from "./common";

/** Instances shown at first, and added by each "Show more". */
const PAGE = 100;
/** The master's largest page of instances (`limit`). */
const MAX_PAGE = 1000;
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
  /** The instances read so far (of the state filter), in instance order. */
  let shown: InstanceView[] = [];
  /** Where the next page starts (the master's `next_after`), null: none left. */
  let nextAfter: number | null = null;
  /** How many instances the user asked to see (grows by PAGE with "Show more"). */
  let wanted = PAGE;
  let filter = "";
  let loadingMore = false;

  /** One page of the job: the summary and up to `limit` instances after `after`. */
  const readPage = (limit: number, after: number | null) => {
    const q = new URLSearchParams({ limit: String(limit) });
    if (after !== null) q.set("after", String(after));
    if (filter) q.set("state", filter);
    return get<JobView>(`${jobPath(key)}?${q}`);
  };

  /** Reads the summary and the first `wanted` instances again (pages of up to 1,000). */
  const readShown = async (): Promise<JobView> => {
    let v = await readPage(Math.min(wanted, MAX_PAGE), null);
    const list = [...v.instances];
    while (v.next_after !== undefined && v.next_after !== null && list.length < wanted) {
      const next = await readPage(Math.min(wanted - list.length, MAX_PAGE), v.next_after);
      list.push(...next.instances);
      v = { ...next, instances: list };
    }
    shown = list;
    nextAfter = v.next_after ?? null;
    return v;
  };

  const showMore = async () => {
    if (nextAfter === null || loadingMore) return;
    loadingMore = true;
    try {
      const next = await readPage(PAGE, nextAfter);
      shown = [...shown, ...next.instances];
      nextAfter = next.next_after ?? null;
      wanted = Math.max(wanted, shown.length);
      view = next;
      draw();
      document.getElementById("show-more")?.focus();
    } catch (e) {
      notify(e instanceof ApiError ? `Reading more instances failed: ${e.message}` : `Reading more instances failed: ${e}`);
    } finally {
      loadingMore = false;
    }
  };

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
    const matching = filter ? (v.state_counts[filter as keyof typeof v.state_counts] ?? 0) : v.instance_count;
    const select = h(
      "select",
      {
        id: "state-filter",
        onchange: (e: Event) => {
          filter = (e.target as HTMLSelectElement).value;
          wanted = PAGE;
          refresh.trigger();
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
        h("dd", {}, String(v.instance_count), " ", counts(v.state_counts)),
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
      h(
        "p",
        { class: "pager", id: "instances-shown" },
        `${shown.length} of ${matching} instance(s)${filter ? ` ${filter}` : ""} shown`,
        nextAfter !== null
          ? [
              " ",
              h(
                "button",
                { type: "button", id: "show-more", onclick: () => void showMore() },
                `Show ${Math.min(PAGE, Math.max(matching - shown.length, 1))} more`,
              ),
            ]
          : "",
      ),
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
      view = await readShown();
      const announce = (view.spec as { announce?: { name?: string } | null }).announce;
      service = null;
      if (announce) {
        const svc = announce.name ?? name;
        const path = `/v1/services/${[role, env, svc].map(encodeURIComponent).join("/")}`;
        service = await get<ServiceView>(path).catch(() => null);
      }
      const focused = document.activeElement?.id;
      draw();
      if (focused) document.getElementById(focused)?.focus();
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
  const inUse = new Map<string, number>(Object.entries(v.config_counts ?? {}));
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
  // The master picks the job's 50 newest events over every instance, newest first.
  return h(
    "section",
    {},
    h("h2", {}, "Recent events"),
    table(
      "Recent events",
      ["TIME", "INSTANCE", "STATE", "EVENT"],
      (v.recent_events ?? []).map((e) =>
        h(
          "tr",
          {},
          h("td", {}, time(e.event.timestamp_ms)),
          h("td", {}, link(`/ui/tasks/${encodeURIComponent(e.task_id)}`, String(e.instance))),
          h("td", {}, badge(e.event.state)),
          h("td", {}, e.event.message),
        ),
      ),
    ),
  );
}
