// A task: its state, exit reason, processes and events (redrawn from the change
// stream), and a live tail of one process's stdout or stderr read through the
// master's log route (GET /v1/tasks/{id}/logs/{process}/{stream}).

import { ApiError, request } from "../api";
import { badge, exitReason, h, link, table, time } from "../dom";
import type { Ctx, Page } from "../page";
import { refresher } from "../page";
import type { TaskView } from "../types";
import { TERMINAL } from "../types";
import { errorBox } from "./common";

/** How much of a log the tail keeps on the page. */
const TAIL_BYTES = 64 * 1024;

export function taskPage(root: HTMLElement, ctx: Ctx, [id]: string[]): Page {
  const body = h("div", { "aria-busy": "true" }, "Loading…");
  const crumbs = h("p", { class: "crumbs" });
  root.append(crumbs, h("h1", {}, `Task ${id}`), body);
  const logs = new LogTail(id);
  let task: TaskView | null = null;

  const draw = (t: TaskView) => {
    const [role] = t.job.split("/");
    crumbs.replaceChildren(
      link("/ui/roles", "Roles"),
      " / ",
      link(`/ui/roles/${encodeURIComponent(role)}`, role),
      " / ",
      link("/ui/jobs/" + t.job.split("/").map(encodeURIComponent).join("/"), t.job),
      ` / instance ${t.instance}`,
    );
    const ports = Object.entries(t.ports).map(([n, p]) => `${n} ${p}`).join(", ");
    body.replaceChildren(
      h(
        "dl",
        { class: "facts" },
        h("dt", {}, "STATE"),
        h("dd", { id: "task-state" }, badge(t.state), ` (desired ${t.desired})`),
        h("dt", {}, "EXIT REASON"),
        h("dd", {}, exitReason(t.exit_reason)),
        t.pending_reason ? [h("dt", {}, "PENDING"), h("dd", {}, t.pending_reason)] : null,
        t.preempted_by ? [h("dt", {}, "PREEMPTED BY"), h("dd", {}, t.preempted_by)] : null,
        h("dt", {}, "AGENT"),
        h("dd", {}, t.agent_id ?? "-"),
        h("dt", {}, "PORTS"),
        h("dd", {}, ports || "-"),
      ),
      h("h2", {}, "Processes"),
      t.processes.length
        ? table(
            "Processes",
            ["PROCESS", "STATE", "PID", "RUNS", "FAILURES", "LAST EXIT"],
            t.processes.map((p) =>
              h(
                "tr",
                {},
                h("td", {}, p.name),
                h("td", {}, p.state),
                h("td", {}, p.pid === null ? "-" : String(p.pid)),
                h("td", {}, String(p.runs)),
                h("td", {}, String(p.failures)),
                h("td", {}, exitReason(p.last_exit)),
              ),
            ),
          )
        : h("p", { class: "note" }, "No process reported yet."),
      h("h2", {}, "Events"),
      table(
        "Events",
        ["TIME", "STATE", "SOURCE", "EVENT"],
        t.events.map((e) =>
          h("tr", {}, h("td", {}, time(e.timestamp_ms)), h("td", {}, badge(e.state)), h("td", {}, e.source), h("td", {}, e.message)),
        ),
      ),
      logs.element,
    );
    body.removeAttribute("aria-busy");
    logs.setTask(t);
  };

  const refresh = refresher(async () => {
    try {
      const r = await request("GET", `/v1/tasks/${encodeURIComponent(id)}`);
      task = (await r.json()) as TaskView;
      draw(task);
    } catch (e) {
      body.replaceChildren(errorBox(e));
    }
  }, 300);
  const unsubscribe = ctx.live.subscribe((c) => {
    if (c.reset || c.tasks.some((t) => t.task_id === id)) refresh.trigger();
  });
  return {
    dispose: () => {
      unsubscribe();
      logs.stop();
    },
  };
}

/** The log tail: a process and stream picker and the text, polled each second. */
class LogTail {
  readonly element: HTMLElement;
  private readonly text = h("pre", { class: "log", tabindex: "0", "aria-label": "Log tail" });
  private readonly status = h("p", { class: "note", role: "status" });
  private readonly process = h("select", { id: "log-process" });
  private readonly stream = h(
    "select",
    { id: "log-stream" },
    h("option", { value: "stdout" }, "stdout"),
    h("option", { value: "stderr" }, "stderr"),
  );
  private offset = 0;
  private content = "";
  private decoder = new TextDecoder();
  private timer: number | undefined;
  private terminal = false;
  private placed = false;
  private stopped = false;

  constructor(private readonly id: string) {
    const restart = () => {
      this.offset = 0;
      this.content = "";
      this.decoder = new TextDecoder();
      this.text.textContent = "";
      this.poll();
    };
    this.process.addEventListener("change", restart);
    this.stream.addEventListener("change", restart);
    this.element = h(
      "section",
      { "aria-labelledby": "log-title" },
      h("h2", { id: "log-title" }, "Log"),
      h(
        "p",
        {},
        h("label", { for: "log-process" }, "Process "),
        this.process,
        " ",
        h("label", { for: "log-stream" }, "stream "),
        this.stream,
      ),
      this.status,
      this.text,
    );
  }

  /** Takes the task's latest view: its processes for the picker, whether it ended. */
  setTask(t: TaskView): void {
    const names = t.processes.map((p) => p.name);
    const have = [...this.process.options].map((o) => o.value);
    if (names.join("\n") !== have.join("\n") && names.length) {
      // Keep the user's choice; at first, the first process running (else the first).
      const chosen = this.process.value || (t.processes.find((p) => p.state === "RUNNING") ?? t.processes[0]).name;
      this.process.replaceChildren(...names.map((n) => h("option", { value: n, selected: n === chosen }, n)));
    }
    this.terminal = TERMINAL.has(t.state);
    const wasPlaced = this.placed;
    this.placed = t.agent_id !== null && names.length > 0;
    if (this.placed && !wasPlaced) this.poll();
    if (!this.placed) this.status.textContent = "No log yet: the task has not started a process.";
  }

  stop(): void {
    this.stopped = true;
    window.clearTimeout(this.timer);
  }

  private async poll(): Promise<void> {
    window.clearTimeout(this.timer);
    if (this.stopped || !this.process.value) return;
    const path = `/v1/tasks/${encodeURIComponent(this.id)}/logs/${encodeURIComponent(this.process.value)}/${this.stream.value}?offset=${this.offset}`;
    try {
      const r = await request("GET", path);
      const bytes = new Uint8Array(await r.arrayBuffer());
      this.offset += bytes.length;
      if (bytes.length) {
        this.content = (this.content + this.decoder.decode(bytes, { stream: true })).slice(-TAIL_BYTES);
        const atEnd = this.text.scrollTop + this.text.clientHeight >= this.text.scrollHeight - 4;
        this.text.textContent = this.content;
        if (atEnd) this.text.scrollTop = this.text.scrollHeight;
      }
      const size = Number(r.headers.get("x-drover-log-size") ?? this.offset);
      this.status.textContent = `${this.process.value} ${this.stream.value}: ${size} bytes${this.terminal ? " (task ended)" : ", following"}`;
    } catch (e) {
      this.status.textContent = e instanceof ApiError ? `Log: ${e.message}` : `Log: ${e}`;
    }
    if (!this.stopped && !this.terminal) {
      this.timer = window.setTimeout(() => void this.poll(), 1000);
    }
  }
}
