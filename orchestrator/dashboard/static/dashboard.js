// sparkctl dashboard: polls /api/state (the latest look, held by the dashboard in memory; the
// nodes are asked once per interval whatever the number of pages) and lays it out. It judges
// nothing itself: states, problems and the box guard's flags come from sparkctl's status.
"use strict";

const POLL_MS = 500;
const FLAG_TEXT = {
  "stuck-clock": "GPU CLOCK STUCK",
  "hot": "GPU HOT",
  "thermal-throttle": "THERMAL THROTTLE",
  "power-throttle": "POWER THROTTLE",
};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

function num(value, digits) {
  return value === null || value === undefined ? "?" : Number(value).toFixed(digits);
}

function clockCell(node) {
  if (node.sm_clock_mhz === null) return "not reported";
  const cell = el("span", {}, `${num(node.sm_clock_mhz, 0)} of ${num(node.max_sm_clock_mhz, 0)} MHz`);
  if (node.max_sm_clock_mhz) {
    const share = Math.min(1, node.sm_clock_mhz / node.max_sm_clock_mhz);
    const fill = el("span");
    fill.style.width = `${Math.round(share * 100)}%`;
    cell.append(el("span", {class: share < 0.5 ? "bar low" : "bar"}, fill));
  }
  return cell;
}

function nodeCard(node) {
  const flagged = node.gpu_problems.length > 0;
  const card = el("div", {class: flagged ? "card flagged" : "card", id: `node-${node.name}`,
                          "data-state": node.state});
  card.append(el("h3", {}, `${node.name} `, el("span", {class: stateClass(node.state)}, node.state),
                 ` ${node.role}`));
  for (const kind of node.gpu_problems) {
    card.append(el("span", {class: "flag", "data-flag": kind}, FLAG_TEXT[kind] || kind));
  }
  if (!node.reachable) {
    card.append(el("ul", {class: "problems"}, ...node.problems.map((p) => el("li", {}, p))));
    return card;
  }
  const rows = [
    ["memory", `${num(node.available_gb, 1)} of ${num(node.total_gb, 1)} GB available`],
    ["memory guard", `stops the server below ${num(node.guard_min_available_gb, 1)} GB`],
    ["GPU", node.gpu_utilization_pct === null ? "utilisation not reported"
      : `${num(node.gpu_utilization_pct, 0)} % busy`],
    ["SM clock", clockCell(node)],
    ["temperature", node.temperature_c === null ? "not reported" : `${num(node.temperature_c, 0)} °C`],
    ["power", node.power_w === null ? "not reported" : `${num(node.power_w, 1)} W`],
    ["model cache", node.model_cache_free_gb === null ? "free space unknown"
      : `${num(node.model_cache_free_gb, 1)} GB free`],
    ["container", node.container || "none"],
  ];
  for (const link of node.links) {
    const speed = link.speed_mbps ? `${link.speed_mbps / 1000} Gb/s, ` : "";
    rows.push([link.interface, `${link.state}, ${speed}MTU ${link.mtu}, ${link.addresses.join(", ") || "no address"}`
      + (link.ok ? "" : " (!)")]);
  }
  const list = el("dl");
  for (const [term, value] of rows) {
    list.append(el("dt", {}, term), el("dd", {"data-field": term}, value));
  }
  card.append(list);
  if (node.problems.length) {
    card.append(el("ul", {class: "problems"}, ...node.problems.map((p) => el("li", {}, p))));
  }
  return card;
}

function stateClass(state) {
  if (["up", "serving", "healthy"].includes(state)) return "badge good";
  if (["problem", "unreachable", "degraded", "down", "unhealthy", "stalled", "dead"].includes(state)) {
    return "badge bad";
  }
  return "badge";
}

function percent(value) {
  return value === undefined ? "" : `${Math.round(value * 100)} %`;
}

function rate(value) {
  return value === undefined ? "" : num(value, 1);
}

function latency(p50, p95) {
  return p50 === undefined ? "" : `${num(p50 * 1000, 0)} / ${num(p95 * 1000, 0)} ms`;
}

function serverRow(server) {
  const f = server.figures;
  const acceptance = f.spec_acceptance_length > 1 ? `${num(f.spec_acceptance_length, 2)} tokens/step`
    : f.spec_acceptance_rate ? percent(f.spec_acceptance_rate) : "";
  const state = el("td", {class: server.state === "healthy" ? "healthy" : "bad"}, server.state);
  return el("tr", {id: `server-${server.name}`},
    el("td", {}, server.name), el("td", {}, server.engine),
    el("td", {}, server.model + (server.recipe && server.recipe !== server.name ? ` (${server.recipe})` : "")),
    el("td", {}, server.nodes.join(", ") + (server.ranks ? ` (${server.ranks} rank${server.ranks > 1 ? "s" : ""})` : "")),
    el("td", {}, server.endpoint), state,
    el("td", {}, f.requests_running ?? ""), el("td", {}, f.requests_waiting ?? ""),
    el("td", {}, percent(f.kv_cache_usage)), el("td", {}, rate(f.decode_tokens_per_s)),
    el("td", {}, rate(f.prefill_tokens_per_s)), el("td", {}, latency(f.ttft_p50_s, f.ttft_p95_s)),
    el("td", {}, latency(f.itl_p50_s, f.itl_p95_s)), el("td", {}, acceptance || server.metrics_note));
}

function gatewayView(gateway) {
  if (!gateway.running) return "not running";
  const models = Object.entries(gateway.models).map(
    ([model, c]) => `${model}: ${c.in_rotation} of ${c.replicas} replica(s) in rotation`);
  return `${gateway.endpoint} on ${gateway.node}, key ${gateway.key ? "on" : "off"}, `
    + `${gateway.live ? "live" : "NOT ANSWERING"}` + (models.length ? `; ${models.join("; ")}` : "");
}

function chart(id, title, unit, history, key) {
  if (typeof Plotly === "undefined" || !history.length) return;
  const names = Object.keys(history[history.length - 1][key]);
  const traces = names.map((name) => ({
    name, mode: "lines", type: "scatter",
    x: history.map((p) => new Date(p.taken_at * 1000)),
    y: history.map((p) => p[key][name] ?? null),
  }));
  Plotly.react(id, traces, {
    title: {text: title, font: {size: 14}}, margin: {l: 50, r: 10, t: 35, b: 35},
    xaxis: {tickformat: "%H:%M:%S"}, yaxis: {title: {text: unit}, rangemode: "tozero"},
    legend: {orientation: "h", y: -0.2},
  }, {displayModeBar: false, responsive: true});
}

function render(view) {
  document.getElementById("cluster").textContent = view.cluster;
  const state = document.getElementById("state");
  state.textContent = view.state;
  state.className = stateClass(view.state);
  const when = view.taken_at ? new Date(view.taken_at * 1000).toLocaleTimeString() : "not yet";
  document.getElementById("updated").textContent = `last look ${when}`
    + (view.look_seconds !== null ? ` (took ${num(view.look_seconds, 1)} s)` : "")
    + `, every ${view.interval} s`;
  const error = document.getElementById("error");
  error.hidden = !view.error;
  error.textContent = view.error ? `could not look: ${view.error}` : "";
  document.getElementById("nodes").replaceChildren(...view.nodes.map(nodeCard));
  document.querySelector("#servers tbody").replaceChildren(...view.servers.map(serverRow));
  document.getElementById("no-servers").hidden = view.servers.length > 0;
  document.getElementById("gateway").textContent = gatewayView(view.gateway);
  document.getElementById("netcheck-saved").textContent = view.netcheck.saved
    ? `sparkctl netcheck of ${view.netcheck.saved} measured:`
    : "no `sparkctl netcheck` of this cluster on this machine yet";
  document.querySelector("#netcheck tbody").replaceChildren(...view.netcheck.figures.map((f) => el(
    "tr", {}, el("td", {}, f.check), el("td", {}, f.node), el("td", {}, f.peer),
    el("td", {}, f.interface), el("td", {}, `${f.value} ${f.unit}`),
    el("td", {class: f.status === "pass" ? "healthy" : "bad"}, f.status))));
  document.getElementById("events").replaceChildren(...view.events.map((e) => el(
    "li", {class: e.level}, `${new Date(e.at * 1000).toLocaleTimeString()} ${e.subject}: ${e.text}`)));
  chart("chart-clock", "GPU SM clock", "MHz", view.history, "sm_clock_mhz");
  chart("chart-temperature", "GPU temperature", "°C", view.history, "temperature_c");
  chart("chart-memory", "Memory available", "GB", view.history, "available_gb");
}

async function poll() {
  try {
    const answer = await fetch("/api/state", {credentials: "same-origin", cache: "no-store"});
    if (answer.ok) render(await answer.json());
    else document.getElementById("updated").textContent = `the dashboard answered ${answer.status}`;
  } catch (err) {
    document.getElementById("updated").textContent = `the dashboard does not answer: ${err}`;
  }
  setTimeout(poll, POLL_MS);
}

poll();
