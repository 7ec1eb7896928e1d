/* skyfed dashboard: vanilla JS over the public API, with the operator's bearer token.
 *
 * Why this shape: the page must work offline (no CDN), need no build step, and use
 * only what any API client may use, so everything it shows can also be scripted.
 * Every value from the API reaches the DOM through textContent, never as markup:
 * workload names are user input.
 *
 * Reads: GET /v1/clusters, /v1/sites, /v1/workloads, /v1/placements/{id},
 * /v1/placements/{id}/explain, /v1/events (edge failover log, provider sync),
 * /v1/providers (sync status), /metrics (burn rate). A missing endpoint is shown
 * as a note naming it rather than an error.
 */
"use strict";

const TOKEN_KEY = "skyfed.token";
const HISTORY_KEY = "skyfed.history";
const REFRESH_MS = 3000;
const PROVIDER_COLORS = {aws: "var(--aws)", gcp: "var(--gcp)", azure: "var(--azure)",
                         edge: "var(--edge)", onprem: "var(--onprem)"};
const placementCache = new Map();
let selectedWorkload = null;

// ------------------------------------------------------------------ helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function listOf(r) {
  if (Array.isArray(r)) return r;
  if (!r || typeof r !== "object") return [];
  for (const k of ["items", "data", "workloads", "clusters", "sites", "events", "accounts"]) {
    if (Array.isArray(r[k])) return r[k];
  }
  return [];
}
function num(v, digits) {
  if (v === null || v === undefined || v === "" || Number.isNaN(Number(v))) return "-";
  return Number(v).toFixed(digits === undefined ? 2 : digits);
}
function pick(obj, ...paths) {
  for (const p of paths) {
    let cur = obj;
    for (const part of p.split(".")) cur = cur == null ? undefined : cur[part];
    if (cur !== undefined && cur !== null) return cur;
  }
  return undefined;
}
function ago(ts) {
  if (!ts) return "never";
  const s = Math.max(0, Date.now() / 1000 - Number(ts));
  if (s < 120) return `${s.toFixed(0)} s ago`;
  if (s < 7200) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}
function setStatus(text, cls) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = cls || "muted";
}

class ApiError extends Error {
  constructor(path, status, detail) {
    super(`${path}: HTTP ${status}${detail ? " — " + detail : ""}`);
    this.status = status;
  }
}

async function api(path, opts) {
  const token = localStorage.getItem(TOKEN_KEY) || "";
  const resp = await fetch(path, Object.assign({
    headers: {"Authorization": `Bearer ${token}`, "Accept": "application/json"},
  }, opts || {}));
  if (!resp.ok) {
    let detail = "";
    try { const b = await resp.json(); detail = b.detail || b.title || ""; } catch (e) { /* not JSON */ }
    throw new ApiError(path, resp.status, detail);
  }
  const type = resp.headers.get("content-type") || "";
  return type.includes("json") ? resp.json() : resp.text();
}

const missingPaths = new Set();  // endpoints this broker lacks: asked once per page load

async function optional(path) {
  if (missingPaths.has(path)) return {ok: false, missing: true};
  try { return {ok: true, body: await api(path)}; }
  catch (e) {
    if (e instanceof ApiError && (e.status === 404 || e.status === 405)) {
      missingPaths.add(path);
      return {ok: false, missing: true};
    }
    return {ok: false, error: e};
  }
}

// ------------------------------------------------------------------ load figures
// CPU requested by placed/running workloads per cluster (from their placements):
// the load figure when the cluster rows carry no usage yet.
let requestedCpu = new Map();

function clusterLoad(c) {
  let used = 0, cap = 0;
  for (const p of c.pools || []) {
    const nodes = Number(pick(p, "nodes") || 0) || Number(pick(p, "maxNodes", "max_nodes") || 0);
    cap += Number(pick(p, "node.cpu", "node_cpu", "allocatable_cpu") || 0) * nodes;
    used += Number(pick(p, "used.cpu", "used_cpu") || 0);
  }
  const direct = pick(c, "load", "utilization", "cpu_utilization");
  if (direct !== undefined) return Number(direct);
  if (used === 0) used = requestedCpu.get(c.name) || 0;
  return cap > 0 ? Math.min(1, used / cap) : null;
}
function siteLoad(s) {
  const direct = pick(s, "load.cpu", "load", "attrs.load.cpu", "attrs.cpu_load");
  if (direct !== undefined && typeof direct !== "object") return Number(direct);
  const cap = Number(pick(s, "capacity.cpu") || 0);
  return cap > 0 ? Math.min(1, (requestedCpu.get(s.name) || 0) / cap) : null;
}
function phaseOf(w) {
  return typeof w.status === "object" && w.status !== null ? String(w.status.phase || "") : String(w.status || "");
}
function nameOf(w) {
  return pick(w, "metadata.name", "spec.name", "name") || "";
}
function health(x) {
  if (x.health) return String(x.health);
  if (x.healthy === false) return "unhealthy";
  return "healthy";
}

// ------------------------------------------------------------------ map
function drawMap(clusters, sites) {
  const map = document.getElementById("map");
  map.replaceChildren();
  for (let lon = -150; lon <= 150; lon += 30) map.append(svg("line", {class: "grid", x1: lon, y1: -90, x2: lon, y2: 90}));
  for (let lat = -60; lat <= 60; lat += 30) map.append(svg("line", {class: "grid", x1: -180, y1: -lat, x2: 180, y2: -lat}));
  for (const poly of window.SKYFED_WORLD || []) {
    map.append(svg("polygon", {class: "land", points: poly.map(([x, y]) => `${x},${-y}`).join(" ")}));
  }
  let missing = 0;
  const place = (item, shape) => {
    const lat = pick(item, "lat", "location.lat"), lon = pick(item, "lon", "location.lon");
    if (lat === undefined || lon === undefined) { missing += 1; return; }
    const load = shape === "site" ? siteLoad(item) : clusterLoad(item);
    const r = 1.6 + 3 * Math.min(1, Math.max(0, load || 0));
    const h = health(item);
    const color = h === "healthy" ? (PROVIDER_COLORS[item.provider || "edge"] || "var(--fg)")
                                  : (h === "suspect" ? "var(--warn)" : "var(--bad)");
    let mark;
    if (shape === "site") {
      const x = Number(lon), y = -Number(lat);
      mark = svg("polygon", {class: "site", fill: color,
        points: `${x},${y - r} ${x - r},${y + r * 0.8} ${x + r},${y + r * 0.8}`});
    } else {
      mark = svg("circle", {class: "cluster", cx: lon, cy: -lat, r, fill: color});
    }
    mark.setAttribute("data-name", item.name);
    const title = svg("title", {});
    title.textContent = `${item.name} (${item.provider || "edge"} ${item.region || ""}) ${h}` +
      (load === null ? "" : `, load ${(100 * load).toFixed(0)} %`);
    mark.append(title);
    map.append(mark);
    // Label only where no earlier label sits close by (Europe is crowded); the
    // tooltip (title) names every mark.
    const lx = Number(lon) + r + 0.8, ly = -Number(lat) + 1;
    if (!labelled.some(([x, y]) => Math.abs(x - lx) < 14 && Math.abs(y - ly) < 4)) {
      labelled.push([lx, ly]);
      const label = svg("text", {x: lx, y: ly});
      label.textContent = item.name;
      map.append(label);
    }
  };
  const labelled = [];
  clusters.forEach((c) => place(c, "cluster"));
  sites.forEach((s) => place(s, "site"));
  const legend = document.getElementById("map-legend");
  legend.replaceChildren(...Object.entries(PROVIDER_COLORS).map(([p, c]) =>
    el("span", {}, el("span", {class: "dot", style: `background:${c}`}), p)),
    el("span", {}, el("span", {class: "dot", style: "background:var(--bad)"}), "down"),
    ...(missing ? [el("span", {}, `${missing} without coordinates`)] : []));
}

// ------------------------------------------------------------------ tables
function fillTable(id, rows) {
  document.querySelector(`#${id} tbody`).replaceChildren(...rows);
}

function renderClusters(clusters) {
  fillTable("clusters", clusters.map((c) => {
    const load = clusterLoad(c);
    return el("tr", {"data-name": c.name},
      el("td", {}, c.name), el("td", {}, c.provider || ""), el("td", {}, c.region || ""),
      el("td", {class: health(c)}, health(c)),
      el("td", {}, load === null ? "-" : `${(100 * load).toFixed(0)} %`),
      el("td", {class: (c.quotaStale ?? c.quota_stale) ? "stale" : ""}, (c.quotaStale ?? c.quota_stale) ? "stale" : "fresh"));
  }));
}

function renderSites(sites) {
  fillTable("sites", sites.map((s) => {
    const cap = s.capacity || {};
    return el("tr", {"data-name": s.name},
      el("td", {}, s.name), el("td", {class: health(s)}, health(s)),
      el("td", {}, ago(pick(s, "lastSeenS", "last_seen_s"))),
      el("td", {}, `${num(pick(cap, "cpu") ?? s.cpu, 0)} cpu, ${num(pick(cap, "gpu") ?? s.gpu, 0)} gpu`),
      el("td", {}, siteLoad(s) === null ? "-" : `${(100 * siteLoad(s)).toFixed(0)} %`));
  }));
}

async function placementOf(w) {
  const inline = pick(w, "placement");
  if (inline && typeof inline === "object") return inline;
  const pid = pick(w, "status.placementId", "placementId", "placement_id");
  if (!pid) return null;
  if (!placementCache.has(pid) || ["pending", "placed"].includes(phaseOf(w))) {
    try { placementCache.set(pid, await api(`/v1/placements/${encodeURIComponent(pid)}`)); }
    catch (e) { return null; }
  }
  return placementCache.get(pid);
}

function placementId(w, p) {
  return pick(w, "status.placementId", "placementId", "placement_id", "placement.id") || (p && p.id) || null;
}

function describeAssignments(p) {
  const as = (p && (p.assignments || pick(p, "placement.assignments"))) || [];
  return as.map((a) => `${a.cluster}/${a.pool}${a.pricing && a.pricing !== "on-demand" ? " (" + a.pricing + ")" : ""}`).join(", ");
}

async function renderWorkloads(workloads) {
  const rows = [];
  let costTotal = 0;
  const placements = await Promise.all(workloads.map(placementOf));
  const requested = new Map();
  for (const [i, w] of workloads.entries()) {
    const p = placements[i];
    if (p && ["running", "placed"].includes(phaseOf(w))) {
      const cpu = Number(pick(w, "spec.resources.cpu") || 0);
      for (const a of p.assignments || []) {
        requested.set(a.cluster, (requested.get(a.cluster) || 0) + cpu * Number(a.replicas || 0));
      }
    }
  }
  requestedCpu = requested;
  for (const [i, w] of workloads.entries()) {
    const p = placements[i];
    const cost = p ? pick(p, "costUsdPerHour", "cost_usd_per_hour") : undefined;
    const phase = phaseOf(w);
    if (cost !== undefined && ["running", "placed"].includes(phase)) costTotal += Number(cost);
    const spec = w.spec || w;
    const tr = el("tr", {"data-id": w.id, "data-name": nameOf(w), onclick: () => showExplain(w, p)},
      el("td", {}, String(w.id).slice(0, 12)), el("td", {}, nameOf(w)),
      el("td", {}, spec.kind || ""), el("td", {class: phase}, phase),
      el("td", {}, describeAssignments(p) || "-"),
      el("td", {}, p ? String(pick(p, "placed_replicas") ?? (p.assignments || []).reduce((n, a) => n + a.replicas, 0)) : String(spec.replicas ?? "")),
      el("td", {}, num(cost, 3)), el("td", {}, num(pick(p || {}, "rttMs", "rtt_ms"), 1)));
    if (selectedWorkload === w.id) tr.classList.add("selected");
    rows.push(tr);
  }
  fillTable("workloads", rows);
  return costTotal;
}

// ------------------------------------------------------------------ explanation
function renderValue(v) {
  if (v === null || v === undefined) return el("span", {class: "muted"}, "-");
  if (Array.isArray(v)) {
    if (v.every((x) => typeof x !== "object" || x === null)) return el("span", {}, v.join(", "));
    return el("ul", {}, v.map((x) => el("li", {}, renderValue(x))));
  }
  if (typeof v === "object") {
    return el("dl", {}, Object.entries(v).flatMap(([k, x]) => [el("dt", {}, k), el("dd", {}, renderValue(x))]));
  }
  if (typeof v === "number") return el("span", {}, Number.isInteger(v) ? String(v) : v.toFixed(4));
  return el("span", {}, String(v));
}

const EXPLAIN_ORDER = ["chosen", "cost_breakdown", "breakdown", "runner_up", "binding_constraints",
                       "binding", "duals", "infeasible", "policy", "solver"];

function table(headers, rows) {
  return el("table", {class: "mini"}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))));
}

/* The decision record of broker/placement/explain.py, laid out for people:
   chosen options with their cost breakdown, the runner-up and what kept it out,
   binding constraints with their shadow prices, why other options were ruled out. */
function renderDecision(rec) {
  const parts = [];
  const chosen = Array.isArray(rec.chosen) ? rec.chosen : [];
  if (chosen.length) {
    const kinds = [...new Set(chosen.flatMap((c) => Object.keys(c.cost_usd || {})))].filter((k) => k !== "total");
    parts.push(el("h3", {}, "chosen · cost breakdown (USD over the run)"),
      table(["option", "pricing", "replicas", "USD/h", ...kinds, "total"], chosen.map((c) =>
        [c.option || `${c.cluster}/${c.pool}`, c.pricing || "", String(c.replicas ?? ""), num(c.usd_per_hour, 3),
         ...kinds.map((k) => num((c.cost_usd || {})[k])), num((c.cost_usd || {}).total)])));
  }
  const ru = rec.runner_up;
  if (ru && typeof ru === "object") {
    parts.push(el("h3", {}, "runner-up"), el("p", {},
      `${ru.option || "-"}: ${num((ru.cost_usd || {}).total)} USD, difference ${num(ru.difference_usd)} USD` +
      (ru.kept_out_by ? `, kept out by ${ru.kept_out_by}` : "")));
  }
  if (Array.isArray(rec.binding) && rec.binding.length) {
    parts.push(el("h3", {}, "binding constraints"), table(["family", "row", "shadow price USD"],
      rec.binding.map((b) => [b.family || "", b.row || "", num(b.shadow_price_usd ?? b.marginal_replica_usd, 4)])));
  }
  if (rec.infeasible && typeof rec.infeasible === "object" && Object.keys(rec.infeasible).length) {
    parts.push(el("h3", {}, "options ruled out, by constraint family"),
      el("p", {}, Object.entries(rec.infeasible).map(([k, v]) => `${k}: ${v}`).join(" · ")));
  }
  const solver = rec.solver || {};
  parts.push(el("p", {class: "muted"}, `policy ${rec.policy || "?"} · objective ${num(rec.objective_usd)} USD · ` +
    `${rec.candidates ?? "?"} of ${rec.options ?? "?"} options were candidates · solver ${solver.status || "?"}` +
    (solver.gap !== undefined ? `, gap ${num(solver.gap, 4)}` : "") +
    (rec.unplaced_reason ? ` · unplaced: ${rec.unplaced_reason}` : "")));
  return parts;
}

function renderExplanation(body) {
  const box = document.getElementById("explain");
  const rec = body && typeof body === "object" && body.decision ? body.decision : body;
  if (rec && Array.isArray(rec.chosen)) {
    box.replaceChildren(...renderDecision(rec),
      el("details", {}, el("summary", {}, "raw JSON"), el("pre", {}, JSON.stringify(body, null, 2))));
    return;
  }
  const keys = Object.keys(rec || {});
  keys.sort((a, b) => {
    const ia = EXPLAIN_ORDER.indexOf(a), ib = EXPLAIN_ORDER.indexOf(b);
    return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
  });
  const parts = [];
  const scalars = keys.filter((k) => typeof rec[k] !== "object" || rec[k] === null);
  if (scalars.length) parts.push(renderValue(Object.fromEntries(scalars.map((k) => [k, rec[k]]))));
  for (const k of keys.filter((x) => !scalars.includes(x))) {
    parts.push(el("h3", {}, k.replaceAll("_", " ")), renderValue(rec[k]));
  }
  parts.push(el("details", {}, el("summary", {}, "raw JSON"), el("pre", {}, JSON.stringify(body, null, 2))));
  box.replaceChildren(...parts);
}

async function showExplain(w, p) {
  selectedWorkload = w.id;
  const section = document.getElementById("explain-section");
  section.hidden = false;
  const pid = placementId(w, p);
  document.getElementById("explain-title").textContent = `${nameOf(w) || w.id}` + (pid ? ` · placement ${pid}` : "");
  const box = document.getElementById("explain");
  if (!pid) {
    box.replaceChildren(el("p", {class: "muted"}, `workload ${w.id} is ${phaseOf(w) || "pending"}: no placement yet`));
    return;
  }
  box.replaceChildren(el("p", {class: "muted"}, "loading…"));
  try {
    renderExplanation(await api(`/v1/placements/${encodeURIComponent(pid)}/explain`));
  } catch (e) {
    if (e instanceof ApiError && e.status === 404 && p && p.decision) renderExplanation(p.decision);
    else box.replaceChildren(el("p", {class: "failed"}, String(e.message)));
  }
}

// ------------------------------------------------------------------ time series
function parseMetric(text, name) {
  let total = null;
  for (const line of String(text).split("\n")) {
    if (line.startsWith(name + "{") || line.startsWith(name + " ")) {
      const v = Number(line.trim().split(/\s+/).pop());
      if (!Number.isNaN(v)) total = (total || 0) + v;
    }
  }
  return total;
}

function recordPoint(cost, util) {
  const hist = JSON.parse(sessionStorage.getItem(HISTORY_KEY) || "[]");
  hist.push({t: Date.now() / 1000, cost, util});
  while (hist.length > 240) hist.shift();
  sessionStorage.setItem(HISTORY_KEY, JSON.stringify(hist));
  return hist;
}

function drawChart(hist, source) {
  const chart = document.getElementById("chart");
  chart.replaceChildren();
  if (hist.length < 2) return;
  const t0 = hist[0].t, t1 = hist[hist.length - 1].t || t0 + 1;
  const maxCost = Math.max(1e-6, ...hist.map((h) => h.cost || 0));
  const x = (t) => 400 * (t - t0) / Math.max(1e-6, t1 - t0);
  const line = (key, scale, cls) => svg("polyline", {class: cls,
    points: hist.filter((h) => h[key] !== null).map((h) => `${x(h.t).toFixed(1)},${(135 - 125 * (h[key] / scale)).toFixed(1)}`).join(" ")});
  chart.append(line("cost", maxCost, "cost"), line("util", 1, "util"));
  const last = hist[hist.length - 1];
  document.getElementById("chart-note").textContent =
    `cost (orange) now ${num(last.cost, 3)} USD/h, peak ${num(maxCost, 3)}; ` +
    `utilisation (blue) ${last.util === null ? "-" : (100 * last.util).toFixed(0) + " %"}; ` +
    `since this page opened (${source}).`;
}

// ------------------------------------------------------------------ events
async function renderEvents() {
  const res = await optional("/v1/events?limit=500");
  const log = document.getElementById("failovers");
  if (!res.ok) {
    log.replaceChildren(el("li", {class: "muted"}, res.missing
      ? "the API has no GET /v1/events: the failover log needs it"
      : `events: ${res.error.message}`));
    return [];
  }
  const events = listOf(res.body);
  const edge = events.filter((e) => /^(edge|site|failover|route)/.test(e.kind || "") || /failover/.test(e.kind || ""));
  log.replaceChildren(...(edge.length ? edge.slice(-50).reverse().map((e) =>
    el("li", {"data-kind": e.kind}, `${new Date(1000 * e.ts).toISOString().slice(11, 19)} ${e.kind} ${e.subject} `,
      el("span", {class: "muted"}, Object.entries(e.data || {}).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" "))))
    : [el("li", {class: "muted"}, "no edge events yet")]));
  return events;
}

async function renderProviders(events) {
  const note = document.getElementById("providers-note");
  let accounts = [];
  for (const path of ["/v1/providers", "/v1/providers/accounts", "/v1/accounts"]) {
    const res = await optional(path);
    if (res.ok) { accounts = listOf(res.body); break; }
  }
  const syncEvents = events.filter((e) => /^(provider|quota|price|sync)/.test(e.kind || ""));
  if (!accounts.length && syncEvents.length) {
    const byAccount = new Map();
    for (const e of syncEvents) byAccount.set(e.subject, {name: e.subject, provider: (e.data || {}).provider,
      stale: /stale/.test(e.kind), last_ok_s: /fail|stale/.test(e.kind) ? undefined : e.ts,
      failures: (e.data || {}).failures, last_error: (e.data || {}).error});
    accounts = [...byAccount.values()];
  }
  fillTable("providers", accounts.map((a) => el("tr", {},
    el("td", {}, a.name || a.account || ""), el("td", {}, a.provider || ""),
    el("td", {class: a.stale ? "stale" : "ok"}, a.stale ? "stale" : "fresh"),
    el("td", {}, ago(pick(a, "lastOkS", "last_ok_s"))), el("td", {}, String(a.failures ?? "-")),
    el("td", {}, pick(a, "lastError", "last_error") || ""))));
  note.textContent = accounts.length ? "" :
    "no provider accounts reported (the API exposes no account list, or none is configured)";
}

// ------------------------------------------------------------------ main loop
let refreshing = false;  // one refresh at a time: a slow broker must not pile requests up

async function refresh() {
  if (!localStorage.getItem(TOKEN_KEY)) { setStatus("enter an API token", "warn"); return; }
  if (refreshing) return;
  refreshing = true;
  try {
    const [clusters, sites, workloads] = await Promise.all([
      api("/v1/clusters").then(listOf), optional("/v1/sites").then((r) => r.ok ? listOf(r.body) : []),
      api("/v1/workloads?limit=500").then(listOf)]);
    let cost = await renderWorkloads(workloads);  // first: it also works out the load
    drawMap(clusters, sites);
    renderClusters(clusters);
    renderSites(sites);
    let source = "sum of placement costs";
    const metrics = await optional("/metrics");
    if (metrics.ok) {
      const burn = parseMetric(metrics.body, "skyfed_burn_rate_usd_per_hour");
      if (burn !== null) { cost = burn; source = "skyfed_burn_rate_usd_per_hour"; }
    }
    const loads = clusters.map(clusterLoad).filter((x) => x !== null);
    const util = loads.length ? loads.reduce((a, b) => a + b, 0) / loads.length : null;
    drawChart(recordPoint(cost, util), source);
    const events = await renderEvents();
    await renderProviders(events);
    setStatus(`updated ${new Date().toLocaleTimeString()} · ${workloads.length} workloads`, "ok");
  } catch (e) {
    setStatus(e instanceof ApiError && e.status === 401 ? "token refused (401)" : String(e.message), "failed");
  } finally {
    refreshing = false;
  }
}

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
  document.getElementById("token").value = "";
  refresh();
});
document.getElementById("explain-close").addEventListener("click", () => {
  document.getElementById("explain-section").hidden = true;
  selectedWorkload = null;
});
drawMap([], []);
refresh();
setInterval(refresh, REFRESH_MS);
