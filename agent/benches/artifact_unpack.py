#!/usr/bin/env python3
"""What a cached artifact adds to a task's start: the agent's unpack helper
(`drover-agent unpack-artifact`, the step a cache hit still takes) putting a 10 MiB
tarball (ten 1 MiB files) into a fresh sandbox directory, fed the cached file on
stdin as the agent does, against GNU tar unpacking the same file and against
spawning `true` (the floor of any process start). Runs alternate, each into a new
directory on the same file system; prints the medians.

Usage: agent/benches/artifact_unpack.py [path/to/drover-agent] [runs]
(default target/release/drover-agent, 40 runs; build it with scripts/release.sh).
"""

import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time


def tarball(path):
    with tarfile.open(path, "w") as tar:
        for i in range(10):
            data = os.urandom(1 << 20)
            info = tarfile.TarInfo(f"app/part{i}.bin")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def timed(argv, stdin_path=None):
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    start = time.perf_counter()
    subprocess.run(argv, stdin=stdin, check=True)
    elapsed = time.perf_counter() - start
    if stdin_path:
        stdin.close()
    return elapsed * 1000


def main():
    agent = sys.argv[1] if len(sys.argv) > 1 else "target/release/drover-agent"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    work = tempfile.mkdtemp(prefix="drover-bench-")
    try:
        archive = os.path.join(work, "cached.tar")
        tarball(archive)
        times = {"helper": [], "tar": [], "true": []}
        for i in range(runs):
            for kind in ("helper", "tar", "true"):
                dest = os.path.join(work, f"{kind}-{i}")
                os.mkdir(dest)
                if kind == "helper":
                    argv = [agent, "unpack-artifact", dest, ".", "tar", "644",
                            str(1 << 40), "-"]
                    times[kind].append(timed(argv, archive))
                elif kind == "tar":
                    times[kind].append(timed(["tar", "-xf", archive, "-C", dest]))
                else:
                    times[kind].append(timed(["true"]))
                shutil.rmtree(dest)
        for kind, t in times.items():
            print(f"{kind:>6}: median {statistics.median(t):.2f} ms "
                  f"(min {min(t):.2f}, max {max(t):.2f}, {len(t)} runs)")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
