"""Kills a run once it has written a file, and reports how it ended.

  kill_at.py (--when FILE | --when-stderr TEXT) --kill group|rank|int
             [--wait S] [--stdout FILE] -- COMMAND...

Starts COMMAND (mtprt-run --nproc N ...) in a session of its own, waits for
FILE (a checkpoint: written whole, then renamed) or for TEXT in its stderr,
then sends SIGKILL to the whole session (`group`: the machine lost power) or
to one rank, the launcher's last child (`rank`: one process lost mid-run),
or SIGINT to the session (`int`: Ctrl-C at a terminal). Waits up to S
seconds for the launcher to end and prints one line: how it ended and the
first error line it wrote (stderr). A run that outlives S is a hang.
"""
import argparse
import os
import signal
import subprocess
import sys
import threading
import time


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(d))
            except OSError:
                pass
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--when")
    ap.add_argument("--when-stderr")
    ap.add_argument("--kill", choices=["group", "rank", "int"], required=True)
    ap.add_argument("--wait", type=float, default=120)
    ap.add_argument("--stdout")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    out = open(a.stdout, "w") if a.stdout else subprocess.DEVNULL
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    err_lines = []

    def read_stderr():
        for line in p.stderr:
            err_lines.append(line)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    what = a.when or a.when_stderr

    def arrived():
        if a.when:
            return os.path.exists(a.when)
        return any(a.when_stderr in l for l in list(err_lines))

    deadline = time.time() + a.wait
    while not arrived():
        if p.poll() is not None:
            print(f"ended (exit {p.returncode}) before {what} appeared")
            return 1
        if time.time() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            print(f"{what} did not appear within {a.wait:g} s")
            return 1
        time.sleep(0.01)
    def outcome(what):
        """Waits for the launcher after `what`; its exit and first error line."""
        try:
            p.wait(timeout=a.wait)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            print(f"hang: still running {a.wait:g} s after {what}")
            return 1
        reader.join(timeout=5)
        first = next((l.rstrip("\n") for l in err_lines if "error" in l), "(no error line)")
        print(f"exit {p.returncode} after {what}: {first}")
        return 0

    if a.kill == "int":
        os.killpg(p.pid, signal.SIGINT)
        return outcome("SIGINT")
    if a.kill == "group":
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        print("killed the run (SIGKILL to every process)")
        return 0
    ranks = children(p.pid)
    if not ranks:
        print("the launcher has no ranks to kill")
        return 1
    os.kill(ranks[-1], signal.SIGKILL)
    return outcome("a rank was killed")

if __name__ == "__main__":
    sys.exit(main())
