"""Starts N ranks of a command as a launcher would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in each one's environment, no mtprt-run launcher
watching them), kills the last rank with SIGKILL once FILE exists, and
reports how each survivor ended: within S seconds, with which first error
line — or "hung" (the survivors are then killed).

  lose_rank.py --nproc N --when FILE [--wait S] -- COMMAND...
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--when", required=True)
    ap.add_argument("--wait", type=float, default=60)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    port = str(free_port())
    procs, errs = [], []
    for r in range(a.nproc):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        # stderr to a file: a pipe read only at the end could fill and block.
        err = tempfile.TemporaryFile(mode="w+")
        errs.append(err)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=err, text=True))

    def stderr_of(r):
        errs[r].seek(0)
        return errs[r].read()

    deadline = time.time() + a.wait
    while not os.path.exists(a.when):
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
                p.wait()
            print("never reached", a.when)
            for r in range(a.nproc):
                sys.stdout.write(stderr_of(r)[-2000:])
            return 1
        time.sleep(0.05)
    procs[-1].send_signal(signal.SIGKILL)
    procs[-1].wait()
    end = time.time() + a.wait
    for r, p in enumerate(procs[:-1]):
        try:
            rc = p.wait(timeout=max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            print(f"rank {r}: hung")
            continue
        err = [l for l in stderr_of(r).splitlines()
               if "error" in l.lower() or "failed" in l.lower()]
        how = (f"exit {rc}" if rc >= 0 else
               f"killed by {signal.Signals(-rc).name}")
        print(f"rank {r}: {how}: {err[0] if err else '(no error line)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
