// The web UI in a real browser (Debian's chromium driven by playwright-core) against
// a real `drover dev` cluster: sign in with the URL `drover dev` prints, navigate
// role -> job -> task, see a task go RUNNING without a reload, restart and kill
// instances and drain and activate a host from the page (each confirmed in the
// dialog), keyboard use, labels and contrast, a job's announced endpoints, and the
// first load (bytes, paint) of a job page with 10,000 instances and "Show more". Screenshots go to target/ui-artifacts/.
// Run: (cd ui && npm run browser-test) after `cargo build --workspace --bins`;
// scripts/test.sh does.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { DevCluster, ROOT, sleeper } from "./cluster.mjs";

const CHROMIUM = process.env.DROVER_CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = join(ROOT, "target/ui-artifacts");
/** How long a change may take to show on the page (generous: the machine is shared). */
const LIVE = 30_000;

let cluster;
let browser;

async function shot(page, name) {
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

/** A fresh, signed-in page (its own context: its own sessionStorage). */
async function signedIn() {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.errors = errors;
  await page.goto(cluster.signIn);
  await page.getByRole("heading", { name: "Cluster", level: 1 }).waitFor();
  assert.ok(!page.url().includes("token="), `the token stays in the address bar: ${page.url()}`);
  return page;
}

/** Confirms the open dialog with the keyboard (Cancel has focus first). */
async function confirmWithKeyboard(page) {
  const dialog = page.locator("dialog#confirm");
  await dialog.waitFor();
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Cancel");
  await page.keyboard.press("Tab");
  await page.keyboard.press("Enter");
  await dialog.waitFor({ state: "hidden" });
}

/** Labels and contrast on the page as it is now: problems in words. */
async function accessibilityProblems(page) {
  return page.evaluate(() => {
    const problems = [];
    for (const el of document.querySelectorAll("button, select, input")) {
      if (el.closest("[hidden]") || el.closest("dialog:not([open])")) continue;
      const name = el.getAttribute("aria-label") || el.textContent?.trim() || [...(el.labels ?? [])].map((l) => l.textContent).join("");
      if (!name) problems.push(`${el.outerHTML.slice(0, 80)} has no label`);
    }
    const rgb = (s) => (s.match(/[\d.]+/g) ?? []).map(Number);
    const lum = ([r, g, b]) => {
      const c = [r, g, b].map((v) => {
        v /= 255;
        return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
      });
      return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
    };
    const background = (el) => {
      for (let e = el; e; e = e.parentElement) {
        const c = rgb(getComputedStyle(e).backgroundColor);
        if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
      }
      return [255, 255, 255];
    };
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const seen = new Set();
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el || seen.has(el) || !n.textContent.trim() || !el.checkVisibility?.()) continue;
      seen.add(el);
      const [a, b] = [lum(rgb(getComputedStyle(el).color).slice(0, 3)), lum(background(el))];
      const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
      if (ratio < 4.5) problems.push(`"${n.textContent.trim().slice(0, 30)}" has contrast ${ratio.toFixed(2)}:1`);
    }
    return problems;
  });
}

/** The row of instance `n` on a job page. */
const instanceRow = (page, n) => page.locator(`tr[data-instance="${n}"]`);

describe("web UI", { timeout: 110_000 }, () => {
  before(async () => {
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: run scripts/setup.sh`);
    mkdirSync(ARTIFACTS, { recursive: true });
    [cluster, browser] = await Promise.all([
      DevCluster.start(2),
      chromium.launch({
        executablePath: CHROMIUM,
        // playwright-core adds a fresh user-data-dir of its own for each launch.
        args: [
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
          "--no-first-run",
        ],
      }),
    ]);
    await cluster.createJob("web", sleeper("web", 2));
  });

  after(async () => {
    await browser?.close();
    await cluster?.stop();
  });

  it("refuses a wrong token and signs in with a right one from the form", async () => {
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    await page.goto(new URL("/ui/roles", cluster.api).href);
    await page.getByLabel("API token").fill("drv_0000000000000000_00");
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByText("refused").first().waitFor();
    await page.getByLabel("API token").fill(cluster.token());
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Roles", level: 1 }).waitFor();
    await shot(page, "00-signed-in-roles");
    await context.close();
  });

  it("shows a role token only what it may read; an operator's kill is refused", async () => {
    const roleToken = (await cluster.cli("token", "create", "--role", "db")).trim();
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    await page.goto(cluster.signIn.replace(/#token=.*/, `#token=${roleToken}`));
    await page.getByRole("heading", { name: "Cluster", level: 1 }).waitFor();
    // Hosts and capacity need an admin or operator token: the page says so.
    await page.getByText("Hosts and capacity: this token may not read it").waitFor();
    await page.getByText("across 0 job(s)").waitFor();
    await page.goto(new URL("/ui/jobs/www-data/devel/web", cluster.api).href);
    await page.getByRole("alert").getByText(/lacks the permission/).waitFor();
    await page.goto(new URL("/ui/hosts", cluster.api).href);
    await page.getByText("Hosts: this token may not read it").waitFor();
    await shot(page, "00-role-token-hosts");
    await context.close();
    // An operator reads every job but may not kill one: the master's refusal is shown.
    const operator = (await cluster.cli("token", "create", "--role", "operator")).trim();
    const opContext = await browser.newContext({ ignoreHTTPSErrors: true });
    const op = await opContext.newPage();
    await op.goto(cluster.signIn.replace(/#token=.*/, `#token=${operator}`));
    await op.getByRole("heading", { name: "Cluster", level: 1 }).waitFor();
    await op.goto(new URL("/ui/jobs/www-data/devel/web", cluster.api).href);
    await instanceRow(op, 0).getByText("RUNNING", { exact: true }).waitFor({ timeout: LIVE });
    await op.getByRole("button", { name: "Kill instance 0" }).click();
    await op.locator("#confirm-ok").click();
    await op.getByRole("alert").getByText(/Kill refused: .*lacks the permission/).waitFor();
    await shot(op, "00-operator-kill-refused");
    await opContext.close();
  });

  it("navigates cluster -> role -> job -> task, with labels and contrast", async () => {
    const page = await signedIn();
    await page.getByText("Tasks by state").waitFor();
    await shot(page, "01-cluster");
    assert.deepEqual(await accessibilityProblems(page), []);
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Roles" }).click();
    await page.getByRole("link", { name: "www-data" }).click();
    await page.getByRole("heading", { name: "Role www-data" }).waitFor();
    await page.getByRole("heading", { name: /Active jobs/ }).waitFor();
    await shot(page, "02-role");
    await page.getByRole("link", { name: "www-data/devel/web" }).click();
    await page.getByRole("heading", { name: "Job www-data/devel/web" }).waitFor();
    await instanceRow(page, 1).getByText("RUNNING", { exact: true }).waitFor({ timeout: LIVE });
    await shot(page, "03-job");
    assert.deepEqual(await accessibilityProblems(page), []);
    await instanceRow(page, 0).getByRole("link").click();
    await page.getByRole("heading", { name: /^Task web-0-/ }).waitFor();
    await page.getByRole("table", { name: "Processes" }).getByText("main").waitFor();
    // The live log tail of the running process.
    await page.getByLabel("Log tail").getByText("instance 0 up").waitFor({ timeout: LIVE });
    await shot(page, "04-task");
    assert.deepEqual(await accessibilityProblems(page), []);
    // Back goes back without a reload.
    await page.goBack();
    await page.getByRole("heading", { name: "Job www-data/devel/web" }).waitFor();
    assert.deepEqual(page.errors, []);
    await page.context().close();
  });

  it("shows a pending task go RUNNING without a reload", async () => {
    await cluster.cli("host", "cordon", "dev-agent-1", "dev-agent-2");
    await cluster.createJob("late", sleeper("late", 1));
    const page = await signedIn();
    // The overview says why: both hosts are cordoned.
    await page
      .getByRole("table", { name: "Pending reasons" })
      .getByRole("row", { name: /host in maintenance on 2 agents.*www-data\/devel\/late/ })
      .waitFor({ timeout: LIVE });
    await shot(page, "05-cluster-pending");
    await page.goto(new URL("/ui/jobs/www-data/devel/late", cluster.api).href);
    await instanceRow(page, 0).getByRole("link").click();
    const state = page.locator("#task-state");
    await state.getByText("PENDING", { exact: true }).waitFor();
    await shot(page, "06-task-pending");
    await page.evaluate(() => (window.notReloaded = true));
    await cluster.cli("host", "activate", "dev-agent-1", "dev-agent-2");
    await state.getByText("RUNNING", { exact: true }).waitFor({ timeout: LIVE });
    assert.equal(await page.evaluate(() => window.notReloaded), true, "the page reloaded");
    await shot(page, "07-task-running-live");
    await page.context().close();
  });

  it("restarts an instance (replaced) and kills one from the job page, each confirmed", async () => {
    const page = await signedIn();
    await page.goto(new URL("/ui/jobs/www-data/devel/web", cluster.api).href);
    await instanceRow(page, 0).getByText("RUNNING", { exact: true }).waitFor({ timeout: LIVE });
    const before0 = await instanceRow(page, 0).getByRole("link").textContent();
    // Escape cancels: nothing happens.
    await page.getByRole("button", { name: "Kill instance 1" }).click();
    await page.keyboard.press("Escape");
    await page.locator("dialog#confirm").waitFor({ state: "hidden" });
    await page.getByRole("button", { name: "Restart instance 0" }).click();
    await confirmWithKeyboard(page);
    await page.waitForFunction(
      (old) => {
        const row = document.querySelector('tr[data-instance="0"]');
        return row && !row.textContent.includes(old) && row.textContent.includes("RUNNING");
      },
      before0,
      { timeout: LIVE },
    );
    const after0 = await instanceRow(page, 0).getByRole("link").textContent();
    assert.notEqual(after0, before0);
    assert.equal((await instanceRow(page, 1).textContent()).includes("KILL"), false, "the cancelled kill ran");
    await page.getByRole("button", { name: "Kill instance 1" }).click();
    await page.locator("#confirm-ok").click();
    await instanceRow(page, 1).getByText("KILLED", { exact: true }).waitFor({ timeout: LIVE });
    await shot(page, "08-job-after-restart-and-kill");
    const view = await cluster.json("job", "status", "www-data/devel/web");
    const states = JSON.stringify(view);
    assert.ok(states.includes(after0), `the CLI does not show the replacement ${after0}: ${states.slice(0, 400)}`);
    await page.context().close();
  });

  it("shows an update in progress and then its history, live", async () => {
    const settings = "update: {batch_size: 1, watch: 1s}\n";
    await cluster.createJob("upd", sleeper("upd", 2, settings));
    const page = await signedIn();
    await page.goto(new URL("/ui/jobs/www-data/devel/upd", cluster.api).href);
    await instanceRow(page, 1).getByText("RUNNING", { exact: true }).waitFor({ timeout: LIVE });
    await page.getByText("This job has had no update.").waitFor();
    await page.evaluate(() => (window.notReloaded = true));
    const changed = sleeper("upd", 2, settings).replace('up"; exec sleep 600', 'up again"; exec sleep 601');
    const file = join(cluster.dir, "upd-2.yaml");
    writeFileSync(file, changed);
    await cluster.cli("job", "update", file);
    await page.getByRole("heading", { name: /^(Update in progress|Last update)$/ }).waitFor({ timeout: LIVE });
    await page.getByRole("heading", { name: "Last update" }).waitFor({ timeout: LIVE });
    const history = page.getByRole("table", { name: "Update history" });
    await history.getByText(/batch: instances 0/).waitFor();
    await history.getByText(/batch: instances 1/).waitFor();
    await page.getByText(/ROLLED_FORWARD, 2 of 2 instance\(s\) updated/).waitFor({ timeout: LIVE });
    assert.equal(await page.evaluate(() => window.notReloaded), true, "the page reloaded");
    // Two configs: the old one used by none, the new one by both instances.
    await page.getByText("used by 2 instance(s)").waitFor({ timeout: LIVE });
    await shot(page, "09-job-updated");
    await page.context().close();
  });

  it("drains a host from the hosts page and activates it again", async () => {
    const page = await signedIn();
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Hosts" }).click();
    const row = page.locator('tr[data-agent="dev-agent-1"]');
    await row.waitFor();
    await row.getByRole("button", { name: /^drain dev-agent-1/i }).click();
    await confirmWithKeyboard(page);
    await row.locator("td.mode").getByText(/DRAINING|DRAINED/).waitFor({ timeout: LIVE });
    await row.locator("td.mode").getByText("DRAINED", { exact: true }).waitFor({ timeout: LIVE });
    await shot(page, "10-host-drained");
    assert.deepEqual(await accessibilityProblems(page), []);
    await row.getByRole("button", { name: /^activate dev-agent-1/i }).click();
    await page.locator("#confirm-ok").click();
    await row.locator("td.mode").getByText("NONE", { exact: true }).waitFor({ timeout: LIVE });
    await page.context().close();
  });

  it("shows a job's announced endpoints", async () => {
    await cluster.createJob(
      "front",
      sleeper("front", 1, "announce: {primary_port: http, drain_delay: 0s}\n").replace(
        "disk: 8MiB}",
        "disk: 8MiB, ports: [http]}",
      ),
    );
    const page = await signedIn();
    await page.goto(new URL("/ui/jobs/www-data/devel/front", cluster.api).href);
    await page
      .getByRole("table", { name: "Announced endpoints" })
      .getByRole("row", { name: /http=\d+ \(primary\)/ })
      .waitFor({ timeout: LIVE });
    await shot(page, "12-job-announced-endpoints");
    await page.context().close();
  });

  it("loads a job page of 10,000 instances in pages: under 1 MB, quickly, and shows more on demand", async () => {
    // Placed nowhere (no agent has 512 cores): 10,000 tasks, no processes to start.
    await cluster.createJob("big", sleeper("big", 10000).replace("cpu: 0.01", "cpu: 512"));
    const page = await signedIn();
    // Every API answer the page reads, by path and size.
    const answers = [];
    page.on("response", async (r) => {
      const url = new URL(r.url());
      if (!url.pathname.startsWith("/v1/")) return;
      const body = await r.body().catch(() => Buffer.alloc(0));
      answers.push({ path: url.pathname + url.search, bytes: body.length });
    });
    const started = Date.now();
    await page.goto(new URL("/ui/jobs/www-data/devel/big", cluster.api).href);
    await instanceRow(page, 99).waitFor({ timeout: LIVE });
    const wall = Date.now() - started;
    const inPage = await page.evaluate(() => ({
      table_ms: Math.round(performance.now()),
      first_contentful_paint_ms: Math.round(performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? -1),
    }));
    await page.waitForTimeout(500); // answers still being read count too
    const bytes = answers.reduce((n, a) => n + a.bytes, 0);
    const result = { instances: 10000, rows_shown: await page.locator("tr[data-instance]").count(), wall_ms: wall, api_bytes: bytes, answers, ...inPage };
    console.log(`first load of a 10,000-instance job page: ${JSON.stringify(result)}`);
    writeFileSync(join(ARTIFACTS, "job-10000-first-load.json"), JSON.stringify(result, null, 2) + "\n");
    assert.equal(result.rows_shown, 100, "one page of 100 instances");
    assert.ok(bytes < 1_000_000, `the first load read ${bytes} bytes`);
    await page.getByText("100 of 10000 instance(s) shown").waitFor();
    // The target is 1 s; the bound is generous for a shared, loaded machine.
    assert.ok(result.table_ms < 10_000, `the instances table took ${result.table_ms} ms`);
    await page.getByRole("button", { name: "Show 100 more" }).click();
    await instanceRow(page, 199).waitFor();
    await page.getByText("200 of 10000 instance(s) shown").waitFor();
    assert.equal(await page.locator("tr[data-instance]").count(), 200);
    await shot(page, "11-job-10000-show-more");
    await page.context().close();
  });
});
