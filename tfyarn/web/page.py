"""The job's page: one HTML document with its CSS, JS and SVG charts inline (no build step). It
fetches only ``status.json``, ``history.json`` and the logs, all relative to its own path, so it
works under any prefix (the ResourceManager's ``/proxy/<app>/``, skein's ``pages/tfyarn/``). It
refreshes every 2 s until the job has ended."""

PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tfyarn job</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em} .muted{color:#777} .warn{color:#b00;font-weight:600}
.state{padding:1px 8px;border-radius:9px;color:#fff;background:#888}
.RUNNING{background:#2a7} .SUCCEEDED{background:#175} .FAILED,.TIMED_OUT{background:#c33}
.KILLED{background:#c90} .PENDING{background:#999}
table{border-collapse:collapse;margin:.5em 0}
td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child,td.l,th.l{text-align:left}
.bar{display:inline-block;width:160px;height:10px;background:#eee;vertical-align:middle;
  border-radius:3px}
.bar>span{display:block;height:100%;background:#2a7;border-radius:3px}
.bar.hot>span{background:#c33}
#progressbar{width:420px;height:14px} .charts{display:flex;flex-wrap:wrap;gap:18px}
.chart{border:1px solid #ddd;border-radius:4px;padding:4px}
pre{background:#f6f6f6;padding:6px;white-space:pre-wrap}
</style></head>
<body data-loaded="0">
<h1><span id="name">tfyarn job</span> <span class="muted" id="appid"></span>
 <span id="state" class="state">…</span></h1>
<div id="diag"></div>
<p><span class="bar" id="progressbar"><span id="progressfill" style="width:0"></span></span>
 <span id="progress"></span></p>
<p id="links"></p>
<div id="warnings"></div>
<table id="tasks"><thead><tr><th class="l">role</th><th>#</th><th class="l">host</th>
<th class="l">state</th><th>restarts</th><th>step</th><th>examples/s</th><th>CPU %</th>
<th class="l">RSS / container memory</th><th class="l">log</th></tr></thead><tbody></tbody></table>
<div class="charts">
<div class="chart"><b>loss</b> <span class="muted">(seconds since the first step)</span>
<div id="chart-loss"></div></div>
<div class="chart"><b>examples/s</b><div id="chart-rate"></div></div></div>
<div id="eval"></div>
<p class="muted" id="updated"></p>
<script>
"use strict";
const here = location.pathname.replace(/(index\.html)?$/, "").replace(/([^/])$/, "$1/");
const TERMINAL = ["SUCCEEDED", "FAILED", "KILLED", "TIMED_OUT"];
const EVAL_META = ["global_step", "epoch", "batches", "examples", "time", "eval_seconds"];
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22", "#17becf"];
let points = [], since = 0;
const $ = (id) => document.getElementById(id);
const ENT = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"};
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"]/g, (c) => ENT[c]);
const num = (x, d) => x == null ? "-"
  : Number(x).toLocaleString(undefined, {maximumFractionDigits: d || 0});
// <tag a="v" ...>text</tag>, attribute values and text escaped
const el = (tag, attrs, text) => "<" + tag + Object.entries(attrs || {}).map(
  ([k, v]) => " " + k + '="' + esc(v) + '"').join("") + ">" + (text == null ? "" : text)
  + "</" + tag + ">";
function eta(s) {
  if (s == null) return "-";
  s = Math.round(s);
  const two = (n) => String(n).padStart(2, "0");
  return s >= 3600 ? Math.floor(s / 3600) + "h" + two(Math.floor(s % 3600 / 60)) + "m"
    : Math.floor(s / 60) + "m" + two(s % 60) + "s";
}
function lastByTask() {
  const out = {};
  for (const p of points) if (p.examples_per_sec != null) out[p.task] = p;
  return out;
}
function logHref(t) {
  // a URL (YARN: the NodeManager's, scheme-less "host:port/node/containerlogs/…"), else /log here
  if (!t.log) return null;
  if (/^https?:/.test(t.log)) return t.log;
  if (/^[^/]+:\d+\//.test(t.log)) return "http://" + t.log;
  return here + "log?task=" + encodeURIComponent(t.task);
}
function memoryCell(t, warn) {
  const rss = t.rss_mib != null ? t.rss_mib : t.peak_rss_mib, mem = t.memory_mib;
  if (rss == null) return "-";
  if (!mem) return num(rss) + " MiB";
  const frac = rss / mem, hot = frac >= 0.9;
  if (hot) warn.push(t.task + " uses " + num(rss) + " MiB of its container's " + num(mem)
                     + " MiB (" + num(100 * frac) + " %)");
  const peak = t.peak_rss_mib != null && t.peak_rss_mib !== rss
    ? " (peak " + num(t.peak_rss_mib) + ")" : "";
  return el("span", {class: "bar" + (hot ? " hot" : "")},
            el("span", {style: "width:" + Math.min(100, 100 * frac) + "%"}))
    + " " + num(rss) + " / " + num(mem) + " MiB" + peak;
}
function taskRow(t, perTask, rates, warn, taken) {
  const [role, index] = t.task.split(":"), r = rates[t.task];
  let step = perTask[t.task] != null ? perTask[t.task] : (r || {}).step;
  // a user's program that reports no step: the batches it took from train_dataset(), labelled
  if (step == null && taken[t.task] != null) step = num(taken[t.task]) + " taken";
  else step = num(step);
  const href = logHref(t);
  const cells = [el("td", {}, esc(role)), el("td", {}, esc(index)),
    el("td", {class: "l"}, esc(t.host || "-")),
    el("td", {class: "l"}, el("span", {class: "state " + t.state}, esc(t.state))),
    el("td", {}, t.restarts), el("td", {}, step),
    el("td", {}, r ? num(r.examples_per_sec) : "-"), el("td", {}, num(t.cpu_percent, 1)),
    el("td", {class: "l"}, memoryCell(t, warn)),
    el("td", {class: "l"}, href ? el("a", {href: href}, "log") : "-")];
  return el("tr", {"data-task": t.task}, cells.join(""));
}
function render(st) {
  const ended = TERMINAL.includes(st.state), p = st.progress || {}, sum = st.summary || {};
  document.title = st.name + " " + st.state + " · tfyarn";
  $("name").textContent = st.name;
  $("appid").textContent = "(" + st.app_id + ", " + st.backend + ")";
  $("state").textContent = st.state;
  $("state").className = "state " + st.state;
  $("diag").innerHTML = st.diagnostics ? el("pre", {}, esc(st.diagnostics)) : "";
  const scoring = p.rows_total != null || sum.job === "predict";  // a predict job: rows, not steps
  const gs = scoring ? (p.rows != null ? p.rows : sum.rows_out)
    : (p.global_step != null ? p.global_step : sum.global_step);
  const total = scoring ? (p.rows_total || sum.rows_in) : (p.total_steps || sum.total_steps);
  $("progressfill").style.width = (total ? Math.min(100, 100 * (gs || 0) / total) : 0) + "%";
  const program = !scoring && (sum.entrypoint != null || p.taken != null);  // a user's program: "not reported"
  const parts = [(scoring ? "rows scored " : "global step ") + (gs == null && program ? "not reported" : num(gs))
                 + (total ? " / " + num(total) : "")];
  if (scoring && p.rows_per_sec != null) parts.push(num(p.rows_per_sec) + " rows/s");
  if (scoring && sum.parts != null) parts.push(num(sum.parts) + " parts, " + num(sum.bytes) + " bytes");
  const taken = p.taken || Object.fromEntries(Object.entries(sum.taken || {}).map(([t, v]) => [t, v.batches]));
  if (Object.keys(taken).length) {
    parts.push("batches taken from train_dataset() " + Object.entries(taken).map(
      ([t, n]) => t + "=" + num(n)).join(" ") + (sum.planned_batches ? " of " + num(sum.planned_batches) : ""));
  }
  if (p.epoch != null && !scoring) parts.push("epoch " + p.epoch);
  const eps = p.examples_per_sec != null ? p.examples_per_sec : sum.examples_per_sec;
  const from = p.examples_from || sum.examples_from;
  if (eps != null && !scoring) parts.push(num(eps) + " examples/s" + (from ? " (taken from " + from + ")" : ""));
  else if (program) parts.push("examples/s not reported");
  const loss = p.loss != null ? p.loss : sum.last_loss;
  if (loss != null) parts.push("loss " + num(loss, 4));
  else if (program) parts.push("loss not reported");
  if (!ended) parts.push("ETA " + eta(p.eta_s));
  else if (st.finished && st.started) parts.push("took " + num(st.finished - st.started, 1) + " s");
  $("progress").textContent = parts.join(" · ");
  const links = [el("a", {href: here + "status.json"}, "status JSON")];
  if (p.tensorboard_url && !ended) {
    links.push(el("a", {id: "tensorboard", href: p.tensorboard_url}, "TensorBoard"));
  }
  if (/^https?:/.test(st.tracking_url || "")) links.push(el("a", {href: st.tracking_url}, "YARN"));
  $("links").innerHTML = links.join(" · ");
  const perTask = p.per_task || {}, rates = lastByTask(), warn = [];
  $("tasks").tBodies[0].innerHTML = (st.tasks || []).map(
    (t) => taskRow(t, perTask, rates, warn, taken)).join("");
  $("warnings").innerHTML = warn.map((w) => el("p", {class: "warn"}, "memory: " + esc(w))).join("");
  const ev = p.eval || sum.eval;
  $("eval").innerHTML = !ev ? "" : "<b>latest evaluation</b> (" + esc(ev.checkpoint)
    + ", global step " + esc(ev.global_step) + "): " + Object.entries(ev)
      .filter(([k, v]) => typeof v === "number" && !EVAL_META.includes(k))
      .map(([k, v]) => esc(k) + " " + num(v, 4)).join(" · ");
  const t0 = points.length ? Math.min(...points.map((q) => q.time)) : null;   // the first step
  chart("chart-loss", "loss", t0);
  chart("chart-rate", "examples_per_sec", t0);
  $("updated").textContent = "updated " + new Date().toLocaleTimeString()
    + (ended ? " · the job has ended" : " · refreshing every 2 s");
}
function chart(id, key, t0) {
  const W = 560, H = 220, L = 56, B = 24, R = 100, byTask = {};
  for (const p of points) {
    if (p[key] == null) continue;
    // a task's first rate spans the instant between its start and step 1: not a rate
    if (key === "examples_per_sec" && !byTask[p.task]) { byTask[p.task] = []; continue; }
    (byTask[p.task] = byTask[p.task] || []).push(p);
  }
  const tasks = Object.keys(byTask).filter((t) => byTask[t].length).sort();
  const xs = [], ys = [];
  for (const t of tasks) for (const p of byTask[t]) { xs.push(p.time); ys.push(p[key]); }
  const svg = (body) => el("svg", {xmlns: "http://www.w3.org/2000/svg", width: W, height: H}, body);
  if (!xs.length) {
    $(id).innerHTML = svg(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#999"},
                             "no points yet"));
    return;
  }
  t0 = t0 || Math.min(...xs);
  const x1 = Math.max(1e-9, Math.max(...xs) - t0), y0 = Math.min(0, ...ys);
  const y1 = Math.max(...ys) || 1;
  const sx = (t) => L + (W - L - R) * (t - t0) / x1;
  const sy = (v) => H - B - (H - B - 8) * (v - y0) / ((y1 - y0) || 1);
  let body = el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999"})
    + el("line", {x1: L, y1: 0, x2: L, y2: H - B, stroke: "#999"});
  for (const f of [0, 0.5, 1]) {
    const v = y0 + f * (y1 - y0), t = f * x1;
    body += el("text", {x: L - 4, y: sy(v) + 4, "text-anchor": "end", "font-size": 10},
               num(v, v < 10 ? 3 : 0));
    body += el("text", {x: sx(t0 + t), y: H - 8, "text-anchor": "middle", "font-size": 10},
               num(t, 1) + (f === 1 ? " s" : ""));
  }
  tasks.forEach((t, i) => {
    const c = COLOURS[i % COLOURS.length];
    const pts = byTask[t].map((p) => sx(p.time).toFixed(1) + "," + sy(p[key]).toFixed(1));
    body += el("polyline", {class: "series", "data-task": t, fill: "none", stroke: c,
                            "stroke-width": 1.5, points: pts.join(" ")});
    body += el("text", {x: W - R + 8, y: 14 + 13 * i, "font-size": 11, fill: c}, esc(t));
  });
  $(id).innerHTML = svg(body);
}
async function refresh() {
  let st;
  try {
    st = await (await fetch(here + "status.json", {cache: "no-store"})).json();
    const h = await (await fetch(here + "history.json?since=" + since, {cache: "no-store"})).json();
    for (const p of h.points) { points.push(p); since = Math.max(since, p.time); }
    render(st);
    document.body.dataset.loaded = "1";
  } catch (e) {
    $("updated").textContent = "could not read the job's status: " + e;
  }
  if (!st || !TERMINAL.includes(st.state)) setTimeout(refresh, 2000);
  else document.body.dataset.ended = "1";
}
refresh();
</script></body></html>
"""
