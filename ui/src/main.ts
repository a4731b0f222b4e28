// The app's entry: sign-in (a bearer token in sessionStorage, docs/ui.md), the
// client-side router over /ui/... paths, and the change stream shared by the pages.

import "./style.css";
import { adoptTokenFromFragment, clearToken, token, whenUnauthorized } from "./api";
import { clearNotice, notify } from "./dom";
import { Live } from "./live";
import type { Ctx, Page, PageFn } from "./page";
import { hostsPage } from "./pages/hosts";
import { jobPage } from "./pages/job";
import { loginPage } from "./pages/login";
import { overviewPage } from "./pages/overview";
import { rolePage, rolesPage } from "./pages/roles";
import { taskPage } from "./pages/task";

const routes: [RegExp, PageFn][] = [
  [/^\/(?:ui\/?)?$/, overviewPage],
  [/^\/ui\/roles\/?$/, rolesPage],
  [/^\/ui\/roles\/([^/]+)\/?$/, rolePage],
  [/^\/ui\/jobs\/([^/]+)\/([^/]+)\/([^/]+)\/?$/, jobPage],
  [/^\/ui\/tasks\/([^/]+)\/?$/, taskPage],
  [/^\/ui\/hosts\/?$/, hostsPage],
];

const main = document.getElementById("main") as HTMLElement;
const liveStatus = document.getElementById("live") as HTMLElement;
const signout = document.getElementById("signout") as HTMLButtonElement;
let live: Live | null = null;
let current: Page | null = null;

function ctx(): Ctx {
  if (!live) {
    live = new Live((text) => (liveStatus.textContent = text));
    void live.run();
  }
  return { live, navigate };
}

function navigate(path: string): void {
  if (path !== location.pathname + location.search) history.pushState(null, "", path);
  show();
}

/** Draws the page of the current path (or the sign-in form without a token). */
function show(): void {
  current?.dispose?.();
  current = null;
  clearNotice();
  main.replaceChildren();
  signout.hidden = token() === null;
  if (token() === null) {
    current = loginPage(main, () => show());
    return;
  }
  const path = location.pathname;
  for (const [pattern, page] of routes) {
    const m = pattern.exec(path);
    if (m) {
      current = page(main, ctx(), m.slice(1).map(decodeURIComponent));
      for (const a of document.querySelectorAll<HTMLAnchorElement>("nav[aria-label=Main] a")) {
        const here = a.pathname === path || (a.pathname === "/ui/" && path === "/");
        if (here) a.setAttribute("aria-current", "page");
        else a.removeAttribute("aria-current");
      }
      const heading = main.querySelector("h1");
      document.title = heading ? `${heading.textContent} · Drover` : "Drover";
      return;
    }
  }
  main.append(document.createTextNode(`No page at ${path}.`));
}

// Links inside the app change the page without a reload.
document.addEventListener("click", (e) => {
  const a = (e.target as Element).closest?.("a");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  if (a.origin !== location.origin || !(a.pathname === "/" || a.pathname.startsWith("/ui/"))) return;
  if (a.pathname.startsWith("/ui/assets/")) return;
  e.preventDefault();
  navigate(a.pathname + a.search);
  main.focus();
});
window.addEventListener("popstate", show);

signout.addEventListener("click", () => {
  clearToken();
  live?.stop();
  live = null;
  liveStatus.textContent = "";
  show();
});

whenUnauthorized(() => {
  clearToken();
  live?.stop();
  live = null;
  show();
  notify("The master refused the token (missing, revoked or wrong): sign in again.");
});

adoptTokenFromFragment();
show();
