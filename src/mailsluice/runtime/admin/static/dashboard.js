// The mailsluice dashboard: polls the admin JSON API every second with the bearer token
// kept in sessionStorage (never in the URL), and draws what it gets. No framework, no
// build step; every value goes into the page as text (textContent), never as HTML.
// The chart opens with the last 15 minutes the server kept (GET /api/history), then
// goes on with the page's own polls.
"use strict";

const KEY = "mailsluice-admin-token";
const HISTORY = 900; // seconds of chart
const history = []; // {t, delivered, deferred} cumulative totals
let timer = null;

// shared_state: this gateway's share of the fleet's limit, and a fallback when Redis is lost
function fleetNote(d) {
  if (!d.fleet) return "";
  const mode = d.fleet.mode === "fallback" ? ", FALLBACK: Redis lost" : "";
  return " of the fleet's " + d.fleet.fleet_limit + " (" + d.fleet.gateways + " gateways" + mode + ")";
}

function $(id) { return document.getElementById(id); }

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function row(cells, attrs) {
  const tr = el("tr", null, attrs);
  for (const cell of cells) {
    const td = el("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell === null || cell === undefined ? "" : String(cell);
    tr.appendChild(td);
  }
  return tr;
}

// Rows are kept by key and updated in place (text, bars), so what a person is about to
// click is not replaced under the pointer by the next refresh; buttons are made once.
function fill(tableId, items, keyOf, cellsOf, attrsOf, onCreate) {
  const body = $(tableId).querySelector("tbody");
  const existing = new Map([...body.children].map(tr => [tr.dataset.key, tr]));
  const rows = items.map(item => {
    const key = String(keyOf(item));
    const cells = cellsOf(item);
    let tr = existing.get(key);
    if (!tr || tr.children.length !== cells.length) {
      tr = row(cells, attrsOf(item));
      tr.dataset.key = key;
      if (onCreate) onCreate(tr, item);
      return tr;
    }
    cells.forEach((cell, i) => {
      const td = tr.children[i];
      if (cell instanceof Node) {
        const old = td.firstElementChild;
        if (cell.classList.contains("bar") && old) old.replaceWith(cell);
        return; // (a button stays the one made with the row)
      }
      const text = cell === null || cell === undefined ? "" : String(cell);
      if (td.textContent !== text) td.textContent = text;
    });
    for (const [name, value] of Object.entries(attrsOf(item))) tr.setAttribute(name, value);
    return tr;
  });
  rows.forEach((tr, i) => { if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null); });
  while (body.children.length > rows.length) body.lastElementChild.remove();
}

async function api(method, path, body) {
  const options = { method, headers: { "Authorization": "Bearer " + sessionStorage.getItem(KEY) } };
  // every write says JSON, body or not: the server refuses other writes (a page
  // elsewhere could send those cross-site without asking first)
  if (method !== "GET") options.headers["Content-Type"] = "application/json";
  if (body !== undefined) options.body = JSON.stringify(body);
  const response = await fetch(path, options);
  if (response.status === 401) { logout("The token was refused."); throw new Error("unauthorized"); }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || ("HTTP " + response.status));
  return data;
}

function logout(message) {
  sessionStorage.removeItem(KEY);
  if (timer) clearInterval(timer);
  timer = null;
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
}

function bar(used, limit) {
  const outer = el("span", null, { class: "bar" });
  const inner = el("span");
  const share = limit > 0 ? Math.min(1, used / limit) : 0;
  inner.style.width = Math.round(share * 100) + "%";
  outer.appendChild(inner);
  return outer;
}

function seconds(value) {
  if (value === null || value === undefined) return "";
  return value < 90 ? value.toFixed(0) + " s" : (value / 60).toFixed(1) + " min";
}

function clock(epoch) {
  return new Date(epoch * 1000).toISOString().slice(11, 19) + " UTC";
}

function drawChart() {
  const svg = $("chart");
  const width = 900, height = 160, pad = 24;
  const points = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i];
    const dt = b.t - a.t;
    if (dt <= 0) continue;
    points.push({ t: b.t, rate: Math.max(0, (b.delivered - a.delivered) / dt), defer: Math.max(0, (b.deferred - a.deferred) / dt) });
  }
  const now = history.length ? history[history.length - 1].t : 0;
  const span = history.length ? Math.min(HISTORY, Math.max(60, now - history[0].t)) : HISTORY;
  const top = Math.max(1, ...points.map(p => Math.max(p.rate, p.defer)));
  const x = t => pad + (width - 2 * pad) * (1 - (now - t) / span);
  const y = v => height - pad - (height - 2 * pad) * (v / top);
  const children = [];
  const axis = document.createElementNS("http://www.w3.org/2000/svg", "line");
  axis.setAttribute("x1", pad); axis.setAttribute("x2", width - pad);
  axis.setAttribute("y1", height - pad); axis.setAttribute("y2", height - pad);
  axis.setAttribute("stroke", "#c5cad3");
  children.push(axis);
  const label = document.createElementNS("http://www.w3.org/2000/svg", "text");
  label.setAttribute("x", 2); label.setAttribute("y", pad - 6);
  label.textContent = top.toFixed(1) + " /s";
  children.push(label);
  const since = document.createElementNS("http://www.w3.org/2000/svg", "text");
  since.setAttribute("x", pad); since.setAttribute("y", height - 6);
  since.textContent = span >= 120 ? "-" + Math.round(span / 60) + " min" : "-" + Math.round(span) + " s";
  children.push(since);
  for (const [field, colour, cls] of [["rate", "#3a6df0", "series-throughput"], ["defer", "#e0771b", "series-deferrals"]]) {
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colour);
    line.setAttribute("stroke-width", "2");
    line.setAttribute("class", cls);
    line.setAttribute("data-points", String(points.length));
    line.setAttribute("points", points.map(p => x(p.t).toFixed(1) + "," + y(p[field]).toFixed(1)).join(" "));
    children.push(line);
  }
  svg.replaceChildren(...children);
}

async function showTranscript(id) {
  $("transcript-id").textContent = id;
  const box = $("transcript");
  box.classList.remove("muted");
  try {
    const data = await api("GET", "/api/sessions/" + encodeURIComponent(id) + "/transcript");
    box.replaceChildren(...data.lines.map(line => {
      const div = el("div", null, { class: "transcript-line" });
      div.appendChild(el("span", line.direction + " ", { class: "dir" }));
      div.appendChild(document.createTextNode(line.text));
      return div;
    }));
    if (!data.lines.length) box.textContent = "(no transcript lines written yet)";
  } catch (error) {
    box.textContent = String(error.message);
  }
}

function abortButton(id) {
  const stop = el("button", "abort", { class: "abort", title: "end this session (421 to the client)" });
  stop.addEventListener("click", async event => {
    event.stopPropagation();
    if (confirm("Abort session " + id + "? The client gets a 421 and retries later.")) {
      await api("POST", "/api/sessions/" + encodeURIComponent(id) + "/abort").catch(e => alert(e.message));
    }
  });
  return stop;
}

function resumeButton(id) {
  const resume = el("button", "resume", { class: "resume" });
  resume.addEventListener("click", async () => {
    await api("DELETE", "/api/suspensions/" + encodeURIComponent(id)).catch(e => alert(e.message));
    refresh();
  });
  return resume;
}

function deferralsOf(overview) {
  // as the server's history counts them: transactions deferred, and every 4xx of an MX
  return overview.deferred + Object.values(overview.mx_deferrals).reduce((a, b) => a + b, 0);
}

async function loadHistory() {
  try {
    const kept = await api("GET", "/api/history");
    const mine = history.splice(0);
    for (const s of kept.samples) history.push({ t: s.t, delivered: s.delivered, deferred: s.deferred });
    for (const s of mine) if (!history.length || s.t > history[history.length - 1].t) history.push(s);
    drawChart();
  } catch (error) {
    // (an older server: the chart fills as the page polls)
  }
}

function recipients(list) {
  if (!list || !list.length) return "";
  return list.length > 1 ? list[0] + " (+" + (list.length - 1) + ")" : list[0];
}

async function refresh() {
  try {
    const [overview, sessions, destinations, tenants, suspensions, recent] = await Promise.all([
      api("GET", "/api/overview"), api("GET", "/api/sessions"), api("GET", "/api/destinations"),
      api("GET", "/api/tenants"), api("GET", "/api/suspensions"), api("GET", "/api/recent"),
    ]);
    $("status").textContent = overview.workers + " worker(s), up " + seconds(overview.uptime_s) + (overview.fair_sharing ? ", fair sharing" : "");
    $("draining").hidden = !overview.draining;
    $("updated").textContent = "updated " + clock(overview.now);
    history.push({ t: overview.now, delivered: overview.delivered, deferred: deferralsOf(overview) });
    while (history.length && history[0].t < overview.now - HISTORY - 2) history.shift();
    const last = history.length > 1 ? history[history.length - 1] : null;
    const first = history.length > 1 ? history[Math.max(0, history.length - 6)] : null;
    $("in-flight").textContent = String(sessions.sessions.length);
    $("delivered").textContent = String(overview.delivered);
    $("suspension-count").textContent = String(suspensions.suspensions.length);
    if (last && first && last.t > first.t) {
      $("rate").textContent = ((last.delivered - first.delivered) / (last.t - first.t)).toFixed(1);
    }
    const minuteAgo = history.find(h => h.t >= overview.now - 60) || history[0];
    $("deferrals").textContent = String(last ? last.deferred - minuteAgo.deferred : 0);
    drawChart();

    fill("sessions", sessions.sessions, s => s.id,
      s => [s.id, s.client, s.tenant, s.destination, s.phase, seconds(s.age_s), s.bytes, abortButton(s.id)],
      s => ({ class: "clickable session-row", "data-id": s.id }),
      (tr, s) => tr.addEventListener("click", () => showTranscript(s.id)));

    $("destinations-note").textContent = destinations.fair_sharing ? "" : "Fair sharing is off: no per-destination slots to show.";
    fill("destinations", destinations.destinations, d => d.destination, d => [
      d.destination, d.in_use + " / " + d.limit + (d.learned ? " (learned)" : "") + fleetNote(d), bar(d.in_use, d.limit), d.waiting,
      Object.values(d.deferrals_15m || {}).reduce((a, b) => a + b, 0),
    ], d => ({ class: "destination-row", "data-destination": d.destination, "data-in-use": String(d.in_use) }));

    const busyAll = tenants.tenants.reduce((a, t) => a + t.busy, 0);
    fill("tenants", tenants.tenants, t => t.tenant, t => [
      t.tenant, t.weight, t.sessions, t.busy, bar(t.busy, busyAll), t.waiting,
      t.suspended ? "suspended until " + clock(t.suspended.until) : "",
    ], t => ({ class: "tenant-row", "data-tenant": t.tenant }));

    fill("suspensions", suspensions.suspensions, s => s.id,
      s => [s.kind + " " + s.name, clock(s.until), s.reason, resumeButton(s.id)],
      s => ({ class: "suspension-row", "data-id": s.id }));

    fill("recent", recent.sessions.slice(0, 15), s => s.id,
      s => [(s.started_at || "").replace("T", " ").slice(11, 19), s.client, s.mail_from === null ? "" : "<" + s.mail_from + ">",
            recipients(s.rcpt_to), s.destination, s.final_code, s.reason],
      s => ({ class: "clickable recent-row", "data-id": s.id }),
      (tr, s) => tr.addEventListener("click", () => showTranscript(s.id)));
  } catch (error) {
    if (error.message !== "unauthorized") $("status").textContent = "cannot reach the proxy: " + error.message;
  }
}

function start() {
  $("login").hidden = true;
  $("app").hidden = false;
  loadHistory();
  refresh();
  timer = setInterval(refresh, 1000);
}

$("login-form").addEventListener("submit", event => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(KEY, token);
  $("token").value = "";
  start();
});

$("suspend-form").addEventListener("submit", async event => {
  event.preventDefault();
  $("suspend-error").textContent = "";
  try {
    await api("POST", "/api/suspensions", {
      kind: $("suspend-kind").value, name: $("suspend-name").value,
      seconds: Number($("suspend-minutes").value) * 60, reason: $("suspend-reason").value,
    });
    $("suspend-name").value = "";
    refresh();
  } catch (error) {
    $("suspend-error").textContent = error.message;
  }
});

if (sessionStorage.getItem(KEY)) start(); else logout("");
