#!/usr/bin/env python3
"""Loads an `mtpc report` page in headless Chromium and checks it against the
metrics file it was rendered from.

Talks the Chrome DevTools protocol over --remote-debugging-pipe (fds 3 and 4,
NUL-separated JSON), so only the standard library is needed. Checks:
  * the page loads with no console errors, no uncaught exceptions, no failed
    requests (the page must need no network);
  * each panel's SVG exists (--panels);
  * each time chart has one data point per step record of the JSONL, and the
    loss chart's last value per task is the file's last loss of that task;
  * the cosine heat map holds every measured matrix; the plan strip has a
    unit per backbone block and a row per task (with --plan);
  * the script works: hovering a chart shows the tooltip with a step, the
    smoothing slider redraws the lines, the heat map's slider moves steps.
Prints one line per check (for FileCheck) and exits 1 on the first failure.

usage: report_check.py CHROMIUM PAGE.html RUN.jsonl [--panels a,b,...]
                       [--plan] [--screenshot OUT.png] [--width 1400]
"""
import argparse
import base64
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time


class Browser:
    def __init__(self, chromium, width):
        self.profile = tempfile.mkdtemp(prefix="mtpc-report-chromium-")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Put the child's ends well above 4 so the dup2s below cannot clobber
        # one another.
        child_in = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def wire():
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        args = [chromium, "--headless", "--disable-gpu", "--no-sandbox",
                "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync",
                "--disable-dev-shm-usage", "--mute-audio",
                "--user-data-dir=" + self.profile,
                "--window-size=%d,1000" % width, "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=wire, close_fds=False,
                                     stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        os.close(child_in)
        os.close(child_out)
        self.w = os.fdopen(to_child_w, "wb", buffering=0)
        self.r = os.fdopen(from_child_r, "rb", buffering=0)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no answer from Chromium")
            chunk = self.r.read(65536)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")
                raise RuntimeError("Chromium closed the pipe:\n" + err[-2000:])
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=None, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.w.write(json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, timeout=60):
        deadline = time.time() + timeout
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def fail(why):
    print("FAIL: " + why)
    sys.exit(1)


EVALS = []  # the file's evaluation records, in order


def read_jsonl(path):
    records, events = [], []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the run still writing its last line
                continue
            raise
        if "event" in r:
            events.append(r)
        elif "eval" in r:
            EVALS.append(r)
        else:
            # A repeated step replaces the earlier records from it on.
            records = [old for old in records if old["step"] < r["step"]]
            records.append(r)
    return records, events


PAGE_STATE = r"""
(() => {
  const out = {panels: [], charts: {}, cosine: null, plan: null, events: 0};
  document.querySelectorAll('svg[data-panel]').forEach(svg => {
    out.panels.push(svg.dataset.panel);
    if (!svg.classList.contains('chart')) return;
    const series = [];
    svg.querySelectorAll('path.series').forEach(p => {
      const d = p.getAttribute('d') || '';
      series.push({key: p.dataset.series, n: Number(p.dataset.n),
                   cmds: (d.match(/[ML]/g) || []).length,
                   last: p.dataset.last, raw: p.classList.contains('raw'),
                   title: (p.querySelector('title') || {}).textContent});
    });
    out.charts[svg.dataset.panel] = {records: Number(svg.dataset.records),
      series: series, events: svg.querySelectorAll('g.event').length,
      empty: (svg.querySelector('text.empty') || {}).textContent || null};
  });
  const hm = document.getElementById('chart-cosine');
  if (hm) out.cosine = {measured: Number(hm.dataset.measured), step: hm.dataset.step,
                        cells: hm.querySelectorAll('g.cell').length};
  const plan = document.getElementById('chart-plan');
  if (plan) out.plan = {backbone: Number(plan.dataset.units), tasks: Number(plan.dataset.tasks),
    units: plan.querySelectorAll('g.unit').length,
    taps: Array.from(plan.querySelectorAll('g.task')).map(g => g.dataset.task + '@' + g.dataset.tap),
    decisions: Array.from(plan.querySelectorAll('g.unit')).map(g => g.dataset.decision)};
  out.scripts = Array.from(document.scripts).filter(s => s.src).length;
  out.links = Array.from(document.querySelectorAll('link[href],img[src]')).map(e => e.href || e.src)
      .filter(u => !u.startsWith('data:')).length;
  return JSON.stringify(out);
})()
"""


def check_problems(b, session):
    """Fails on everything the page said or threw so far."""
    b.send("Runtime.evaluate", {"expression": "1"}, session=session)
    errors = []
    for m in b.events:
        method, params = m.get("method"), m.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append("exception: %s" % params["exceptionDetails"])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                "error", "assert", "warning"):
            errors.append("console.%s: %s" % (params["type"], params.get("args")))
        elif method == "Log.entryAdded" and params["entry"]["level"] in (
                "error", "warning"):
            errors.append("log: %s" % params["entry"].get("text"))
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not (url.startswith("file://") or url.startswith("data:")
                    or url == "about:blank"):
                errors.append("network request: " + url)
        elif method == "Network.loadingFailed":
            errors.append("failed load: %s" % params.get("errorText"))
    if errors:
        fail("the page reported %d problem(s):\n  %s" % (len(errors), "\n  ".join(errors)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("chromium")
    ap.add_argument("page")
    ap.add_argument("jsonl")
    ap.add_argument("--panels", default="loss,cosine,alpha,memory,offload-hit,"
                    "offload-wait,bytes,throughput,step-time")
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--screenshot")
    ap.add_argument("--width", type=int, default=1400)
    a = ap.parse_args()

    records, events = read_jsonl(a.jsonl)
    tasks = list(records[0]["loss"].keys())

    b = Browser(a.chromium, a.width)
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})
        session = b.send("Target.attachToTarget",
                         {"targetId": target["targetId"], "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            b.send(domain + ".enable", session=session)
        b.send("Emulation.setDeviceMetricsOverride",
               {"width": a.width, "height": 1000, "deviceScaleFactor": 1,
                "mobile": False}, session=session)
        b.send("Page.navigate", {"url": "file://" + os.path.abspath(a.page)},
               session=session)
        b.wait_event("Page.loadEventFired")
        check_problems(b, session)

        def evaluate(expr):
            r = b.send("Runtime.evaluate", {"expression": expr,
                                            "returnByValue": True},
                       session=session)
            if "exceptionDetails" in r:
                fail("script error: %s" % r["exceptionDetails"])
            return r["result"].get("value")

        state = json.loads(evaluate(PAGE_STATE))
        print("page loaded: %d panels, %d external scripts, %d external links"
              % (len(state["panels"]), state["scripts"], state["links"]))
        if state["scripts"] or state["links"]:
            fail("the page loads something from outside itself")

        want = [p for p in a.panels.split(",") if p] + (["plan"] if a.plan else [])
        missing = [p for p in want if p not in state["panels"]]
        if missing:
            fail("panels without an SVG: %s (have %s)" % (missing, state["panels"]))
        print("panels: " + " ".join(want))

        n = len(records)
        for panel, chart in sorted(state["charts"].items()):
            if chart["records"] != n:
                fail("%s: %d records, the JSONL has %d" % (panel, chart["records"], n))
            if chart["events"] != len(events):
                fail("%s: %d event markers, the JSONL has %d events"
                     % (panel, chart["events"], len(events)))
            for s in chart["series"]:
                if s["n"] != s["cmds"]:
                    fail("%s %s: data-n %d but the path has %d points"
                         % (panel, s["key"], s["n"], s["cmds"]))
        print("charts: %d step records, %d event(s) marked on each"
              % (n, len(events)))

        # Held-out evaluation: a panel per task, a row per evaluation, the
        # last row's values the file's.
        if EVALS:
            panels = json.loads(evaluate(
                "JSON.stringify([...document.querySelectorAll('section.eval')]"
                ".map(s => ({task: s.dataset.task, rows: [...s.querySelectorAll"
                "('tbody tr')].map(r => Object.fromEntries([...r.querySelectorAll"
                "('td[data-metric]')].map(c => [c.dataset.metric, c.dataset.value])))})))"))
            tasks_evaluated = []
            for r in EVALS:
                for t in r["eval"]:
                    if t not in tasks_evaluated:
                        tasks_evaluated.append(t)
            got = {p["task"]: p["rows"] for p in panels}
            for t in tasks_evaluated:
                rows = got.get(t)
                if rows is None:
                    fail("no eval panel for task %s (have %s)" % (t, list(got)))
                if len(rows) != len(EVALS):
                    fail("eval %s: %d rows, the JSONL has %d evaluations"
                         % (t, len(rows), len(EVALS)))
                for metric, v in EVALS[-1]["eval"][t].items():
                    shown = rows[-1].get(metric)
                    if v is None:
                        if shown != "null":
                            fail("eval %s.%s: shows %s, the JSONL has null" % (t, metric, shown))
                    elif shown is None or not math.isclose(float(shown), v, rel_tol=1e-9):
                        fail("eval %s.%s: shows %s, the JSONL has %r" % (t, metric, shown, v))
            print("eval panels: %s, %d evaluation(s) each, the last one's values as logged"
                  % (" ".join(tasks_evaluated), len(EVALS)))

        # Loss: one point per step record (with the task's labels), and the
        # last value of each task.
        loss = {s["key"]: s for s in state["charts"]["loss"]["series"] if s["raw"]}
        for t in tasks:
            values = [r["loss"].get(t) for r in records]
            present = [v for v in values if v is not None]
            s = loss.get(t)
            if not s:
                fail("no loss series for task %s" % t)
            if s["n"] != len(present):
                fail("loss %s: %d points, the JSONL has %d" % (t, s["n"], len(present)))
            last = float(s["last"])
            if not math.isclose(last, present[-1], rel_tol=1e-7):
                fail("loss %s: last %r, the JSONL's last is %r" % (t, last, present[-1]))
            if s["last"] not in s["title"] and ("%.5g" % last) not in s["title"]:
                fail("loss %s: the tooltip '%s' lacks the last value" % (t, s["title"]))
            print("loss %s: %d points, last %s = JSONL step %d" % (
                t, s["n"], s["last"], [r["step"] for r in records if r["loss"].get(t) is not None][-1]))
        for panel, key in (("alpha", tasks[0]), ("memory", "measured_peak_bytes"),
                           ("throughput", "samples_per_s")):
            s = [x for x in state["charts"][panel]["series"] if x["key"] == key]
            if not s and state["charts"][panel]["empty"] is None:
                fail("%s: no series %s" % (panel, key))
            if s and s[0]["n"] != sum(1 for r in records if (
                    r["alpha"].get(key) if panel == "alpha" else r.get(key)) is not None):
                fail("%s %s: %d points" % (panel, key, s[0]["n"]))
        print("alpha, memory, throughput: one point per step")
        for panel in ("offload-hit", "bytes"):
            print("%s: %s" % (panel, state["charts"][panel]["empty"] or "%d series" %
                              len(state["charts"][panel]["series"])))

        measured = sum(1 for r in records if r.get("gradient_cosine_sim_matrix"))
        cos = state["cosine"]
        if cos["measured"] != measured:
            fail("cosine: %d matrices, the JSONL has %d" % (cos["measured"], measured))
        print("cosine: %d matrices, latest step %s, %d cells"
              % (cos["measured"], cos["step"], cos["cells"]))

        if a.plan:
            p = state["plan"]
            print("plan: %d backbone units, %d tasks (taps %s), %d units: %d keep, "
                  "%d recompute, %d offload" % (
                      p["backbone"], p["tasks"], " ".join(p["taps"]), p["units"],
                      p["decisions"].count("keep"), p["decisions"].count("recompute"),
                      p["decisions"].count("offload")))

        # The script: hover, smoothing, the heat map's slider.
        box = evaluate("JSON.stringify(document.getElementById('chart-loss')"
                       ".getBoundingClientRect())")
        box = json.loads(box)
        b.send("Runtime.evaluate", {"expression":
               "document.getElementById('chart-loss').scrollIntoView()"},
               session=session)
        box = json.loads(evaluate("JSON.stringify(document.getElementById("
                                  "'chart-loss').getBoundingClientRect())"))
        x = box["x"] + box["width"] * 0.6
        y = box["y"] + box["height"] * 0.5
        b.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y},
               session=session)
        tip = evaluate("(() => { const t = document.getElementById('tip');"
                       " return t.style.display + '|' + t.textContent; })()")
        shown, text = tip.split("|", 1)
        if shown != "block" or not text.startswith("step "):
            fail("hovering the loss chart shows no tooltip (%r)" % tip)
        print("hover: " + text.split(tasks[0])[0].strip() + " ...")
        if a.screenshot:
            # Keep the tooltip out of the picture of the whole page.
            b.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 1, "y": 1},
                   session=session)
        changed = evaluate(r"""(() => {
          const p = document.querySelector('#chart-loss path.smooth');
          const before = p.getAttribute('d');
          const s = document.getElementById('smooth-slider');
          s.value = '0.95'; s.dispatchEvent(new Event('input'));
          const after = p.getAttribute('d');
          s.value = '0.6'; s.dispatchEvent(new Event('input'));
          return before !== after && after.length > 0 && p.getAttribute('d') === before;
        })()""")
        if not changed:
            fail("the smoothing slider does not redraw the loss lines")
        print("smoothing slider: redraws")
        if measured:
            moved = evaluate(r"""(() => {
              const s = document.getElementById('cos-slider');
              s.value = '0'; s.dispatchEvent(new Event('input'));
              const first = document.getElementById('chart-cosine').dataset.step;
              s.value = s.max; s.dispatchEvent(new Event('input'));
              return first;
            })()""")
            first = [r["step"] for r in records if r.get("gradient_cosine_sim_matrix")][0]
            if str(first) != moved:
                fail("the heat map's slider shows step %s at 0, expected %s" % (moved, first))
            print("cosine slider: step %s to %s" % (moved, cos["step"]))

        if a.screenshot:
            metrics = b.send("Page.getLayoutMetrics", session=session)
            height = int(math.ceil(metrics["cssContentSize"]["height"]))
            b.send("Emulation.setDeviceMetricsOverride",
                   {"width": a.width, "height": height, "deviceScaleFactor": 1,
                    "mobile": False}, session=session)
            shot = b.send("Page.captureScreenshot", {"format": "png"},
                          session=session)
            with open(a.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            print("screenshot: %dx%d" % (a.width, height))

        check_problems(b, session)
        print("console errors: 0")
    finally:
        b.close()


if __name__ == "__main__":
    main()
