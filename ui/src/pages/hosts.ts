// Hosts: maintenance mode, drain progress (tasks left, what blocks the drain, the
// latest maintenance event) and the maintenance actions (cordon, drain, activate),
// each confirmed first. Redrawn from the change stream.

import { ApiError, get, post } from "../api";
import { confirmAction, h, notify, pager, table, time } from "../dom";
import type { Ctx, Page } from "../page";
import { refresher } from "../page";
import type { HostView } from "../types";
import { errorBox, notAllowed } from "./common";


const PAGE = 100;

type Verb = "cordon" | "drain" | "activate";

const EXPLAIN: Record<Verb, string> = {
  cordon: "No new task is placed there; running tasks stay.",
  drain: "Its tasks are moved to other hosts as fast as their jobs' SLA policies allow.",
  activate: "It takes new tasks again.",
};

export function hostsPage(root: HTMLElement, ctx: Ctx): Page {
  const body = h("div", { "aria-busy": "true" }, "Loading…");
  root.append(h("h1", {}, "Hosts"), body);
  let hosts: HostView[] = [];
  let page = 0;

  const act = async (verb: Verb, host: HostView) => {
    const label = verb[0].toUpperCase() + verb.slice(1);
    if (!(await confirmAction(`${label} host ${host.hostname} (${host.agent_id})? ${EXPLAIN[verb]}`, label))) return;
    try {
      const after = await post<HostView[]>(`/v1/hosts/${verb}`, { hosts: [host.agent_id] });
      notify(`${label}: ${after.map((x) => `${x.agent_id} ${x.mode}`).join(", ")}`, "info");
      refresh.trigger();
    } catch (e) {
      notify(e instanceof ApiError ? `${label} refused: ${e.message}` : `${label} failed: ${e}`);
    }
  };

  const draw = () => {
    const pages = Math.max(1, Math.ceil(hosts.length / PAGE));
    page = Math.min(page, pages - 1);
    const shown = hosts.slice(page * PAGE, (page + 1) * PAGE);
    body.replaceChildren(
      table(
        "Hosts",
        ["HOST", "AGENT", "REACHABLE", "MODE", "SINCE", "DEADLINE", "TASKS LEFT", "DRAIN", "ACTIONS"],
        shown.map((x) => {
          const last = x.events[x.events.length - 1];
          const button = (verb: Verb, cls = "") =>
            h(
              "button",
              { type: "button", class: `small ${cls}`, "aria-label": `${verb} ${x.hostname} (${x.agent_id})`, onclick: () => act(verb, x) },
              verb[0].toUpperCase() + verb.slice(1),
            );
          return h(
            "tr",
            { "data-agent": x.agent_id },
            h("td", {}, x.hostname),
            h("td", {}, x.agent_id),
            h("td", {}, x.reachable ? "yes" : "NO"),
            h("td", { class: "mode" }, x.mode, x.reason && x.reason !== "maintenance" ? ` (${x.reason})` : ""),
            h("td", {}, x.mode === "NONE" ? "-" : time(x.since_ms)),
            h("td", {}, time(x.deadline_ms)),
            h("td", {}, String(x.tasks_left)),
            h(
              "td",
              {},
              x.blocked.length ? h("ul", {}, x.blocked.map((b) => h("li", {}, b))) : null,
              x.stuck ? h("div", { class: "reason" }, `Cannot finish as things stand: ${x.stuck}`) : null,
              last ? h("div", { class: "reason" }, time(last.timestamp_ms), " ", last.message) : "-",
            ),
            h(
              "td",
              {},
              x.mode === "NONE" ? [button("cordon"), " "] : null,
              x.mode === "NONE" || x.mode === "SCHEDULED" ? [button("drain", "danger"), " "] : null,
              x.mode !== "NONE" ? button("activate") : null,
            ),
          );
        }),
      ),
      hosts.length > PAGE
        ? pager("Hosts", hosts.length, PAGE, page, (p) => {
            page = p;
            draw();
          })
        : "",
    );
    body.removeAttribute("aria-busy");
  };

  const refresh = refresher(async () => {
    try {
      hosts = await get<HostView[]>("/v1/hosts");
      draw();
    } catch (e) {
      body.replaceChildren(e instanceof ApiError && e.status === 403 ? notAllowed("Hosts") : errorBox(e));
    }
  }, 1000);
  return { dispose: ctx.live.subscribe(() => refresh.trigger()) };
}
