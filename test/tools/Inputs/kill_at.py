"""Kills a run once it has written a file, and reports how it ended.

  kill_at.py --when FILE --kill group|rank [--wait S] -- COMMAND...

Starts COMMAND (mtprt-run --nproc N ...) in a session of its own, waits for
FILE (a checkpoint: written whole, then renamed), then sends SIGKILL to the
whole session (`group`: the machine lost power) or to one rank, the
launcher's last child (`rank`: one process lost mid-run). Waits up to S
seconds for the launcher to end and prints one line: how it ended and the
first error line it wrote (stderr). A run that outlives S is a hang.
"""
import argparse
import os
import signal
import subprocess
import sys
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
    ap.add_argument("--when", required=True)
    ap.add_argument("--kill", choices=["group", "rank"], required=True)
    ap.add_argument("--wait", type=float, default=120)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    deadline = time.time() + a.wait
    while not os.path.exists(a.when):
        if p.poll() is not None:
            print(f"ended (exit {p.returncode}) before {a.when} appeared")
            return 1
        if time.time() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            print(f"{a.when} did not appear within {a.wait:g} s")
            return 1
        time.sleep(0.01)
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
    start = time.time()
    try:
        _, err = p.communicate(timeout=a.wait)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        print(f"hang: still running {a.wait:g} s after a rank was killed")
        return 1
    first = next((l for l in err.splitlines() if "error" in l), "(no error line)")
    print(f"exit {p.returncode} after a rank was killed: {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
