// Dilu's dashboard: polls GET /v1/dashboard every second and redraws. Every piece of data is
// written as text (textContent, SVG attributes), never as markup, so logs and error messages
// cannot inject anything into the page.
"use strict";

const POLL_MS = 1000;
const LOG_POLL_MS = 3000;
const ERROR_SHOWN = 240;     // characters of a failed function's reason in its row (all of it on hover)
const PALETTE = ["#3366cc", "#dc7b2b", "#2a9d5c", "#9b4fb8", "#c0392b", "#17a2b8", "#8a6d3b", "#e0559a"];
const SVG = "http://www.w3.org/2000/svg";
const colours = new Map();
let lastLogsAt = 0;

function colourOf(name) {
  if (!colours.has(name)) colours.set(name, PALETTE[colours.size % PALETTE.length]);
  return colours.get(name);
}

function key() { return sessionStorage.getItem("dilu-key") || ""; }

async function api(path) {
  const headers = key() ? { Authorization: "Bearer " + key() } : {};
  const reply = await fetch(path, { headers });
  let body = null;
  try { body = await reply.json(); } catch (_) { /* not JSON */ }
  return { status: reply.status, body };
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    // Styles through the CSSOM: the page's CSP forbids inline style attributes.
    if (name === "style") Object.assign(node.style, value);
    else if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

// One time convention with the CLI and the API: UTC, 24 hours.
function utcTime(value) { return new Date(value).toISOString().slice(11, 19) + " UTC"; }

function fmt(value, digits = 2) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
function short(text, most) { return text.length <= most ? text : text.slice(0, most - 1) + "…"; }
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function renderFunctions(functions) {
  const body = document.querySelector("#functions tbody");
  body.replaceChildren(...functions.map(f => {
    const p = f.profile;
    const profile = !p ? "–" : p.status !== "done" ? p.status :
      `slice ${fmt(p.sm_request)}/${fmt(p.sm_limit)}, batch ${p.batch}, ${fmt(p.throughput_per_s, 1)}/s`;
    const over = f.p99_ms !== null && f.slo_p99_ms && f.p99_ms > f.slo_p99_ms;
    const p99 = el("td", { class: "num p99" + (over ? " over" : "") }, `${fmt(f.p99_ms, 1)} / ${fmt(f.slo_p99_ms, 0)} ms`);
    const s = f.streams;
    const streams = el("td", { class: "num streams" }, !s ? "–" :
      `${fmt(s.first_chunk_p50_ms, 1)} / ${fmt(s.chunk_gap_p50_ms, 1)} ms`);
    const status = el("td", {}, el("span", { class: "status " + f.status, title: f.error || "" }, f.status));
    // Why it failed, in its own row: the reason must not need a trip to the decisions list.
    if (f.error) status.append(el("div", { class: "error reason", title: f.error }, short(f.error, ERROR_SHOWN)));
    return el("tr", { "data-function": f.name },
      el("td", {}, el("strong", {}, f.name), f.inference_protocol ? el("span", { class: "muted" }, " · v2") : ""),
      status, el("td", { class: "num" }, f.version),
      el("td", { class: "num instances" }, `${f.ready} ready` + (f.starting ? `, ${f.starting} starting` : "")
        + (f.queued ? `, ${f.queued} queued` : "")),
      el("td", { class: "num rate" }, fmt(f.rate_per_s, 1)), p99, streams, el("td", {}, profile),
      el("td", { class: "num requests" }, f.requests_total));
  }));
  const select = document.getElementById("log-function");
  const names = functions.map(f => f.name);
  const current = select.value;
  if (names.join() !== Array.from(select.options).map(o => o.value).join()) {
    select.replaceChildren(...names.map(n => el("option", { value: n }, n)));
    if (names.includes(current)) select.value = current;
  }
}

function chart(history) {
  const width = 560, height = 180, left = 34, right = 8, top = 8, bottom = 20;
  const root = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none" });
  const y = share => top + (1 - share) * (height - top - bottom);
  for (const share of [0, 0.25, 0.5, 0.75, 1]) {
    root.append(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(share), y2: y(share) }));
    const label = svg("text", { class: "axis", x: 2, y: y(share) + 3 });
    label.textContent = share.toFixed(2);
    root.append(label);
  }
  const times = history.t;
  if (times.length < 2) {
    const wait = svg("text", { class: "axis", x: left + 8, y: height / 2 });
    wait.textContent = "collecting samples…";
    root.append(wait);
    return root;
  }
  const t0 = times[0], span = Math.max(times[times.length - 1] - t0, 1);
  const x = t => left + (t - t0) / span * (width - left - right);
  const ago = svg("text", { class: "axis", x: left, y: height - 4 });
  ago.textContent = `${Math.round(span)} s ago`;
  const now = svg("text", { class: "axis", x: width - right - 20, y: height - 4 });
  now.textContent = "now";
  root.append(ago, now);
  for (const line of history.series) {
    for (const [values, dash] of [[line.granted, null], [line.used, "4 3"]]) {
      let d = "", pen = "M";
      values.forEach((v, i) => {
        if (v === null) { pen = "M"; return; }
        d += `${pen}${x(times[i]).toFixed(1)},${y(Math.min(v, 1)).toFixed(1)} `;
        pen = "L";
      });
      if (!d) continue;
      const path = svg("path", { d, fill: "none", stroke: colourOf(line.function), "stroke-width": dash ? 1.5 : 2.5 });
      if (dash) path.setAttribute("stroke-dasharray", dash);
      path.setAttribute("data-series", `${line.instance}:${dash ? "used" : "granted"}`);
      root.append(path);
    }
  }
  return root;
}

function renderDevices(devices) {
  const box = document.getElementById("devices");
  box.replaceChildren(...devices.map(d => {
    const serving = d.instances;
    const card = el("div", { class: "device", "data-worker": d.worker },
      el("h3", {}, `${d.name} `, el("span", { class: "muted" }, `${d.worker} · ${d.kind} · ${d.state}`)));
    if (d.kind === "gpu") {
      card.append(chart(d.history));
    } else {
      card.append(el("p", { class: "muted" }, "CPU device: a compute slice is a CPU quota (no token manager)."));
    }
    const legend = el("div", { class: "legend" });
    const used = serving.reduce((sum, i) => sum + (i.memory_bytes || 0), 0);
    const memory = el("div", { class: "memory", title: `${bytes(used)} of ${bytes(d.memory_bytes)} in slices` });
    const rows = serving.map(i => {
      const colour = colourOf(i.function);
      legend.append(el("span", { "data-instance": i.id },
        el("span", { class: "swatch", style: { background: colour } }), `${i.function} `,
        el("span", { class: "muted" }, `granted ${fmt(i.granted)} · used ${fmt(i.used)}`)));
      memory.append(el("div", { style: { width: `${(100 * i.memory_bytes / d.memory_bytes).toFixed(2)}%`, background: colour },
        title: `${i.function}: ${bytes(i.memory_bytes)}` }));
      return el("tr", { "data-instance": i.id, "data-granted": i.granted ?? "" },
        el("td", {}, i.id), el("td", {}, i.function + (i.role === "profile" ? " (profiling)" : "")), el("td", {}, i.state),
        el("td", { class: "num" }, i.sm_limit === null ? "–" : `${fmt(i.sm_request)}/${fmt(i.sm_limit)}`),
        el("td", { class: "num granted" }, fmt(i.granted)), el("td", { class: "num" }, fmt(i.used)),
        el("td", { class: "num" }, bytes(i.memory_bytes)));
    });
    card.append(legend, el("div", { class: "muted" }, `memory slices: ${bytes(used)} of ${bytes(d.memory_bytes)}`), memory);
    const table = el("table", {}, el("thead", {}, el("tr", {}, ...["instance", "function", "state", "slice",
      "granted", "used", "memory"].map(h => el("th", {}, h)))), el("tbody", {}, ...rows));
    card.append(rows.length ? table : el("p", { class: "muted" }, "no instances"));
    return card;
  }));
}

function renderEvents(events) {
  document.querySelector("#events tbody").replaceChildren(...events.map(e => el("tr", {},
    el("td", { class: "num" }, utcTime(e.at)), el("td", {}, e.function),
    el("td", {}, e.action), el("td", {}, e.reason))));
}

async function refreshLogs() {
  const name = document.getElementById("log-function").value;
  const out = document.getElementById("logs");
  if (!name) return;
  const reply = await api(`/v1/functions/${encodeURIComponent(name)}/logs?tail=60&instances=2`);
  if (reply.status !== 200) {
    out.textContent = (reply.body && reply.body.error) || `logs unavailable (${reply.status})`;
    return;
  }
  out.textContent = reply.body.instances.map(i => `== ${i.instance} (${i.state})${i.error ? ": " + i.error : ""}\n${i.log}`)
    .join("\n") || "no instances yet";
}

// A function name's own characters only (the API refuses others): what is typed is a name's part.
function filterText() {
  return document.getElementById("function-filter").value.toLowerCase().replace(/[^a-z0-9_-]/g, "").slice(0, 63);
}

function renderShown(shown, total, filter) {
  const what = filter ? `functions whose name holds "${filter}"` : "functions";
  document.getElementById("functions-shown").textContent = shown < total
    ? `showing ${shown} of ${total} ${what}: those with instances or requests first, then those not ready; `
      + "filter by name to find the others"
    : `${total} ${what}`;
}

async function poll() {
  try {
    const filter = filterText();
    const reply = await api("/v1/dashboard" + (filter ? `?match=${encodeURIComponent(filter)}` : ""));
    if (reply.status === 401 || reply.status === 403) {
      document.getElementById("key-form").hidden = false;
      document.getElementById("key-error").textContent = reply.body ? reply.body.error : "";
      document.getElementById("summary").textContent = "waiting for an API key";
      return;
    }
    if (reply.status !== 200) throw new Error(`status ${reply.status}`);
    const data = reply.body;
    document.getElementById("key-form").hidden = true;
    document.getElementById("summary").textContent =
      `${data.devices.length} devices · ${filter ? "" : data.functions_total + " functions · "}${data.instances} instances`;
    document.getElementById("updated").textContent = "updated " + utcTime(data.at * 1000);
    renderFunctions(data.functions);
    renderShown(data.functions.length, data.functions_total, filter);
    renderDevices(data.devices);
    renderEvents(data.events);
    if (Date.now() - lastLogsAt > LOG_POLL_MS) {
      lastLogsAt = Date.now();
      await refreshLogs();
    }
    document.body.dataset.loaded = "true";
  } catch (error) {
    document.getElementById("updated").textContent = `the gateway does not answer (${error.message}); retrying`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.getElementById("key-form").addEventListener("submit", event => {
  event.preventDefault();
  sessionStorage.setItem("dilu-key", document.getElementById("key").value.trim());
});
document.getElementById("log-function").addEventListener("change", () => { lastLogsAt = Date.now(); refreshLogs(); });
poll();
