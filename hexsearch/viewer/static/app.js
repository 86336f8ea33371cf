// hexsearch view: the core of the single page (no framework, no build step, nothing from other origins).
// Routes (location.hash):  #run/<i>?file=&stop=...  #traj/<i>?file=&n=  #group/<i>?file=&group=  #item/<i>?index=
"use strict";

const HX = { pages: {}, timer: null, stamp: null, route: null };

function h(tag, attrs, ...children) {
  const svg = ["svg", "path", "line", "rect", "text", "circle", "g", "polyline"].includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "cls") el.setAttribute("class", v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(path) {
  const res = await fetch("/api/" + path);
  let body;
  try { body = await res.json(); } catch (e) { throw new Error(`${path}: ${res.status} ${res.statusText}`); }
  if (!res.ok) throw new Error(body.error || `${path}: ${res.status}`);
  return body;
}

function qs(obj) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(obj)) if (v !== "" && v !== null && v !== undefined) p.set(k, v);
  return p.toString();
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined || x === "") return "–";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(digits);
  return String(x);
}

function short(s, n = 120) {
  s = String(s ?? "");
  return s.length <= n ? s : s.slice(0, n - 1) + "…";
}

function cards(pairs) {
  return h("div", { cls: "cards" }, pairs.filter(([, v]) => v !== undefined).map(([k, v]) =>
    h("div", { cls: "card" }, h("div", { cls: "v" }, fmt(v)), h("div", { cls: "k" }, k))));
}

function errorList(errors, title) {
  if (!errors || !errors.length) return null;
  return h("div", { cls: "errors", id: "file-errors" }, h("b", {}, title || `${errors.length} unreadable line(s) (skipped):`),
    h("ul", {}, errors.slice(0, 20).map(e => h("li", {}, `${e.file}${e.line ? ":" + e.line : ""}: ${e.error}`))));
}

function table(columns, rows, rowAttrs) {
  return h("table", {}, h("thead", {}, h("tr", {}, columns.map(c => h("th", { cls: c.num ? "num" : "" }, c.label)))),
    h("tbody", {}, rows.map(r => h("tr", rowAttrs ? rowAttrs(r) : {}, columns.map(c =>
      h("td", { cls: c.num ? "num" : "" }, c.cell ? c.cell(r) : fmt(r[c.key])))))));
}

// --- charts (inline SVG) ----------------------------------------------------------------------
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

function lineChart(title, series, opts = {}) {
  const W = opts.width || 460, H = opts.height || 200, L = 44, R = 10, T = 22, B = 26;
  const pts = series.flatMap(s => s.points);
  const box = h("div", { cls: "chart", "data-chart": title });
  const svg = h("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  svg.append(h("text", { x: L, y: 14, cls: "title" }, title));
  box.append(svg);
  if (!pts.length) { svg.append(h("text", { x: W / 2 - 30, y: H / 2 }, "no data yet")); return box; }
  let [x0, x1] = [Math.min(...pts.map(p => p[0])), Math.max(...pts.map(p => p[0]))];
  let [y0, y1] = [Math.min(...pts.map(p => p[1])), Math.max(...pts.map(p => p[1]))];
  if (opts.zero !== false) y0 = Math.min(0, y0);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + 1;
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  svg.append(h("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#9ca3af" }),
             h("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#9ca3af" }));
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4, x = x0 + (x1 - x0) * i / 4;
    svg.append(h("text", { x: 2, y: sy(y) + 3 }, fmt(+y.toPrecision(3), 2)),
               h("line", { x1: L, y1: sy(y), x2: W - R, y2: sy(y), stroke: "#f3f4f6" }),
               h("text", { x: sx(x) - 6, y: H - 8 }, fmt(Math.round(x))));
  }
  series.forEach((s, i) => {
    const c = s.color || COLORS[i % COLORS.length];
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    svg.append(h("path", { d, fill: "none", stroke: c, "stroke-width": 2 }));
    if (s.dots || s.points.length < 3) s.points.forEach(p => svg.append(h("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3, fill: c })));
    svg.append(h("rect", { x: W - R - 162, y: T + 12 * i - 3, width: 8, height: 8, fill: c }),
               h("text", { x: W - R - 150, y: T + 12 * i + 4 }, s.name));
  });
  return box;
}

function barChart(title, bars, opts = {}) {
  const W = opts.width || 300, H = 200, L = 36, B = 26, T = 34;
  const box = h("div", { cls: "chart", "data-chart": title });
  const svg = h("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  svg.append(h("text", { x: L, y: 14, cls: "title" }, title));
  box.append(svg);
  if (!bars.length) { svg.append(h("text", { x: W / 2 - 30, y: H / 2 }, "no data yet")); return box; }
  const top = Math.max(...bars.map(b => b[1])), bw = (W - L - 10) / bars.length;
  bars.forEach(([label, v], i) => {
    const bh = (H - T - B) * v / top;
    svg.append(h("rect", { x: L + i * bw + 2, y: H - B - bh, width: Math.max(1, bw - 4), height: bh, fill: COLORS[0] }),
               h("text", { x: L + i * bw + bw / 2 - 4, y: H - 10 }, label),
               h("text", { x: L + i * bw + bw / 2 - 8, y: H - B - bh - 3 }, v));
  });
  return box;
}

// --- routing and live updates ------------------------------------------------------------------
function parseRoute() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const [page, id] = path.split("/");
  return { page: page || "runs", id, q: Object.fromEntries(new URLSearchParams(query || "")) };
}

function go(page, id, q) {
  location.hash = `${page}/${id}` + (q && qs(q) ? "?" + qs(q) : "");
}

function crumbs(...links) {
  const el = document.getElementById("crumbs");
  el.replaceChildren(...links.flatMap(([text, href]) => [" / ", href ? h("a", { href }, text) : text]));
}

async function render(keepScroll) {
  const route = parseRoute(), main = document.getElementById("main"), y = window.scrollY;
  HX.route = route;
  const fn = HX.pages[route.page];
  try {
    if (!fn) throw new Error(`no page ${route.page}`);
    const content = await fn(route);
    if (HX.route !== route) return;  // the user moved on while this page loaded
    main.replaceChildren(content);
    document.body.dataset.page = route.page;
    document.body.dataset.ready = "1";
  } catch (e) {
    main.replaceChildren(h("div", { cls: "errors", id: "page-error" }, e.message));
    document.body.dataset.ready = "1";
  }
  if (keepScroll) window.scrollTo(0, y);
}

async function poll() {
  const r = HX.route;
  if (!r || !["run", "runs"].includes(r.page) || document.hidden) return;
  try {
    const key = r.page === "run" ? (await api(`run/${r.id}/stamp`)).stamp : JSON.stringify(await api("runs"));
    if (HX.stamp !== null && key !== HX.stamp && HX.route === r) {
      document.getElementById("live").textContent = "updated " + new Date().toLocaleTimeString();
      await render(true);
    }
    HX.stamp = key;
  } catch (e) { document.getElementById("live").textContent = "server unreachable"; }
}

HX.pages.runs = async () => {
  crumbs();
  const { runs } = await api("runs");
  return h("div", {}, h("h1", {}, "Runs"), table([
    { label: "run", cell: r => h("a", { href: `#run/${r.id}` }, r.name) },
    { label: "kind", key: "kind" }, { label: "folder", cell: r => h("span", { cls: "muted" }, r.path) },
  ], runs));
};

window.addEventListener("hashchange", () => { HX.stamp = null; render(false); });
window.addEventListener("DOMContentLoaded", () => { render(false); HX.timer = setInterval(poll, 3000); });
