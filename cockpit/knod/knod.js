/* knod-policy's admin page for Cockpit (no build step: plain JavaScript on cockpit.js).
 *
 * Where each figure comes from:
 *  - the bindings: ListBindings once, then the daemon's signals (Subscribe, then
 *    BindingCreated/Released/Revoked and each binding's PropertiesChanged for State); a new
 *    binding's properties through Properties.GetAll;
 *  - RX bytes and the rate: one ObjectManager.GetManagedObjects every 2 s while the page is shown
 *    and holds bindings (the daemon signals no counter: it moves with every packet), applied to
 *    the rows the signals put there and to no other;
 *  - policy digest, rules, mode: the Manager's properties, read again on PolicyReloaded;
 *  - revoke and reload: RevokeBinding / ReloadPolicy; whether they are allowed: CanManage (the
 *    daemon's own check: root, the policy's admin group, or polkit org.knod.policy1.manage);
 *  - the host's readiness: GetHostReport (the checks `knod-policy doctor` prints);
 *  - refusals and ends: `knod-policy audit events --last N --json` on the daemon's JournalPath
 *    (no D-Bus method reads the journal; auditors read the snapshot the daemon publishes).
 *
 * Every value from the daemon, the journal or a caller goes into the page with textContent.
 */
"use strict";

const SERVICE = "org.knod.Policy1";
const MANAGER_PATH = "/org/knod/Policy1";
const MANAGER = "org.knod.Policy1.Manager";
const BINDING = "org.knod.Policy1.Binding";
const PROPERTIES = "org.freedesktop.DBus.Properties";
const OBJECT_MANAGER = "org.freedesktop.DBus.ObjectManager";
const BINDINGS_PREFIX = MANAGER_PATH + "/bindings/";
const COUNTER_INTERVAL_MS = 2000;
const JOURNAL_INTERVAL_MS = 15000;
const JOURNAL_EVENTS = 500; // the newest events read per refresh
const JOURNAL_ROWS = 50; // shown
const REFUSAL_KINDS = new Set(["request-denied", "activate-refused", "reload-refused",
    "revoke-refused", "attest-refused", "rate-limited", "refusals-coalesced"]);
const END_KINDS = new Set(["session-ended", "revoke"]);

const bus = cockpit.dbus(SERVICE, { bus: "system" });
const bindings = new Map(); // id -> { path, props, row, cells, sample }
let mayManage = false;
let manageWhy = "";
let journalPath = null;
let journalTimer = null;

function $(id) {
    return document.getElementById(id);
}

// Sets an element's text; the only way values reach the page.
function setText(el, value) {
    el.textContent = value === undefined || value === null ? "" : String(value);
}

function td(row, value, className) {
    const cell = document.createElement("td");
    setText(cell, value);
    if (className)
        cell.className = className;
    row.appendChild(cell);
    return cell;
}

// a{sv} as cockpit delivers it ({name: {t, v}}) to plain values.
function unwrap(dict) {
    const out = {};
    for (const name in dict)
        out[name] = dict[name] && typeof dict[name] === "object" && "v" in dict[name] ? dict[name].v : dict[name];
    return out;
}

function bytes(n) {
    if (typeof n !== "number" || !isFinite(n))
        return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
        n /= 1024;
        i++;
    }
    return (i === 0 ? String(Math.round(n)) : n.toFixed(1)) + " " + units[i];
}

function utc(us) {
    if (typeof us !== "number" || !isFinite(us) || us <= 0)
        return "-";
    return new Date(us / 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function remaining(us) {
    if (typeof us !== "number" || !isFinite(us) || us <= 0)
        return "never";
    const s = Math.round(us / 1e6 - Date.now() / 1000);
    if (s <= 0)
        return "due";
    if (s < 120)
        return s + " s";
    if (s < 7200)
        return Math.floor(s / 60) + " min";
    return Math.floor(s / 3600) + " h";
}

function errorText(e) {
    if (!e)
        return "unknown error";
    if (e.name && e.message)
        return e.message + " (" + e.name + ")";
    return e.message || e.problem || String(e);
}

// Every call has a deadline: a daemon that is stopped or hung (issue 52) shows as an error
// on the page within it, instead of a page that waits for ever for its reads.
const CALL_TIMEOUT_MS = 5000;

function call(path, iface, method, args) {
    return bus.call(path, iface, method, args || [], { timeout: CALL_TIMEOUT_MS });
}

/* --- the daemon and its policy ------------------------------------------------------------ */

function showProblem(text) {
    const p = $("daemon-problem");
    setText(p, text);
    p.hidden = !text;
}

function readManager() {
    return call(MANAGER_PATH, PROPERTIES, "GetAll", [MANAGER]).then(([dict]) => {
        const m = unwrap(dict);
        setText($("daemon-line"), "knod-policyd " + m.Version + ", driver " + m.Driver + ", " +
            m.BindingCount + " binding(s) in all");
        setText($("policy-digest"), m.PolicyDigest || "-");
        setText($("policy-rules"), m.Rules);
        setText($("policy-mode"), m.Permissive ? "permissive (denials are only journaled)" : "enforcing");
        showProblem(m.JournalProblem ? "Journal: " + m.JournalProblem : "");
        journalPath = m.JournalPath || null;
    });
}

function readCanManage() {
    return call(MANAGER_PATH, MANAGER, "CanManage")
            .catch(e => [false, "the daemon could not say (" + errorText(e) + "); reload the page to ask again"])
            .then(([allowed, reason]) => {
        mayManage = !!allowed;
        const why = manageWhy = mayManage ? "" : "Revoke and reload are not available to you: " + reason;
        const note = $("manage-note");
        setText(note, why);
        note.hidden = mayManage;
        $("reload").disabled = !mayManage;
        $("reload").title = why;
        for (const b of bindings.values()) {
            b.revoke.disabled = !mayManage;
            b.revoke.title = why;
        }
    });
}

function reload() {
    setText($("reload-result"), "reloading...");
    $("reload").disabled = true;
    call(MANAGER_PATH, MANAGER, "ReloadPolicy")
            .then(([rules, revoked]) => {
                setText($("reload-result"), "reloaded: " + rules + " rule(s), " + revoked + " binding(s) revoked");
                return readManager();
            })
            .catch(e => setText($("reload-result"), "not reloaded: " + errorText(e)))
            .finally(() => { $("reload").disabled = !mayManage });
}

/* --- live bindings -------------------------------------------------------------------------- */

let managerSoon = null;

// BindingCount counts every user's bindings: read again a moment after a signal (one read for
// a burst of them).
function readManagerSoon() {
    if (managerSoon === null)
        managerSoon = window.setTimeout(() => {
            managerSoon = null;
            readManager().catch(() => {});
        }, 500);
}

function countBindings() {
    setText($("bindings-count"), "(" + bindings.size + ")");
    $("bindings-empty").hidden = bindings.size > 0;
    $("bindings").hidden = bindings.size === 0;
}

// The job tag its holder set (Binding.SetJob): job[group]#rank, "-" for none. A claim of the
// holder's, shown to group a job's ranks; set after the binding is made, so read again with the
// counters.
function jobText(p) {
    if (typeof p.Job !== "string" || p.Job === "")
        return "-";
    return p.Job + (p.JobGroup ? "[" + p.JobGroup + "]" : "") + "#" + p.JobRank;
}

function addBinding(path, props) {
    const id = props.Id;
    if (typeof id !== "string" || bindings.has(id))
        return;
    const row = document.createElement("tr");
    row.dataset.binding = id;
    const b = { path, props, row, sample: null, cells: {} };
    td(row, id, "knod-mono");
    td(row, "uid " + props.OwnerUid + ", pid " + props.OwnerPid);
    const pod = props.Pod && typeof props.Pod === "object" ? props.Pod : {};
    td(row, pod.name ? "pod " + pod.namespace + "/" + pod.name : props.OwnerUnit || "-");
    td(row, props.Netdev);
    td(row, props.Gpu);
    td(row, props.Rule);
    b.cells.job = td(row, jobText(props));
    b.cells.state = td(row, props.State);
    td(row, utc(props.Created));
    b.cells.expires = td(row, remaining(props.Expires));
    b.cells.rx = td(row, bytes(props.RxBytes), "knod-num");
    b.cells.rx.dataset.bytes = String(props.RxBytes);
    b.cells.rate = td(row, "-", "knod-num");
    const action = document.createElement("td");
    b.revoke = document.createElement("button");
    b.revoke.type = "button";
    setText(b.revoke, "Revoke");
    b.revoke.disabled = !mayManage;
    b.revoke.title = manageWhy;
    b.revoke.addEventListener("click", () => askRevoke(id));
    action.appendChild(b.revoke);
    row.appendChild(action);
    bindings.set(id, b);
    $("bindings-body").appendChild(row);
    countBindings();
    scheduleCounters();
}

function dropBinding(id, reason) {
    const b = bindings.get(id);
    if (!b)
        return;
    bindings.delete(id);
    b.row.remove();
    if ($("revoke-form").dataset.binding === id)
        closeRevoke();
    countBindings();
    setText($("bindings-last"), "Binding " + id + " ended: " + reason);
    refreshJournalSoon();
}

// Any process on the bus can address a signal to the page's connection: a row goes only when
// the daemon, asked, no longer has the binding (the signal's reason is shown once it is gone).
function confirmEnded(id, reason, tries) {
    const b = bindings.get(id);
    if (!b)
        return;
    call(b.path, PROPERTIES, "Get", [BINDING, "Id"])
            .then(() => {}) // still there: not ended, whoever sent that
            .catch(e => {
                if (e && e.name === "org.freedesktop.DBus.Error.UnknownObject")
                    dropBinding(id, reason);
                else if ((tries || 0) < 5) // the bus or a rate limit: ask again
                    window.setTimeout(() => confirmEnded(id, reason, (tries || 0) + 1), 1000);
            });
}

function fetchBinding(path) {
    call(path, PROPERTIES, "GetAll", [BINDING])
            .then(([dict]) => addBinding(path, unwrap(dict)))
            .catch(() => {}); // gone before we asked: its end signal says so
}

function idOfPath(path) {
    return path.startsWith(BINDINGS_PREFIX) ? path.slice(BINDINGS_PREFIX.length) : null;
}

// The Manager's signals. Named, so that a test can hand it a forged signal directly (Cockpit's
// bridge drops most forgeries before they get here; the page must not need that).
function managerSignal(path, iface, signal, args) {
        if (signal === "BindingCreated") {
            fetchBinding(args[0]);
            readManagerSoon();
        } else if (signal === "BindingReleased" || signal === "BindingRevoked") {
            confirmEnded(args[1], args[2]);
            readManagerSoon();
        } else if (signal === "PolicyReloaded") {
            readManager().then(readCanManage).catch(() => {});
        }
}

function subscribeSignals() {
    bus.subscribe({ interface: MANAGER, path: MANAGER_PATH }, managerSignal);
    bus.subscribe({ interface: PROPERTIES, member: "PropertiesChanged", path_namespace: MANAGER_PATH },
                  (path, iface, signal, args) => {
                      const b = bindings.get(idOfPath(path));
                      if (!b || args[0] !== BINDING)
                          return;
                      // Read from the daemon, not from the signal (anyone may send one).
                      call(b.path, PROPERTIES, "Get", [BINDING, "State"])
                              .then(([state]) => {
                                  b.props.State = state.v;
                                  setText(b.cells.state, state.v);
                              })
                              .catch(() => {});
                  });
}

let counterTimer = null;

function scheduleCounters() {
    if (counterTimer === null && bindings.size > 0 && !cockpit.hidden)
        counterTimer = window.setTimeout(readCounters, COUNTER_INTERVAL_MS);
}

function readCounters() {
    counterTimer = null;
    call(MANAGER_PATH, OBJECT_MANAGER, "GetManagedObjects")
            .then(([objects]) => {
                const now = performance.now();
                // A missed signal (the daemon only logs a lost one) leaves no wrong row for
                // long: a row whose object is gone is confirmed ended, an object without a row
                // is fetched.
                for (const [id, b] of bindings)
                    if (!(b.path in objects))
                        confirmEnded(id, "(ended; see the journal)");
                for (const path in objects)
                    if (idOfPath(path) !== null && !bindings.has(idOfPath(path)))
                        fetchBinding(path);
                for (const path in objects) {
                    const b = bindings.get(idOfPath(path));
                    const ifaces = objects[path];
                    if (!b || !ifaces || !ifaces[BINDING])
                        continue;
                    const p = unwrap(ifaces[BINDING]);
                    if (typeof p.RxBytes !== "number")
                        continue;
                    if (b.sample && now > b.sample.at && p.RxBytes >= b.sample.bytes)
                        setText(b.cells.rate, bytes((p.RxBytes - b.sample.bytes) / ((now - b.sample.at) / 1000)) + "/s");
                    b.sample = { at: now, bytes: p.RxBytes };
                    setText(b.cells.rx, bytes(p.RxBytes));
                    b.cells.rx.dataset.bytes = String(p.RxBytes);
                    setText(b.cells.expires, remaining(p.Expires));
                    setText(b.cells.job, jobText(p));
                }
            })
            .catch(e => showProblem("Cannot read the bindings' counters: " + errorText(e)))
            .finally(scheduleCounters);
}

/* --- revoke --------------------------------------------------------------------------------- */

function askRevoke(id) {
    const form = $("revoke-form");
    form.dataset.binding = id;
    setText($("revoke-id"), id);
    setText($("revoke-error"), "");
    $("revoke-reason").value = "";
    form.hidden = false;
    $("revoke-reason").focus();
}

function closeRevoke() {
    const form = $("revoke-form");
    delete form.dataset.binding;
    form.hidden = true;
}

function revoke(event) {
    event.preventDefault();
    const id = $("revoke-form").dataset.binding;
    const reason = $("revoke-reason").value.trim();
    if (!id)
        return;
    if (!reason) {
        setText($("revoke-error"), "Say why: the journal keeps your reason.");
        return;
    }
    $("revoke-confirm").disabled = true;
    call(MANAGER_PATH, MANAGER, "RevokeBinding", [id, reason])
            .then(closeRevoke) // the row goes with the daemon's BindingRevoked signal
            .catch(e => setText($("revoke-error"), "Not revoked: " + errorText(e)))
            .finally(() => { $("revoke-confirm").disabled = false });
}

/* --- the journal ---------------------------------------------------------------------------- */

let journalSoon = null;

function refreshJournalSoon() {
    // The snapshot auditors read trails the live journal by up to the daemon's
    // --snapshot-interval: look again shortly, then on the usual period.
    if (journalSoon === null)
        journalSoon = window.setTimeout(() => {
            journalSoon = null;
            refreshJournal();
        }, 1500);
}

function journalProblem(text) {
    const p = $("journal-problem");
    setText(p, text);
    p.hidden = !text;
}

function refreshJournal() {
    if (journalTimer !== null)
        window.clearTimeout(journalTimer);
    journalTimer = window.setTimeout(refreshJournal, JOURNAL_INTERVAL_MS);
    if (cockpit.hidden)
        return; // looked at again when the page is shown
    if (!journalPath) {
        journalProblem("The daemon did not say where its journal is.");
        return;
    }
    const args = ["knod-policy", "audit", "events", "--db", journalPath, "--last", String(JOURNAL_EVENTS), "--json"];
    cockpit.spawn(args, { err: "message" })
            .then((out, message) => {
                let events;
                try {
                    events = JSON.parse(out);
                } catch (e) {
                    journalProblem("knod-policy printed something that is not JSON: " + e.message);
                    return;
                }
                if (!Array.isArray(events)) {
                    $("journal-body").replaceChildren();
                    journalProblem(events && events.error ? events.error : "unexpected answer from knod-policy");
                    return;
                }
                journalProblem("");
                setText($("journal-source"), message ? String(message).trim() : "Read from " + journalPath + ".");
                showJournal(events);
            })
            .catch((e, out) => {
                // knod-policy exits 2 with a JSON error: an object, or the last element of the
                // array it had begun (a row it could not read).
                let text = errorText(e), denied = e && e.exit_status === 2 && !out;
                try {
                    let j = JSON.parse(out);
                    if (Array.isArray(j))
                        j = j[j.length - 1];
                    if (j && j.error)
                        text = j.error;
                    denied = /permission denied|cannot read the journal/i.test(text);
                } catch (x) { /* the message says it */ }
                $("journal-body").replaceChildren();
                journalProblem(denied
                    ? "The journal cannot be read as you: " + text +
                      " (auditors are members of the state dir's group; docs/audit.md)"
                    : "The journal could not be read: " + text);
                if (denied && journalTimer !== null) { // asking again will not help
                    window.clearTimeout(journalTimer);
                    journalTimer = null;
                }
            });
}

function showJournal(events) {
    const body = $("journal-body");
    const shown = events.filter(e => e && typeof e === "object" && (REFUSAL_KINDS.has(e.kind) || END_KINDS.has(e.kind)))
            .slice(-JOURNAL_ROWS)
            .reverse();
    const rows = shown.map(e => {
        const row = document.createElement("tr");
        row.dataset.kind = String(e.kind);
        td(row, typeof e.time === "string" ? e.time.replace("T", " ") : "-");
        td(row, e.kind);
        td(row, e.uid === null || e.uid === undefined ? "-" : "uid " + e.uid);
        td(row, e.decision);
        td(row, e.rule);
        td(row, e.reason);
        td(row, e.netdev);
        td(row, e.gpu);
        return row;
    });
    body.replaceChildren(...rows);
}

/* --- the host ------------------------------------------------------------------------------- */

function readHost() {
    call(MANAGER_PATH, MANAGER, "GetHostReport")
            .then(([text]) => {
                let report;
                try {
                    report = JSON.parse(text);
                } catch (e) {
                    setText($("host-summary"), "The host report is not JSON: " + e.message);
                    return;
                }
                showHost(report);
            })
            .catch(e => setText($("host-summary"), "No host report: " + errorText(e)));
}

function showHost(report) {
    const host = report && report.host ? report.host : {};
    const checks = Array.isArray(host.checks) ? host.checks : [];
    const bySubject = new Map();
    for (const c of checks) {
        const subject = typeof c.subject === "string" ? c.subject : "host";
        if (!bySubject.has(subject))
            bySubject.set(subject, []);
        bySubject.get(subject).push(c);
    }
    const count = status => checks.filter(c => c.status === status).length;
    setText($("host-summary"), host.error ? "Host checks failed: " + host.error
        : "Driver " + report.driver + ": " + count("fail") + " failing, " + count("warn") +
          " warning(s), " + count("pass") + " passing check(s). Subjects: the host, each NIC, " +
          "each GPU, and each NIC -> GPU pair.");
    const out = [];
    for (const [subject, list] of bySubject) {
        const h = document.createElement("h3");
        h.className = "knod-subject";
        setText(h, subject);
        out.push(h);
        const table = document.createElement("table");
        table.className = "knod-table";
        table.dataset.subject = subject;
        for (const c of list) {
            const row = document.createElement("tr");
            td(row, c.status, "knod-status-" + (["pass", "info", "warn", "fail"].includes(c.status) ? c.status : "info"));
            td(row, c.id, "knod-mono knod-nowrap");
            td(row, c.message);
            td(row, c.fix ? "Fix: " + c.fix : "");
            table.appendChild(row);
        }
        out.push(table);
    }
    $("host-checks").replaceChildren(...out);
}

/* --- start ---------------------------------------------------------------------------------- */

function start() {
    $("reload").addEventListener("click", reload);
    $("revoke-form").addEventListener("submit", revoke);
    $("revoke-cancel").addEventListener("click", closeRevoke);
    $("journal-refresh").addEventListener("click", refreshJournal);
    cockpit.addEventListener("visibilitychange", () => {
        scheduleCounters();
        if (!cockpit.hidden && journalTimer !== null)
            refreshJournal();
    });
    countBindings();
    bus.addEventListener("close", (event, options) => {
        showProblem("Lost the system bus: " + cockpit.message(options));
        $("knod").dataset.state = "closed";
    });
    let daemonOwner;
    bus.addEventListener("owner", (event, owner) => {
        if (owner === null) {
            showProblem("knod-policyd is not running (no owner of org.knod.Policy1 on the system bus).");
            $("knod").dataset.state = "no-daemon";
        } else if (daemonOwner !== undefined && owner !== daemonOwner) {
            // A new daemon: its subscriptions and bindings are its own; start over.
            for (const id of [...bindings.keys()])
                dropBinding(id, "the daemon restarted");
            showProblem("");
            load();
        }
        daemonOwner = owner;
    });
    // Signals first, then Subscribe, then the list: a binding made meanwhile arrives twice at
    // most (addBinding ignores the second), and none is missed.
    subscribeSignals();
    load();
}

function load() {
    $("knod").dataset.state = "loading";
    call(MANAGER_PATH, MANAGER, "Subscribe")
            .then(readManager)
            .then(readCanManage)
            .then(() => call(MANAGER_PATH, MANAGER, "ListBindings"))
            .then(([list]) => {
                for (const entry of list)
                    fetchBinding(entry[0]);
                $("knod").dataset.state = "ready";
                refreshJournal();
                readHost();
            })
            .catch(e => {
                showProblem("knod-policyd did not answer: " + errorText(e));
                $("knod").dataset.state = "failed";
            });
}

document.addEventListener("DOMContentLoaded", start);
