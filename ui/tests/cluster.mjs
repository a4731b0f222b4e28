// A real `drover dev` cluster for the browser suite: started from target/debug with
// its own data dir, its sign-in URL and API address read from what it prints, the
// CLI run against it with its CA and admin token, and stopped with Ctrl-C (SIGINT).

import { spawn, execFile } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);
export const ROOT = resolve(import.meta.dirname, "../..");
const DROVER = join(ROOT, "target/debug/drover");

export class DevCluster {
  /** Starts `drover dev` with `agents` agents; resolves once it printed its `try:` line. */
  static async start(agents = 2) {
    const dir = mkdtempSync(join(tmpdir(), "drover-ui-"));
    const child = spawn(DROVER, ["dev", "--port", "0", "--agents", String(agents), "--data-dir", join(dir, "dev")], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stderr.on("data", (d) => (out += d));
    const lines = await new Promise((resolveLines, reject) => {
      const timer = setTimeout(() => reject(new Error(`drover dev did not start in 60 s:\n${out}`)), 60_000);
      child.stdout.on("data", (d) => {
        out += d;
        if (/^\s+try:/m.test(out)) {
          clearTimeout(timer);
          resolveLines(out);
        }
      });
      child.on("exit", (code) => reject(new Error(`drover dev exited ${code}:\n${out}`)));
    });
    const api = /^\s+API:\s+(\S+)/m.exec(lines)?.[1];
    const signIn = /^\s+web page:\s+(\S+)/m.exec(lines)?.[1];
    if (!api || !signIn) throw new Error(`no API or web page line in:\n${lines}`);
    return new DevCluster(child, dir, api, signIn, () => out);
  }

  constructor(child, dir, api, signIn, output) {
    this.child = child;
    this.dir = dir;
    this.api = api;
    this.signIn = signIn;
    this.output = output;
    this.env = {
      ...process.env,
      DROVER_MASTER: api,
      DROVER_CA: join(dir, "dev/tls/ca.pem"),
      DROVER_TOKEN_FILE: join(dir, "dev/master/admin.token"),
    };
  }

  /** The admin token. */
  token() {
    return readFileSync(this.env.DROVER_TOKEN_FILE, "utf8").trim();
  }

  /** Runs the CLI against the cluster; its stdout. */
  async cli(...args) {
    const { stdout } = await run(DROVER, args, { env: this.env, timeout: 60_000 });
    return stdout;
  }

  /** The CLI's JSON output (`--json`). */
  async json(...args) {
    return JSON.parse(await this.cli(...args, "--json"));
  }

  /** Writes a job spec (YAML text) to the data dir and creates the job. */
  async createJob(name, yaml) {
    const file = join(this.dir, `${name}.yaml`);
    writeFileSync(file, yaml);
    return this.cli("job", "create", file);
  }

  /** Ctrl-C, as a user stops it: every job is killed, then the daemons stop; then its directory goes. */
  async stop() {
    if (this.child.exitCode === null) {
      const exited = new Promise((r) => this.child.on("exit", r));
      this.child.kill("SIGINT");
      const timer = setTimeout(() => this.child.kill("SIGKILL"), 30_000);
      await exited;
      clearTimeout(timer);
    }
    // Nothing of the run stays behind (scripts/leftovers.sh checks); kept on request.
    if (!process.env.DROVER_KEEP_TEST_DIRS) rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A service spec of `instances` instances running `sleep`. */
export function sleeper(name, instances, extra = "") {
  return `role: www-data
environment: devel
name: ${name}
instances: ${instances}
service: true
task:
  processes:
    - name: main
      cmdline: echo "instance {{instance}} up"; exec sleep 600
  resources: {cpu: 0.01, ram: 8MiB, disk: 8MiB}
${extra}`;
}
