// The live dashboard: polls /dashboard/data every POLL_MS and redraws tables and an SVG chart.
// Plain DOM and textContent only (no innerHTML with data), no libraries, nothing fetched elsewhere.
"use strict";

const POLL_MS = 1500;
const KEY_STORAGE = "gateway-dashboard-key";
const COLORS = ["#2563eb", "#d9480f", "#2f9e44", "#9c36b5", "#e8590c", "#0c8599", "#c2255c", "#5c940d"];
const SVG_NS = "http://www.w3.org/2000/svg";
const DATA_URL = location.pathname.replace(/\/?$/, "/") + "data";

function usd(value) {
  if (value === null || value === undefined) return "–";
  const abs = Math.abs(value);
  if (abs >= 1) return "$" + value.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  return "$" + value.toFixed(6);
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  return value >= 1 ? value.toFixed(2) + " s" : Math.round(value * 1000) + " ms";
}

function number(value, digits) {
  return value === null || value === undefined ? "–" : value.toFixed(digits);
}

function clock(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function usdCell(row, value) {
  const td = cell(row, usd(value), "num");
  td.dataset.usd = String(value ?? "");
  return td;
}

function bar(row, use) {
  const td = document.createElement("td");
  row.appendChild(td);
  if (!use) { td.textContent = "–"; return td; }
  const share = use.limit_usd > 0 ? (use.spent_usd + use.reserved_usd) / use.limit_usd : 1;
  const outer = document.createElement("span");
  outer.className = "bar" + (share >= 1 ? " over" : share >= 0.8 ? " warn" : "");
  const inner = document.createElement("span");
  inner.style.width = Math.min(100, share * 100).toFixed(1) + "%";
  outer.appendChild(inner);
  const label = document.createElement("span");
  label.className = "bar-label";
  label.textContent = usd(use.spent_usd) + " of " + usd(use.limit_usd);
  td.append(outer, label);
  return td;
}

function fillTable(id, items, build) {
  const body = document.querySelector("#" + id + " tbody");
  const rows = items.map((item) => { const tr = document.createElement("tr"); build(tr, item); return tr; });
  body.replaceChildren(...rows);
}

function renderRoutes(data) {
  const budgets = {};
  for (const use of data.budgets) {
    if (use.scope === "route") budgets[use.name + "/" + use.period] = use;
  }
  fillTable("routes", data.routes, (tr, route) => {
    tr.dataset.route = route.route;
    cell(tr, route.route);
    usdCell(tr, route.today_usd).classList.add("today");
    cell(tr, String(route.today_requests), "num");
    cell(tr, String(route.errors_today), "num errors" + (route.errors_today ? " bad" : ""));
    cell(tr, String(route.fallbacks_today), "num fallbacks");
    usdCell(tr, route.last_hour_usd).classList.add("last-hour");
    bar(tr, budgets[route.route + "/day"]);
    bar(tr, budgets[route.route + "/month"]);
  });
}

function renderPools(data) {
  document.getElementById("no-pools").hidden = data.pools.length > 0;
  fillTable("pools", data.pools, (tr, pool) => {
    tr.dataset.pool = pool.backend;
    cell(tr, pool.backend);
    cell(tr, "$" + pool.usd_per_hour.toFixed(2), "num");
    cell(tr, pool.hours.toFixed(2), "num");
    usdCell(tr, pool.attributed_usd).classList.add("charged");
    usdCell(tr, pool.idle_usd).classList.add("idle");
    usdCell(tr, pool.pool_usd).classList.add("pool-total");
    const td = document.createElement("td");
    const split = document.createElement("span");
    split.className = "split";
    const total = pool.pool_usd > 0 ? pool.pool_usd : 1;
    for (const [cls, value] of [["charged", pool.attributed_usd], ["idle", pool.idle_usd]]) {
      const part = document.createElement("span");
      part.className = cls;
      part.style.width = Math.min(100, (value / total) * 100).toFixed(1) + "%";
      split.appendChild(part);
    }
    td.appendChild(split);
    tr.appendChild(td);
  });
}

function renderRefused(data) {
  document.getElementById("no-refused").hidden = data.refused.length > 0;
  fillTable("refused", data.refused, (tr, r) => {
    tr.dataset.reason = r.reason;
    cell(tr, r.reason);
    cell(tr, String(r.requests), "num requests");
  });
}

function renderCapacity(data) {
  fillTable("capacity", data.capacity || [], (tr, pool) => {
    tr.dataset.pool = pool.pool;
    cell(tr, pool.pool);
    if (pool.idle_usd_per_hour === null) cell(tr, "-", "num idle-now");
    else usdCell(tr, pool.idle_usd_per_hour).classList.add("idle-now");
    cell(tr, pool.replicas_today === null ? "-" : String(pool.replicas_today), "num");
    cell(tr, pool.desired_replicas === null ? "not scaled" : String(pool.desired_replicas), "num desired");
    cell(tr, pool.boot_s === null ? "-" : Math.round(pool.boot_s / 60) + " min", "num");
  });
}

function renderReplicas(data) {
  document.getElementById("replicas-section").hidden = data.replicas.length === 0;
  fillTable("replicas", data.replicas, (tr, r) => {
    tr.dataset.replica = r.replica ?? "";
    cell(tr, r.replica ?? "(unnamed)");
    usdCell(tr, r.today_usd);
    cell(tr, String(r.today_requests), "num");
    cell(tr, String(r.errors), "num");
  });
}

function renderBackends(data) {
  fillTable("backends", data.backends, (tr, b) => {
    tr.dataset.backend = b.backend;
    cell(tr, b.backend);
    cell(tr, b.pricing);
    cell(tr, b.usd_per_mtok_out === null ? "–" : "$" + b.usd_per_mtok_out.toFixed(2), "num");
    cell(tr, seconds(b.ttft_p95_s), "num");
    cell(tr, seconds(b.first_answer_p95_s), "num");
    cell(tr, number(b.decode_tokens_per_s, 1), "num");
    cell(tr, number(b.aggregate_tokens_per_s, 1), "num");
    cell(tr, String(b.inflight), "num");
    cell(tr, b.healthy ? b.circuit : b.circuit + " (unhealthy)");
  });
}

function renderBudgets(data) {
  document.getElementById("no-budgets").hidden = data.budgets.length > 0;
  fillTable("budgets", data.budgets, (tr, use) => {
    cell(tr, use.scope);
    cell(tr, use.name);
    cell(tr, use.period);
    usdCell(tr, use.limit_usd);
    usdCell(tr, use.spent_usd);
    usdCell(tr, use.reserved_usd);
    usdCell(tr, use.remaining_usd);
    bar(tr, use);
  });
}

function renderRecent(data) {
  // One time for sorting and showing: when each request started, newest first.
  const rows = [...data.recent].sort((a, b) => b.time - a.time);
  fillTable("recent", rows, (tr, r) => {
    if (r.status !== "ok") tr.className = "error";
    tr.dataset.time = String(r.time);
    cell(tr, clock(r.time), "mono");
    cell(tr, r.request_id, "mono");
    cell(tr, r.replica ?? "–", "mono");
    cell(tr, r.route);
    cell(tr, r.backend ?? "–");
    cell(tr, r.tried.length ? r.tried.join(" → ") : r.attempts > 1 ? r.attempts + " attempts" : "–");
    cell(tr, r.reason ?? "–");
    cell(tr, r.status);
    usdCell(tr, r.cost_usd);
    cell(tr, seconds(r.ttft_s), "num");
  });
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
  document.getElementById("recent-time").textContent = "started (" + zone + ")";
  document.getElementById("recent-note").textContent = data.ledger.shared
    ? "the whole fleet, from the shared ledger; newest start first"
    : "this replica; newest start first";
}

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  if (parent) parent.appendChild(el);
  return el;
}

const DASHES = ["", "9 5", "2 4", "12 4 3 4", "5 3", "1 3", "14 6", "6 2 2 2"];

// A step of 1, 2 or 5 times a power of ten, giving about ``count`` intervals over ``range``.
function niceStep(range, count) {
  const raw = range / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / magnitude;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * magnitude;
}

// An axis amount with just the digits its step needs: $0.0004, $0.05, $12.
function tickUsd(value, step) {
  const decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
  return "$" + value.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
}

function renderChart(data) {
  const { times, routes } = data.series;
  const holder = document.getElementById("chart");
  const width = Math.max(480, holder.clientWidth || 1000), height = 280;
  const left = 72, right = 190, top = 14, bottom = 30; // the right margin holds each line's label
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img" });
  const cumulative = {};
  let peak = 0;
  for (const name of Object.keys(routes)) {
    let total = 0;
    cumulative[name] = routes[name].map((v) => (total += v));
    peak = Math.max(peak, total);
  }
  // Largest first, so smaller lines are drawn on top of the ones they run along.
  const names = Object.keys(routes).sort((a, b) => last(cumulative[b]) - last(cumulative[a]) || a.localeCompare(b));
  const step = niceStep(peak > 0 ? peak : 1e-6, 4);
  const top_value = Math.max(step, Math.ceil((peak * 1.02) / step) * step);
  const x = (i) => left + (i / Math.max(1, times.length - 1)) * (width - left - right);
  const y = (v) => top + (1 - v / top_value) * (height - top - bottom);
  for (let value = 0; value <= top_value + step / 2; value += step) {
    svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "axis" }, root);
    svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end", class: "tick y-tick" }, root).textContent = tickUsd(value, step);
  }
  // Time labels on whole ten minutes (five when the window is short), not counted back from now.
  const span = times.length ? times[times.length - 1] - times[0] : 0;
  const every = span > 1800 ? 600 : 300;
  times.forEach((t, i) => {
    if (Math.round(t) % every !== 0) return;
    const label = new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
    svg("line", { x1: x(i), x2: x(i), y1: height - bottom, y2: height - bottom + 4, class: "axis" }, root);
    svg("text", { x: x(i), y: height - 10, "text-anchor": "middle", class: "tick x-tick" }, root).textContent = label;
  });
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  const ends = [];
  names.forEach((name) => {
    const n = Object.keys(routes).sort().indexOf(name); // a route keeps its colour and dash as totals change
    const color = COLORS[n % COLORS.length];
    const dash = DASHES[n % DASHES.length];
    const points = cumulative[name].map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg("polyline", { points, class: "halo" }, root);
    const line = svg("polyline", { points, class: "series", stroke: color }, root);
    if (dash) line.setAttribute("stroke-dasharray", dash);
    line.dataset.route = name;
    ends.push({ name, color, y: y(last(cumulative[name])) });
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = color;
    item.append(swatch, name + " " + usd(last(cumulative[name])));
    legend.appendChild(item);
  });
  // Each line's name at its end, pushed apart so that lines ending together stay legible.
  ends.sort((a, b) => a.y - b.y);
  for (let i = 1; i < ends.length; i++) ends[i].y = Math.max(ends[i].y, ends[i - 1].y + 15);
  const overflow = ends.length ? ends[ends.length - 1].y - (height - bottom) : 0;
  if (overflow > 0) ends.forEach((e) => (e.y -= overflow));
  for (const end of ends) {
    const label = svg("text", { x: width - right + 8, y: end.y + 4, fill: end.color, class: "end-label" }, root);
    label.textContent = end.name;
  }
  holder.replaceChildren(root);
}

function last(values) {
  return values.length ? values[values.length - 1] : 0;
}

function render(data) {
  renderRoutes(data);
  renderPools(data);
  renderRefused(data);
  renderCapacity(data);
  renderReplicas(data);
  renderChart(data);
  renderBackends(data);
  renderBudgets(data);
  renderRecent(data);
  document.getElementById("policy").textContent = "policy " + data.policy.digest;
  const ledger = data.ledger;
  const where = (ledger.shared ? "fleet ledger " : "ledger ") + ledger.location;
  const backlog = ledger.pending_rows ? ", " + ledger.pending_rows + " rows waiting" : "";
  const ledgerEl = document.getElementById("ledger");
  ledgerEl.textContent = where + (ledger.up ? "" : " (unreachable)") + backlog;
  ledgerEl.className = ledger.up ? "" : "status offline";
  document.getElementById("updated").textContent = "updated " + clock(data.now);
  const status = document.getElementById("status");
  const degraded = data.degraded || [];
  status.textContent = degraded.length ? "degraded: " + degraded.join("; ") : "live";
  status.className = degraded.length ? "status offline" : "status live";
  document.body.dataset.updatedAt = String(data.now);
}

function askForKey() {
  const form = document.getElementById("key-form");
  form.hidden = false;
  form.onsubmit = (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, document.getElementById("key-input").value.trim());
    form.hidden = true;
  };
}

async function poll() {
  try {
    const key = sessionStorage.getItem(KEY_STORAGE);
    const headers = key ? { authorization: "Bearer " + key } : {};
    const response = await fetch(DATA_URL, { headers, cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      askForKey();
    } else if (response.ok) {
      render(await response.json());
    } else {
      throw new Error("HTTP " + response.status);
    }
  } catch (error) {
    const status = document.getElementById("status");
    status.textContent = "offline: " + error.message;
    status.className = "status offline";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
