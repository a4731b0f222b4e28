// Small DOM and formatting helpers shared by the pages: element building (text is
// always set as text, never as HTML), the CLI's units, times, state badges, the
// confirmation dialog and a pager for long tables.

import type { ExitReason, StateCounts, TaskState } from "./types";
import { ALL_STATES } from "./types";

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | ((e: Event) => void) | undefined>;

/** `h("a", {href: "/x"}, "text")`: an element; `on*` attributes become listeners. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === false) continue;
    if (typeof value === "function") {
      el.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (value === true) {
      el.setAttribute(name, "");
    } else {
      el.setAttribute(name, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Bytes the way the CLI prints them (common/src/units.rs human_bytes): the largest
 * unit that fits, at most one decimal, never `.0` (15.5GiB, 10GiB). */
export function humanBytes(n: number): string {
  const units: [string, number][] = [
    ["TiB", 2 ** 40],
    ["GiB", 2 ** 30],
    ["MiB", 2 ** 20],
    ["KiB", 2 ** 10],
  ];
  for (const [unit, size] of units) {
    if (n >= size) {
      const text = n % size === 0 ? String(n / size) : (n / size).toFixed(1).replace(/\.0$/, "");
      return `${text}${unit}`;
    }
  }
  return `${n}B`;
}

/** CPU cores with at most two decimals. */
export function cores(n: number): string {
  return String(Math.round(n * 100) / 100);
}

/** A wall-clock time (Unix ms) as local date and time. */
export function when(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return "-";
  const d = new Date(ms);
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A time element: local time shown, the exact value as its machine form. */
export function time(ms: number | null | undefined): HTMLElement {
  if (ms === null || ms === undefined) return h("span", {}, "-");
  return h("time", { datetime: new Date(ms).toISOString() }, when(ms));
}

/** A task state as a badge (colour and the word: never colour alone). */
export function badge(state: string): HTMLElement {
  return h("span", { class: `state s-${state.toLowerCase()}` }, state);
}

/** State counts in lifecycle order, e.g. "RUNNING 3, PENDING 1" as badges. */
export function counts(c: StateCounts): HTMLElement {
  const parts = ALL_STATES.filter((s) => (c[s] ?? 0) > 0).map((s: TaskState) =>
    h("span", { class: "count" }, badge(s), " ", String(c[s])),
  );
  return h("span", { class: "counts" }, parts.length ? parts : "none");
}

/** An exit reason in words, like the CLI's. */
export function exitReason(r: ExitReason | null | undefined): string {
  if (!r) return "-";
  switch (r.kind) {
    case "exit_code":
      return `exit code ${r.code}`;
    case "signal":
      return `killed by signal ${r.signal}`;
    default: {
      const rest = Object.entries(r)
        .filter(([k]) => k !== "kind")
        .map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : String(v)}`);
      return [r.kind.replaceAll("_", " "), ...rest].join(", ");
    }
  }
}

/** A link inside the app (handled by the router without a reload). */
export function link(href: string, ...children: (Child | Child[])[]): HTMLAnchorElement {
  return h("a", { href }, ...children);
}

/** A table with a caption-less header row; rows are `tr` elements. */
export function table(label: string, headers: string[], rows: HTMLElement[]): HTMLElement {
  return h(
    "table",
    { "aria-label": label },
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows),
  );
}

/**
 * Asks the user to confirm `what` in the page's modal dialog (keyboard: Tab between
 * the buttons, Enter confirms the focused one, Escape cancels). Resolves true on
 * Confirm.
 */
export function confirmAction(what: string, confirmLabel: string): Promise<boolean> {
  const dialog = document.getElementById("confirm") as HTMLDialogElement;
  (document.getElementById("confirm-text") as HTMLElement).textContent = what;
  const ok = document.getElementById("confirm-ok") as HTMLButtonElement;
  ok.textContent = confirmLabel;
  return new Promise((resolve) => {
    dialog.returnValue = "cancel";
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    // Cancel is focused first: a stray Enter does not kill anything.
    (dialog.querySelector("button[value=cancel]") as HTMLButtonElement).focus();
  });
}

/** Shows a message in the banner (errors of actions, sign-in hints). */
export function notify(message: string, kind: "error" | "info" = "error"): void {
  const banner = document.getElementById("banner") as HTMLElement;
  banner.replaceChildren(h("p", { class: kind }, message));
}

export function clearNotice(): void {
  (document.getElementById("banner") as HTMLElement).replaceChildren();
}

/**
 * One page of `items` (page size `size`) with Previous/Next buttons, so a table of
 * 10,000 rows renders only `size` of them. `page` is kept by the caller.
 */
export function pager(
  label: string,
  total: number,
  size: number,
  page: number,
  go: (page: number) => void,
): HTMLElement {
  const pages = Math.max(1, Math.ceil(total / size));
  const first = total === 0 ? 0 : page * size + 1;
  const last = Math.min(total, (page + 1) * size);
  return h(
    "nav",
    { class: "pager", "aria-label": `${label} pages` },
    h("button", { type: "button", disabled: page <= 0, onclick: () => go(page - 1) }, "Previous"),
    h("span", {}, ` ${first}-${last} of ${total} `),
    h("button", { type: "button", disabled: page >= pages - 1, onclick: () => go(page + 1) }, "Next"),
  );
}
