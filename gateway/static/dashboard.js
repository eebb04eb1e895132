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
  return new Date(unixSeconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
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
    usdCell(tr, route.last_hour_usd).classList.add("last-hour");
    bar(tr, budgets[route.route + "/day"]);
    bar(tr, budgets[route.route + "/month"]);
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
  fillTable("recent", data.recent, (tr, r) => {
    if (r.status !== "ok") tr.className = "error";
    cell(tr, clock(r.time));
    cell(tr, r.request_id, "mono");
    cell(tr, r.route);
    cell(tr, r.backend ?? "–");
    cell(tr, r.tried.join(" → ") || "–");
    cell(tr, r.reason ?? "–");
    cell(tr, r.status);
    usdCell(tr, r.cost_usd);
    cell(tr, seconds(r.ttft_s), "num");
  });
}

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  if (parent) parent.appendChild(el);
  return el;
}

function renderChart(data) {
  const { times, routes } = data.series;
  const names = Object.keys(routes).sort();
  const width = 1000, height = 260, left = 70, right = 16, top = 12, bottom = 28;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img" });
  const cumulative = {};
  let peak = 0;
  for (const name of names) {
    let total = 0;
    cumulative[name] = routes[name].map((v) => (total += v));
    peak = Math.max(peak, total);
  }
  peak = peak > 0 ? peak * 1.1 : 1e-6;
  const x = (i) => left + (i / Math.max(1, times.length - 1)) * (width - left - right);
  const y = (v) => top + (1 - v / peak) * (height - top - bottom);
  for (let k = 0; k <= 4; k++) {
    const value = (peak * k) / 4;
    svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "axis" }, root);
    svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end", class: "tick" }, root).textContent = usd(value);
  }
  const every = Math.max(1, Math.round(600 / data.series.bucket_s)); // a label every ten minutes
  for (let i = times.length - 1; i >= 0; i -= every) {
    const label = new Date(times[i] * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const anchor = i === times.length - 1 ? "end" : "middle"; // the newest label must not run off the edge
    svg("text", { x: x(i), y: height - 8, "text-anchor": anchor, class: "tick" }, root).textContent = label;
  }
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  names.forEach((name, n) => {
    const color = COLORS[n % COLORS.length];
    const points = cumulative[name].map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg("polyline", { points, fill: "none", stroke: color, "stroke-width": 2, "vector-effect": "non-scaling-stroke" }, root);
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = color;
    item.append(swatch, name + " " + usd(cumulative[name][cumulative[name].length - 1] || 0));
    legend.appendChild(item);
  });
  document.getElementById("chart").replaceChildren(root);
}

function render(data) {
  renderRoutes(data);
  renderChart(data);
  renderBackends(data);
  renderBudgets(data);
  renderRecent(data);
  document.getElementById("policy").textContent = "policy " + data.policy.digest;
  document.getElementById("updated").textContent = "updated " + clock(data.now);
  const status = document.getElementById("status");
  status.textContent = "live";
  status.className = "status live";
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
