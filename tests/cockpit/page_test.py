"""Drives the Cockpit page (cockpit/knod) in headless Chromium over the DevTools protocol.

Run by cockpit_page_test.sh, which starts the real parts: knod-policyd (sim) on a private bus,
cockpit-ws with a local session for an admin (a uid in the policy's admin group) and for a plain
user, and Chromium with a DevTools port. This side makes bindings and refusals with the test
client, sends traffic, and reads what the page shows through its DOM: every wait is for a
condition, with a deadline that names it.

Usage: page_test.py --cdp-port P --admin-url URL --plain-url URL --client KNOD_TEST_CLIENT
                    --cli KNOD_POLICY --netdev NETDEV --netns NETNS --bus ADDRESS
                    --plain-uid UID --screenshot FILE.png
Prints "ok - ..." / "not ok - ..." lines; exit 1 on any failure.
"""
import argparse
import base64
import io
import itertools
import json
import os
import subprocess
import sys
import time

import websocket
from PIL import Image

HOSTILE_REASON = '<script>window.__pwned = "reason"</script><img src=x onerror="window.__pwned=1"><b>revoked</b> by the page'
HOSTILE_GPU = '<img src=x onerror="window.__pwned=2">'
FLOW = "udp 10.99.0.1:* -> 10.99.0.2:5000"
PLAIN_FLOW = "udp 10.99.0.1:* -> 10.99.0.2:5001"
FENCE_FLOW = "udp 10.99.0.1:* -> 10.99.0.2:5003"

# Run as another uid: a signal from the daemon's path and interface, addressed to every
# connection on the bus (the page's among them), and one broadcast.
FORGER = r"""
import sys, dbus, dbus.lowlevel
bus = dbus.SystemBus()
names = [n for n in bus.list_names() if n.startswith(":")]
binding = sys.argv[1]
sent = 0
for member, args in (("BindingRevoked", ("/org/knod/Policy1/bindings/" + binding, binding, "revoke: forged")),
                     ("BindingReleased", ("/org/knod/Policy1/bindings/" + binding, binding, "release")),
                     ("BindingCreated", ("/org/knod/Policy1/bindings/bforged00000000", "bforged00000000"))):
    for dest in names + [None]:
        m = dbus.lowlevel.SignalMessage("/org/knod/Policy1", "org.knod.Policy1.Manager", member)
        if dest:
            m.set_destination(dest)
        m.append(dbus.ObjectPath(args[0]), *args[1:])
        bus.send_message(m)
        sent += 1
bus.flush()
print("sent", sent)
"""

failures = 0


def ok(what):
    print("ok -", what, flush=True)


def not_ok(what, detail=""):
    global failures
    failures += 1
    print("not ok -", what, flush=True)
    if detail:
        print("    " + str(detail).replace("\n", "\n    "), flush=True)


class Page:
    """One tab, attached with a flat session; calls wait for their own answer."""

    def __init__(self, port):
        version = json.load(__import__("urllib.request").request.urlopen(
            f"http://127.0.0.1:{port}/json/version", timeout=30))
        self.ws = websocket.create_connection(version["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self.ids = itertools.count(1)
        self.exceptions = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Runtime.enable", session=True)
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1400, "height": 1100, "deviceScaleFactor": 1, "mobile": False}, session=True)

    def call(self, method, params=None, session=False):
        i = next(self.ids)
        msg = {"id": i, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            m = json.loads(self.ws.recv())
            if m.get("method") == "Runtime.exceptionThrown":
                self.exceptions.append(m["params"]["exceptionDetails"])
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})

    def eval(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True}, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, what, expression, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.eval("document.body ? document.body.innerText : ''") or ""
                raise TimeoutError(f"{timeout} s waiting for {what}; the page shows:\n{text[:3000]}")
            time.sleep(0.2)

    def open(self, url):
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait("the page to load cockpit.js", "typeof cockpit === 'object' && !!document.getElementById('knod')")

    def screenshot(self):
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"}, session=True)["data"])


def start_client(args, *command, uid=None, env=None):
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    p = subprocess.Popen(prefix + [args.client, *command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    line = p.stdout.readline().strip()
    return p, line


def stop_client(p):
    try:
        p.stdin.close()
    except OSError:
        pass
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def busctl(args, *call):
    out = subprocess.run(["busctl", f"--address={args.bus}", "--json=short", *call],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["data"]


def js(s):
    return json.dumps(s)


def check(what, fn):
    try:
        fn()
        ok(what)
    except Exception as e:  # a failed expectation names what it waited for or what it saw
        not_ok(what, e)


def assert_true(cond, detail):
    if not cond:
        raise AssertionError(detail)


def admin_session(args, page):
    page.open(args.admin_url)
    page.eval("window.__marker = 'not reloaded'")

    def ready():
        page.wait("the page ready", "document.getElementById('knod').dataset.state === 'ready'")
        digest = busctl(args, "get-property", "org.knod.Policy1", "/org/knod/Policy1",
                        "org.knod.Policy1.Manager", "PolicyDigest")
        page.wait("the policy digest in force", f"document.getElementById('policy-digest').textContent === {js(digest)}")
        assert_true(page.eval("!document.getElementById('reload').disabled && document.getElementById('manage-note').hidden"),
                    "reload is disabled or the note shows for an admin")
    check("admin: the page loads, shows the policy digest the daemon has, and reload is enabled", ready)

    def reload():
        page.eval("document.getElementById('reload').click()")
        page.wait("the reload's answer", "/^reloaded: \\d+ rule\\(s\\), 0 binding\\(s\\) revoked$/"
                  ".test(document.getElementById('reload-result').textContent)")
        events = subprocess.run(["sqlite3", args.journal, "SELECT count(*) FROM events WHERE kind = 'policy-reload'"],
                                capture_output=True, text=True).stdout.strip()
        assert_true(events == "1", f"policy-reload events in the journal: {events}")
    check("admin: reload from the page reloads the policy (journaled) and says how many rules", reload)

    def host():
        report = json.loads(busctl(args, "call", "org.knod.Policy1", "/org/knod/Policy1",
                                   "org.knod.Policy1.Manager", "GetHostReport")[0])
        checks = report["host"]["checks"]
        page.wait("the host checks", "document.querySelectorAll('#host-checks tr').length > 0")
        shown = page.eval("""[...document.querySelectorAll('#host-checks table')].map(t =>
            [t.dataset.subject, [...t.rows].map(r => [...r.cells].map(c => c.textContent))])""")
        want = {}
        for c in checks:
            want.setdefault(c["subject"], []).append([c["status"], c["id"], c["message"], "Fix: " + c["fix"] if c["fix"] else ""])
        assert_true({s: rows for s, rows in shown} == want, f"page {shown}\nreport {want}")
    check("admin: the host's readiness shows every check of GetHostReport, per subject, with its fix", host)

    # Rank 3 of group 0 of a job (Binding.SetJob, issue #53): the Job column shows its tag.
    holder, line = start_client(args, "hold-active", args.netdev, "sim0", "65536", FLOW,
                                env={"KNOD_TEST_JOB": "10.0.0.1:29500", "KNOD_TEST_JOB_GROUP": "0",
                                     "KNOD_TEST_JOB_RANK": "3"})
    binding = line.split()[1] if line.startswith("ok ") else None
    row = f"document.querySelector('tr[data-binding={js(binding)}]')"
    try:
        def appears():
            assert_true(binding, f"the test client got no binding: {line}")
            page.wait("the new binding's row", f"!!{row}")
            # Its state as the daemon signals it (the row may be drawn between grant and Activate).
            page.wait("the row's state to be active", f"{row}.cells[7].textContent === 'active'")
            # The tag came after the row was drawn: the page reads it with the counters.
            page.wait("the row's job tag", f"{row}.cells[6].textContent === '10.0.0.1:29500[0]#3'")
            cells = page.eval(f"[...{row}.cells].map(c => c.textContent)")
            assert_true(cells[0] == binding and cells[1] == "uid 0, pid %d" % holder.pid and cells[3] == args.netdev
                        and cells[4] == "sim0" and cells[5] == "sim-page" and cells[6] == "10.0.0.1:29500[0]#3"
                        and cells[7] == "active", cells)
            assert_true(page.eval("window.__marker") == "not reloaded", "the page was reloaded")
        check("admin: a binding made after the page loaded appears without a reload (owner, netdev, GPU, rule, job tag, state)", appears)

        def forged():
            out = subprocess.run(["setpriv", f"--reuid={args.plain_uid}", f"--regid={args.plain_uid}", "--clear-groups",
                                  "/usr/bin/python3", "-c", FORGER, binding], capture_output=True, text=True,
                                 env={"DBUS_SYSTEM_BUS_ADDRESS": args.bus})
            assert_true(out.returncode == 0 and out.stdout.startswith("sent"), out.stdout + out.stderr)
            # Cockpit's bridge drops most of those before the page sees them; the page must not
            # rely on it: the same forgeries, handed to its signal handler directly.
            path = "/org/knod/Policy1/bindings/" + binding
            page.eval(f"""managerSignal('/org/knod/Policy1', 'org.knod.Policy1.Manager', 'BindingRevoked',
                                        [{js(path)}, {js(binding)}, 'revoke: forged']);
                          managerSignal('/org/knod/Policy1', 'org.knod.Policy1.Manager', 'BindingReleased',
                                        [{js(path)}, {js(binding)}, 'release: forged']);
                          managerSignal('/org/knod/Policy1', 'org.knod.Policy1.Manager', 'BindingCreated',
                                        ['/org/knod/Policy1/bindings/bforged00000000', 'bforged00000000'])""")
            # A fence: a real binding made after the forgeries appears once the page has handled them.
            fence, fence_line = start_client(args, "hold", args.netdev, "sim0", "4096", FENCE_FLOW)
            try:
                fence_id = fence_line.split()[1]
                page.wait("the fence binding's row", f"!!document.querySelector('tr[data-binding={js(fence_id)}]')")
                assert_true(page.eval(f"!!{row} && !document.querySelector('tr[data-binding=\"bforged00000000\"]')"),
                            "a forged signal removed the binding's row or added one")
                assert_true(not page.eval("document.getElementById('bindings-last').textContent.includes('forged')"),
                            "the page shows a forged end reason")
            finally:
                stop_client(fence)
            page.wait("the fence binding's row to go when it really ends",
                      f"!document.querySelector('tr[data-binding={js(fence_id)}]')")
        check("admin: signals forged by another user (addressed to the page, or broadcast) change no row", forged)

        def traffic():
            subprocess.run([args.cli, "sim-send", "--netns", args.netns, "--to", "10.99.0.2:5000", "--count", "5",
                            "--data", "abcd"], check=True, capture_output=True)
            page.wait("RX bytes 20 in the row", f"{row}.cells[10].dataset.bytes === '20'")
            page.wait("an RX rate in the row", f"/\\/s$/.test({row}.cells[11].textContent)")
            assert_true(page.eval(f"{row}.cells[10].textContent") == "20 B", page.eval(f"{row}.cells[10].textContent"))
        check("admin: traffic to the binding shows as its RX bytes growing, with a rate", traffic)

        # Refusals: one by a deny rule, one whose GPU name is markup.
        for gpu in ("sim0", HOSTILE_GPU):
            p, _ = start_client(args, "hold", args.netdev, gpu, "4096", "udp 10.99.0.1:* -> 10.99.0.2:5002")
            stop_client(p)

        def shot():
            png = page.screenshot()
            with open(args.screenshot, "wb") as f:
                f.write(png)
            rect = page.eval(f"(r => [r.left, r.top, r.width, r.height])({row}.getBoundingClientRect())")
            head = page.eval("(r => [r.left, r.top, r.width, r.height])(document.querySelector('#bindings thead').getBoundingClientRect())")
            image = Image.open(io.BytesIO(png)).convert("L")
            left, top, width, height = (int(round(v)) for v in rect)
            assert_true(width > 600 and 12 < height < 80 and top + height <= image.height,
                        f"the binding's row is not where a reader sees it: {rect} in {image.size}")
            assert_true(head[1] + head[3] <= top + 1, f"the row {rect} is not under the table's header {head}")
            crop = image.crop((left, top, left + width, top + height))
            dark = sum(1 for v in crop.getdata() if v < 110)
            assert_true(dark > 150, f"the row's pixels hold no text ({dark} dark pixels in {rect})")
            print(f"    screenshot {args.screenshot}: binding row at {rect}, {dark} text pixels", flush=True)
        check("admin: a screenshot shows the binding's row under the table's header, with text in it", shot)

        def revoke():
            page.eval(f"{row}.querySelector('button').click()")
            page.wait("the revoke form", "!document.getElementById('revoke-form').hidden")
            page.eval(f"document.getElementById('revoke-reason').value = {js(HOSTILE_REASON)};"
                      "document.getElementById('revoke-confirm').click()")
            page.wait("the revoked binding's row to go", f"!{row}")
            page.wait("the end and its reason in the status line",
                      f"document.getElementById('bindings-last').textContent.includes({js(HOSTILE_REASON)})")
        check("admin: revoke from the page, with a reason: the row goes", revoke)

        def journal():
            page.wait("the revoke and its reason in the journal table", f"""[...document.querySelectorAll('#journal-body tr')]
                .some(r => r.dataset.kind === 'revoke' && r.cells[5].textContent === {js(HOSTILE_REASON)})""", timeout=90)
            page.wait("the deny rule's refusal in the journal table", """[...document.querySelectorAll('#journal-body tr')]
                .some(r => r.dataset.kind === 'request-denied' && r.cells[4].textContent === 'no-port-5002')""", timeout=90)
            page.wait("the refusal naming the markup GPU, as text", f"""[...document.querySelectorAll('#journal-body tr')]
                .some(r => r.dataset.kind === 'request-denied' && r.cells[7].textContent === {js(HOSTILE_GPU)})""", timeout=90)
            tags = page.eval("document.querySelectorAll('#knod script, #knod img, #knod b').length")
            assert_true(tags == 0 and page.eval("window.__pwned === undefined"),
                        f"markup from the journal became elements ({tags}) or ran ({page.eval('window.__pwned')})")
            sessions = subprocess.run([args.cli, "audit", "events", "--db", args.journal, "--kind", "revoke", "--json"],
                                      capture_output=True, text=True).stdout
            assert_true(any(e["reason"] == HOSTILE_REASON for e in json.loads(sessions)), sessions)
        check("admin: the journal table names the revoke's reason and the deciding rule of refusals, markup shown as text",
              journal)
    finally:
        stop_client(holder)


def plain_session(args, page):
    # Root's binding, held meanwhile: the plain user must not see it.
    others, others_line = start_client(args, "hold", args.netdev, "sim0", "4096", FENCE_FLOW)
    page.open(args.plain_url)
    holder, line = start_client(args, "hold", args.netdev, "sim0", "4096", PLAIN_FLOW, uid=args.plain_uid)
    try:
        assert_true(others_line.startswith("ok "), f"root got no binding: {others_line}")
        binding = line.split()[1] if line.startswith("ok ") else None

        def disabled():
            assert_true(binding, f"the plain user got no binding: {line}")
            page.wait("the page ready", "document.getElementById('knod').dataset.state === 'ready'")
            row = f"document.querySelector('tr[data-binding={js(binding)}]')"
            page.wait("the plain user's own binding", f"!!{row}")
            page.wait("the note saying why revoke and reload are off",
                      "!document.getElementById('manage-note').hidden && document.getElementById('manage-note')"
                      ".textContent.includes('org.knod.policy1.manage')")
            assert_true(page.eval(f"{row}.querySelector('button').disabled && document.getElementById('reload').disabled"),
                        "revoke or reload is enabled for a user without the right")
            assert_true(page.eval(f"{row}.querySelector('button').title").startswith("Revoke and reload are not available"),
                        "the disabled button does not say why")
            assert_true(page.eval("document.querySelectorAll('#bindings-body tr').length") == 1,
                        "the plain user sees bindings that are not its own")
        check("plain user: sees only its own binding; revoke and reload disabled, with the reason", disabled)

        def no_journal():
            page.wait("the journal's refusal to a non-auditor",
                      "!document.getElementById('journal-problem').hidden && "
                      "document.getElementById('journal-problem').textContent.includes('cannot be read as you')")
            assert_true(page.eval("document.querySelectorAll('#journal-body tr').length") == 0, "journal rows shown")
        check("plain user: the journal is not shown, and the page says why", no_journal)
    finally:
        stop_client(holder)
        stop_client(others)


def main():
    ap = argparse.ArgumentParser()
    for name in ("cdp-port", "admin-url", "plain-url", "client", "cli", "netdev", "netns", "bus", "screenshot",
                 "journal"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--plain-uid", type=int, required=True)
    args = ap.parse_args()
    page = Page(args.cdp_port)
    admin_session(args, page)
    plain_session(args, page)
    if page.exceptions:
        not_ok("no script errors on the page", json.dumps(page.exceptions)[:3000])
    else:
        ok("no script errors on the page")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
