#!/usr/bin/env python3
"""Records which functions of a release `drover-executor` run in typical tasks, and
writes them as the linker script `executor/layout/hot.ld` (docs/executor.md, "Memory").

Every function of the binary gets a uprobe (exact counts, native speed: valgrind or
sampling miss code that only runs natively or rarely); then typical tasks run:
a service with an HTTP health check stopped by SIGTERM, one-shot tasks that finish
and fail, a task restarted after failures, and an agent-style run over the socket
(subscribe, kill). Functions hit at least once are "hot". They are laid out in
three groups: first what the settled service runs (hit while its health checks go
on, after the executor released its startup pages), then what it ran before, then
what only stopping or other kinds of task run. `extra.txt` adds functions that
page-fault tracing showed running natively but the probes did not count. The
executors run with DROVER_EXECUTOR_RELEASE_STARTUP=0: unmapping the startup pages
would drop the probes' breakpoints with them. Root only (tracefs).

usage: executor/layout/profile.py [--bin target/release/drover-executor]
       [--service target/release/drover-test-service] [--out executor/layout/hot.ld]
"""
import argparse, json, os, re, signal, socket, subprocess, sys, tempfile, time

TRACE = "/sys/kernel/tracing"
GROUP = "droverhot"


def symbols(binary):
    """(names, file offset) of every function in the binary's executable segment."""
    seg = None
    for line in subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        p = line.split()
        if p and p[0] == "LOAD" and "R E" in line:
            seg = (int(p[1], 16), int(p[2], 16), int(p[4], 16))  # offset, vaddr, filesz
    off, va, size = seg
    out = {}
    for line in subprocess.run(["nm", "-S", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW" and int(p[1], 16) > 0:
            addr = int(p[0], 16)
            if va <= addr < va + size:
                # Several names can share one address (merged functions); the
                # section carries one of them, so all of them are kept.
                out.setdefault(addr - va + off, []).append(p[3])
    return sorted((names, o) for o, names in out.items())


def write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)


def clear_probes():
    """Removes this script's probes (left over from an interrupted run too)."""
    try:
        write(f"{TRACE}/events/{GROUP}/enable", "0")
    except OSError:
        pass
    events = [line.split()[0][2:] for line in open(f"{TRACE}/uprobe_events").read().splitlines()
              if line.startswith(f"p:{GROUP}/")]
    fd = os.open(f"{TRACE}/uprobe_events", os.O_WRONLY | os.O_APPEND)
    for event in events:
        os.write(fd, f"-:{event}\n".encode())
    os.close(fd)


def task(task_id, processes, port=None, health=False, extra=None):
    t = {"task_id": task_id, "role": "nobody", "environment": "prof", "name": "p", "instance": 0,
         "task": {"resources": {"cpu": 0.5, "ram": "128MiB", "disk": "64MiB", "ports": ["health"] if port else []},
                  "finalization_wait": "2s", "processes": processes},
         "ports": {"health": port} if port else {}}
    if health:
        t["health_check"] = {"initial_interval": "1s", "interval": "1s", "timeout": "1s"}
    if extra:
        t["task"].update(extra)
    return t


def probe_counts():
    """Hits so far of each probe."""
    counts = {}
    for line in open(f"{TRACE}/uprobe_profile"):
        p = line.split()
        if len(p) >= 3:
            counts[p[1]] = int(p[2])
    return counts


def hit_since(names, before):
    """The functions hit since the counts `before` were taken."""
    return [n for probe, count in probe_counts().items() if probe in names and count > before.get(probe, 0)
            for n in names[probe]]


def run_standalone(binary, work, spec, stop_after=None, timeout=30, settled=None):
    d = tempfile.mkdtemp(dir=work)
    path = os.path.join(d, "task.json")
    write(path, json.dumps(spec))
    p = subprocess.Popen([binary, "run", "--standalone", "--task", path, "--sandbox", os.path.join(d, "sb")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if stop_after is not None:
        if settled:
            # RUNNING after the first check (1 s), settled 2 s later: then watch
            # three more checks.
            time.sleep(3.5)
            settled.counts = probe_counts()
            time.sleep(stop_after - 3.5)
            settled.steady = hit_since(settled.names, settled.counts)
            settled.started = hit_since(settled.names, {})
        else:
            time.sleep(stop_after)
        p.send_signal(signal.SIGTERM)
    p.wait(timeout=timeout)


def run_agent_style(binary, work, spec):
    """Like the agent: no --standalone, readiness pipe, subscribe on the socket, kill."""
    d = tempfile.mkdtemp(dir=work)
    path = os.path.join(d, "task.json")
    sandbox = os.path.join(d, "sb")
    write(path, json.dumps(spec))
    r, w = os.pipe()
    p = subprocess.Popen([binary, "run", "--task", path, "--sandbox", sandbox, "--ready-fd", str(w),
                          "--recovery-timeout", "1m"], pass_fds=(w,), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    sock_path = os.path.join(sandbox, "executor.sock")
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    s.sendall(b'{"op":"subscribe","after_seq":0}\n')
    f = s.makefile("r")
    while json.loads(f.readline())["state"] != "RUNNING":
        pass
    time.sleep(1.5)
    k = socket.socket(socket.AF_UNIX)
    k.connect(sock_path)
    k.sendall(b'{"op":"kill"}\n')
    while True:
        line = f.readline()
        if not line or json.loads(line)["state"] in ("KILLED", "FAILED", "FINISHED"):
            break
    p.wait(timeout=30)


def scenarios(binary, service, work, settled):
    port = 30000 + os.getpid() % 20000
    svc = [{"name": "svc", "cmdline": f"exec {service} --port {port} --record rec"}]
    run_standalone(binary, work, task("prof-svc", svc, port, health=True), stop_after=6.8,
                   settled=settled)
    run_standalone(binary, work, task("prof-true", [{"name": "main", "cmdline": "true"}]))
    run_standalone(binary, work, task("prof-fail", [{"name": "main", "cmdline": "echo out; echo err >&2; exit 3"}]))
    run_standalone(binary, work, task("prof-retry", [{"name": "main", "cmdline": "exit 1", "max_failures": 3}]))
    run_standalone(binary, work, task("prof-order", [
        {"name": "a", "cmdline": "true"}, {"name": "b", "cmdline": "sleep 0.2"}],
        extra={"order": [["a", "b"]]}))
    run_agent_style(binary, work, task("prof-agent", [{"name": "main", "cmdline": "sleep 60"}]))
    svc2 = [{"name": "svc", "cmdline": f"exec {service} --port {port + 1}"}]
    run_agent_style(binary, work, task("prof-agent-svc", svc2, port + 1, health=True))


def glob(name):
    """The name without the parts that change from build to build: the `.1234` LLVM
    appends to local copies, and the hashes."""
    name = re.sub(r"\.[0-9]+$", "*", name)
    name = re.sub(r"17h[0-9a-f]{16}E(\*?)$", r"17h*E\1", name)
    return re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", name)


def extra_names(here):
    """Functions seen running natively (page-fault tracing of a lone executor) that
    the probes missed; `extra.txt` next to this script, one symbol per line."""
    path = os.path.join(here, "extra.txt")
    if not os.path.exists(path):
        return []
    return [line.strip() for line in open(path) if line.strip()]


def linker_script(steady, starting, then):
    """An INSERT script (lld and GNU ld): `.init` and the hot functions as the first
    executable sections, ahead of `.text`. LLVM puts #[cold] functions in
    `.text.unlikely.NAME`, so both spellings of each name are matched."""
    lines = [
        "/* Generated by executor/layout/profile.py: the functions a typical executor runs,",
        "   placed together ahead of the rest of .text (docs/executor.md, \"Memory\").",
        "   Hashes and LLVM's .N suffixes are globbed so that rebuilds keep matching. */",
        "SECTIONS {",
        "  .init : { KEEP (*(SORT_NONE(.init))) }",
        "  .text.hot : {",
        "    /* The C runtime's entry and init code runs in every process. */",
        "    *crt1.o(.text .text.*)",
        "    *crti.o(.text .text.*)",
        "    *crtbegin*.o(.text .text.*)",
    ]
    lines += ["    /* What a settled service's executor runs. */"]
    lines += [f"    *(.text.{g} .text.unlikely.{g})" for g in steady]
    lines += ["    /* Starting a service (unmapped again once it settled). */"]
    lines += [f"    *(.text.{g} .text.unlikely.{g})" for g in starting]
    lines += ["    /* Only when stopping, or for other kinds of task. */"]
    lines += [f"    *(.text.{g} .text.unlikely.{g})" for g in then]
    lines += ["  }", "} INSERT BEFORE .text;", ""]
    return "\n".join(lines)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(root, "target/release/drover-executor"))
    ap.add_argument("--service", default=os.path.join(root, "target/release/drover-test-service"))
    ap.add_argument("--out", default=os.path.join(here, "hot.ld"))
    a = ap.parse_args()
    binary = os.path.realpath(a.bin)
    os.environ["DROVER_EXECUTOR_RELEASE_STARTUP"] = "0"
    syms = symbols(binary)
    clear_probes()
    names = {}
    fd = os.open(f"{TRACE}/uprobe_events", os.O_WRONLY | os.O_APPEND)
    for i, (aliases, off) in enumerate(syms):
        try:
            os.write(fd, f"p:{GROUP}/f{i} {binary}:0x{off:x}\n".encode())
            names[f"f{i}"] = aliases
        except OSError as e:
            print(f"no probe on {aliases[0]} at 0x{off:x}: {e}", file=sys.stderr)
    os.close(fd)
    try:
        write(f"{TRACE}/events/{GROUP}/enable", "1")
        service = argparse.Namespace(names=names)  # filled in by run_standalone
        with tempfile.TemporaryDirectory(prefix="drover-layout-") as work:
            scenarios(binary, os.path.realpath(a.service), work, service)
        hot = hit_since(names, {})
    finally:
        clear_probes()
    sizes = {}
    for line in subprocess.run(["nm", "-S", binary], capture_output=True, text=True).stdout.splitlines():
        p = line.split()
        if len(p) == 4:
            sizes[p[3]] = int(p[1], 16)
    # What a settled service's executor needs comes first, then what starting it
    # needed, then what only stopping or other kinds of task need: a service that
    # runs for days then touches only the head of the hot area once its executor
    # has unmapped the startup pages.
    steady = sorted({glob(n) for n in service.steady} | {glob(n) for n in extra_names(here)})
    starting = sorted({glob(n) for n in service.started} - set(steady))
    then = sorted({glob(n) for n in hot} - set(steady) - set(starting))
    with open(a.out, "w") as f:
        f.write(linker_script(steady, starting, then))
    total = sum(sizes.get(aliases[0], 0) for aliases, _ in syms)
    print(f"{len(hot)} of {sum(len(aliases) for aliases, _ in syms)} function names ran, "
          f"{sum(sizes.get(n, 0) for n in set(hot))} of {total} bytes, "
          f"{sum(sizes.get(n, 0) for n in set(service.steady))} bytes once settled; wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
