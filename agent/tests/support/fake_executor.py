#!/usr/bin/env python3
"""A stand-in for drover-executor in the agent's tests: speaks the same socket
protocol (subscribe / kill), writes status.json and a log, records each start in
spawns and each cleanup in cleanups, in the task directory. The first process's cmdline
picks the behaviour: "finish" ends FINISHED at once, "exit-when-done" exits right
after a terminal state even with no subscriber, "stuck-kill" goes KILLING on a kill
and never further (an executor whose kill cannot complete)."""
import asyncio, json, os, sys, time

TERMINAL = {"FINISHED", "FAILED", "KILLED", "LOST"}
args = sys.argv[1:]


def opt(name):
    return args[args.index(name) + 1]


sandbox = opt("--sandbox")
drover = sandbox  # the task directory
os.makedirs(os.path.join(drover, "logs"), exist_ok=True)

if args[0] == "cleanup":
    with open(os.path.join(drover, "cleanups"), "a") as f:
        f.write("cleanup\n")
    sys.exit(0)

with open(opt("--task")) as f:
    task = json.load(f)
mode = task["task"]["processes"][0]["cmdline"]
with open(os.path.join(drover, "spawns"), "a") as f:
    f.write("%d\n" % os.getpid())
with open(os.path.join(drover, "logs", "main.stdout"), "a") as f:
    f.write("hello from %s\n" % task["task_id"])

history = []
subscribers = []
sent_terminal = None


def emit(state, reason=None):
    st = {
        "seq": len(history) + 1,
        "task_id": task["task_id"],
        "state": state,
        "exit_reason": reason,
        "message": state.lower(),
        "timestamp_ms": int(time.time() * 1000),
        "executor_pid": os.getpid(),
        "processes": [],
    }
    history.append(st)
    tmp = os.path.join(drover, "status.json.tmp")
    with open(tmp, "w") as f:
        json.dump(st, f)
    os.replace(tmp, os.path.join(drover, "status.json"))
    line = (json.dumps(st) + "\n").encode()
    for w in list(subscribers):
        try:
            w.write(line)
            if state in TERMINAL:
                sent_terminal.set()
        except Exception:
            subscribers.remove(w)


async def handle(reader, writer):
    while True:
        line = await reader.readline()
        if not line:
            return
        req = json.loads(line)
        if req["op"] == "subscribe":
            replay = [s for s in history if s["seq"] > req["after_seq"]] or history[-1:]
            for st in replay:
                writer.write((json.dumps(st) + "\n").encode())
            await writer.drain()
            subscribers.append(writer)
            if history and history[-1]["state"] in TERMINAL:
                sent_terminal.set()
        elif req["op"] == "kill":
            if history[-1]["state"] not in TERMINAL and mode == "stuck-kill":
                if history[-1]["state"] != "KILLING":
                    emit("KILLING")
            elif history[-1]["state"] not in TERMINAL:
                emit("KILLING")
                emit("KILLED", req.get("reason") or {"kind": "killed_by_request"})


async def main():
    global sent_terminal
    sent_terminal = asyncio.Event()
    sock = os.path.join(drover, "executor.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    server = await asyncio.start_unix_server(handle, path=sock)
    if "--ready-fd" in args:
        ready = int(opt("--ready-fd"))
        # Like the real executor, a reader that stopped waiting (the agent's
        # READY_WAIT ran out on a loaded machine) is no reason to fail.
        try:
            os.write(ready, b"\n")
        except BrokenPipeError:
            pass
        os.close(ready)
    emit("STARTING")
    emit("RUNNING")
    if mode == "finish":
        emit("FINISHED", {"kind": "exit_code", "code": 0})
    while True:
        if history[-1]["state"] in TERMINAL and mode == "exit-when-done":
            break
        if sent_terminal.is_set():
            await asyncio.sleep(0.1)
            break
        await asyncio.sleep(0.02)
    server.close()


asyncio.run(main())
