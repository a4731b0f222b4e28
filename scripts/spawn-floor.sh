#!/usr/bin/env bash
# The floor under a Drover task on this machine (issue 33): what the kernel alone
# takes for the two process starts every one-shot task needs -- the agent's fork
# server forks an executor (a fork, no exec) and the executor starts the task
# (clone + exec of /usr/bin/true, which `true` resolves to without a shell).
#
#   scripts/spawn-floor.sh        (any user; needs cc)
#
# A small C program, compiled into a temporary directory, runs SPAWNS (default 5000)
# of each, in one loop and in WORKERS (default: the CPU count) loops side by side,
# each loop reaping its child before the next start:
#   fork+exec+wait   fork(), execv("/usr/bin/true"), waitpid()
#   fork+exit+wait   fork(), _exit(0) in the child, waitpid()
# and prints, per start, the wall time and the CPU time (user + system of the loops
# and all their children, from getrusage), with the 1-minute load average before.
set -euo pipefail

spawns=${SPAWNS:-5000}
workers=${WORKERS:-$(nproc)}
case $spawns in '' | *[!0-9]* | 0) echo "SPAWNS must be a positive integer" >&2 && exit 2 ;; esac
case $workers in '' | *[!0-9]* | 0) echo "WORKERS must be a positive integer" >&2 && exit 2 ;; esac
command -v cc >/dev/null 2>&1 || {
  echo "spawn-floor: needs a C compiler (cc)" >&2
  exit 1
}
dir=$(mktemp -d "${TMPDIR:-/tmp}/spawn-floor.XXXXXX")
trap 'rm -rf "$dir"' EXIT

cat >"$dir/floor.c" <<'EOF'
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void loop(int exec, long n) {
  char *argv[] = {"true", NULL};
  for (long i = 0; i < n; i++) {
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(1); }
    if (pid == 0) {
      if (exec) { execv("/usr/bin/true", argv); _exit(127); }
      _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "child failed\n");
      exit(1);
    }
  }
}

int main(int argc, char **argv) {
  int exec = strcmp(argv[1], "exec") == 0;
  long n = atol(argv[2]);
  int workers = atoi(argv[3]);
  double start = now();
  for (int w = 0; w < workers; w++) {
    pid_t pid = fork();
    if (pid == 0) { loop(exec, n / workers); _exit(0); }
  }
  for (int w = 0; w < workers; w++) wait(NULL);
  double wall = now() - start;
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
               ru.ru_stime.tv_usec / 1e6;
  long done = n / workers * workers;
  printf("%-15s %d loop(s): %ld starts in %.2f s = %.0f/s; per start %.1f us wall, %.1f us CPU\n",
         exec ? "fork+exec+wait" : "fork+exit+wait", workers, done, wall, done / wall,
         wall / done * 1e6 * workers, cpu / done * 1e6);
  return 0;
}
EOF
cc -O2 -o "$dir/floor" "$dir/floor.c"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; kernel $(uname -r)"
for w in 1 "$workers"; do
  "$dir/floor" exec "$spawns" "$w"
  "$dir/floor" fork "$spawns" "$w"
  [ "$workers" != 1 ] || break
done
