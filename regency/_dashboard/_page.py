"""The dashboard's one page: plain HTML, CSS and JavaScript in one response (no build step,
nothing fetched from elsewhere: a machine without network shows it). The script polls the
JSON endpoints of :mod:`regency._dashboard._server` while the page is open, only those of
the tab on show, each poll after the last one answered."""

from __future__ import annotations

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Regency dashboard</title>
<style>
:root { --fg: #1d2330; --muted: #697386; --line: #dde2ea; --bg: #f6f7f9; --card: #fff;
        --run: #1f8f4e; --fail: #c93a3a; --stop: #8a93a3; --busy: #d98a16; --call: #3f72c4; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       background: var(--bg); }
header { display: flex; align-items: baseline; gap: 16px; padding: 10px 18px; background: #1d2330;
         color: #fff; }
header h1 { font-size: 18px; margin: 0; letter-spacing: .5px; }
header #job { color: #c8cfdb; flex: 1; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; }
#status { font-size: 12px; padding: 2px 8px; border-radius: 10px; background: #38414f; }
#status.ok { background: #1f6f43; } #status.err { background: #a33030; }
nav { display: flex; gap: 4px; padding: 8px 18px 0; border-bottom: 1px solid var(--line); background: var(--card); }
nav button { border: 1px solid transparent; border-bottom: none; background: none; padding: 7px 14px;
             font: inherit; cursor: pointer; color: var(--muted); border-radius: 6px 6px 0 0; }
nav button.active { border-color: var(--line); background: var(--bg); color: var(--fg); font-weight: 600;
                    margin-bottom: -1px; }
main { padding: 14px 18px; }
.tab { display: none; } .tab.active { display: block; }
#summary { color: var(--muted); margin-bottom: 10px; }
.split { display: flex; gap: 14px; align-items: flex-start; }
#tree { flex: 3; min-width: 0; }
#detail { flex: 2; min-width: 320px; position: sticky; top: 10px; background: var(--card);
          border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; max-height: 92vh; overflow: auto; }
#detail h2 { font-size: 15px; margin: 0 0 6px; }
.hint { color: var(--muted); }
.pmesh, .amesh { background: var(--card); border: 1px solid var(--line); border-radius: 8px; margin-bottom: 12px; }
.pmesh > .head { padding: 8px 12px; border-bottom: 1px solid var(--line); }
.amesh { margin: 10px 12px; }
.amesh > .head { padding: 6px 10px; background: #fafbfc; border-bottom: 1px solid var(--line);
                 border-radius: 8px 8px 0 0; }
.kind { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .4px; margin-right: 6px; }
.dims { color: var(--muted); }
.procs { padding: 6px 12px 0; display: flex; flex-wrap: wrap; gap: 6px; }
.chip { font-size: 12px; border: 1px solid var(--line); border-radius: 10px; padding: 1px 8px; background: #fbfcfd; }
.chip.failed { border-color: var(--fail); color: var(--fail); }
.chip.stopped { color: var(--stop); }
.badge { display: inline-block; font-size: 11px; font-weight: 600; padding: 1px 7px; border-radius: 9px;
         color: #fff; text-transform: uppercase; letter-spacing: .3px; }
.badge.running { background: var(--run); } .badge.failed { background: var(--fail); }
.badge.stopped { background: var(--stop); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eef0f4; vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; }
tr.actor { cursor: pointer; } tr.actor:hover { background: #f2f6fd; }
tr.actor.selected { background: #e3ecfb; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.busy { color: var(--busy); font-weight: 600; } .idle { color: var(--muted); }
.error { color: var(--fail); }
#failures .box { background: #fff4f4; border: 1px solid #f0c4c4; border-radius: 8px; padding: 8px 12px; margin-bottom: 12px; }
#failures h3 { margin: 0 0 4px; font-size: 14px; color: var(--fail); }
details summary { cursor: pointer; }
pre { background: #f4f6f9; border: 1px solid var(--line); border-radius: 6px; padding: 8px; overflow: auto;
      font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: pre; }
pre .user { color: #0b4fb0; font-weight: 600; }
.more { color: var(--muted); padding: 4px 10px; font-size: 12px; }
#stopped-toggle { font: inherit; font-size: 12px; }
.controls { display: flex; gap: 12px; align-items: center; margin-bottom: 10px; color: var(--muted); }
#timeline svg { background: var(--card); border: 1px solid var(--line); border-radius: 8px; }
#timeline .label { font-size: 12px; fill: var(--fg); }
#timeline .axis { font-size: 11px; fill: var(--muted); }
#stacks-text { max-height: 78vh; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin: 0 4px 0 8px; }
</style>
</head>
<body>
<header><h1>Regency</h1><span id="job">connecting&hellip;</span><span id="status">connecting</span></header>
<nav>
  <button data-tab="overview" class="active">Meshes</button>
  <button data-tab="timeline">Timeline</button>
  <button data-tab="stacks">Stacks</button>
</nav>
<main>
  <section id="tab-overview" class="tab active">
    <div id="summary"></div>
    <div id="failures"></div>
    <div class="split">
      <div id="tree"></div>
      <aside id="detail"><p class="hint">Click an actor to see what it runs, its stack and its last calls.</p></aside>
    </div>
  </section>
  <section id="tab-timeline" class="tab">
    <div class="controls">
      <label>window <select id="window">
        <option value="30">30 s</option><option value="60" selected>1 min</option>
        <option value="180">3 min</option><option value="300">5 min</option></select></label>
      <span class="legend"><i style="background: var(--call)"></i>handled <i style="background: var(--fail)"></i>raised
        <i style="background: var(--busy)"></i>running now &#9660; event (stall, failure, exit)</span>
      <span id="timeline-note"></span>
    </div>
    <div id="timeline"></div>
  </section>
  <section id="tab-stacks" class="tab">
    <div class="controls">
      <label>stacks of <select id="stacks-proc"><option value="">the whole job</option></select></label>
      <label><input type="checkbox" id="stacks-live" checked> live</label>
    </div>
    <pre id="stacks-text">asking the procs&hellip;</pre>
  </section>
</main>
<script>
"use strict";
const TOKEN = new URLSearchParams(location.search).get("token");
const POLL_MS = 1500;
let tab = "overview";
let selected = null;          // {address, mesh, rank}
let showStopped = false;
const openDetails = new Set();
let timer = null, inFlight = false, stacksShown = false;

function api(path, params) {
  const q = new URLSearchParams(params || {});
  if (TOKEN) q.set("token", TOKEN);
  return fetch(path + "?" + q.toString(), {credentials: "same-origin", cache: "no-store"})
    .then(r => r.ok ? r.json() : r.text().then(t => { throw new Error(r.status + " " + t); }));
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function dur(s) {
  if (s === null || s === undefined) return "";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " \u00b5s";
  if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  return (s / 60).toFixed(1) + " min";
}
function ms(v) { return v === null || v === undefined ? "" : dur(v / 1e3); }
function point(p) { return Object.entries(p || {}).map(([k, v]) => k + "=" + v).join(", "); }
function dims(d) {
  const e = Object.entries(d || {});
  return e.length ? "{" + e.map(([k, v]) => k + ": " + v).join(", ") + "}" : "";
}
function badge(state) { return el("span", {class: "badge " + state, text: state}); }
function setStatus(ok, text) {
  const s = document.getElementById("status");
  s.className = ok ? "ok" : "err";
  s.textContent = text;
}
function keepOpen(details, key) {
  if (openDetails.has(key)) details.open = true;
  details.addEventListener("toggle", () => details.open ? openDetails.add(key) : openDetails.delete(key));
  return details;
}

// -- the meshes tab -----------------------------------------------------------------------

function renderOverview(s) {
  const c = s.controller;
  document.getElementById("job").textContent =
    "controller " + c.proc_id + " \u00b7 pid " + c.pid + " on " + c.host + " \u00b7 " + (c.argv || []).join(" ");
  const procs = s.hosts.reduce((n, h) => n + h.procs, 0);
  const st = s.stacks;
  document.getElementById("summary").textContent =
    s.hosts.length + " host(s): " + s.hosts.map(h => h.name + " (" + h.running + " of " + h.procs + " procs running)").join(", ") +
    " \u00b7 " + st.answered + " of " + st.procs + " procs answered" +
    (s.supervision_broken ? " \u00b7 supervision broken: " + s.supervision_broken : "");

  const failures = document.getElementById("failures");
  failures.replaceChildren();
  if (s.failures.length) {
    const box = el("div", {class: "box"}, el("h3", {text: s.failures.length + " failed actor(s)"}));
    for (const f of s.failures) {
      const key = "failure " + f.key + " " + f.rank;
      box.append(keepOpen(el("details", {class: "failure", "data-mesh": f.mesh, "data-rank": f.rank},
        el("summary", {}, el("b", {text: f.cls + " '" + f.mesh + "' rank " + f.rank}), ": ",
           el("span", {class: "error", text: f.summary})),
        f.traceback ? el("pre", {text: f.traceback}) : null), key));
    }
    failures.append(box);
  }

  const tree = document.getElementById("tree");
  tree.replaceChildren();
  let stopped = 0;
  for (const pm of s.proc_meshes) {
    if (pm.state === "stopped" && !showStopped) { stopped++; continue; }
    tree.append(renderProcMesh(pm));
  }
  if (!s.proc_meshes.length) tree.append(el("p", {class: "hint", text: "No procs yet: spawn_procs() starts some."}));
  if (stopped || showStopped) {
    tree.append(el("button", {id: "stopped-toggle", onclick: () => { showStopped = !showStopped; pollNow(); },
      text: showStopped ? "hide stopped proc meshes" : "show " + stopped + " stopped proc mesh(es)"}));
  }
}

function renderProcMesh(pm) {
  const title = pm.name === "controller" ? "the controller's own actors" :
    "proc mesh " + pm.name;
  const head = el("div", {class: "head"}, el("span", {class: "kind", text: pm.name === "controller" ? "controller" : "procs"}),
    el("b", {text: title}), " ", el("span", {class: "dims", text: dims(pm.dims)}), " \u00b7 ",
    pm.procs.length + " proc(s) on " + pm.hosts.join(", "),
    pm.spawned_by === "an actor" ? " \u00b7 spawned by an actor" : "", " ", badge(pm.state));
  const chips = el("div", {class: "procs"});
  if (pm.name !== "controller") {
    for (const p of pm.procs) {
      chips.append(el("span", {class: "chip " + p.state, title: p.reason || p.address},
        p.proc_id + (p.pid ? " pid " + p.pid : "") + (Object.keys(p.coords).length ? " {" + point(p.coords) + "}" : "") +
        (p.state !== "running" ? " \u00b7 " + p.state : "") + (p.reason ? " \u00b7 " + p.reason : "")));
    }
  }
  const box = el("div", {class: "pmesh " + pm.state, "data-proc-mesh": pm.id}, head, chips);
  for (const am of pm.actor_meshes) box.append(renderActorMesh(am));
  if (!pm.actor_meshes.length) box.append(el("div", {class: "more", text: "no actors"}));
  return box;
}

function renderActorMesh(am) {
  const head = el("div", {class: "head"}, el("span", {class: "kind", text: "actors"}),
    el("b", {text: am.cls + " '" + am.name + "'"}), " ", el("span", {class: "dims", text: dims(am.dims)}),
    " \u00b7 " + am.size + " rank(s) \u00b7 owner " + am.owner + " ", badge(am.state));
  const table = el("table", {},
    el("tr", {}, ["rank", "point", "proc", "state", "running", "queued", "calls/s", "latency mean / max", "last call"]
      .map(h => el("th", {text: h}))));
  for (const r of am.ranks) {
    const n = r.numbers;
    const isSel = selected && selected.address === r.address && selected.mesh === am.name && selected.rank === r.rank;
    let running;
    if (r.endpoint) running = el("span", {class: "busy", text: r.endpoint + " for " + dur(r.running_for)});
    else if (r.seen) running = el("span", {class: "idle", text: "idle"});
    else running = el("span", {class: "idle", text: r.note || (r.state === "running" ? "" : "\u2014")});
    const tr = el("tr", {class: "actor" + (isSel ? " selected" : ""), "data-mesh": am.name, "data-rank": r.rank,
                         "data-state": r.state, "data-address": r.address,
                         onclick: () => select({address: r.address, mesh: am.name, rank: r.rank})},
      el("td", {class: "num", text: r.rank}),
      el("td", {text: point(r.point)}),
      el("td", {text: r.proc_id}),
      el("td", {}, badge(r.state), r.failure ? el("div", {class: "error", text: r.failure.summary}) : null),
      el("td", {}, running),
      el("td", {class: "num", text: r.queued === null ? "" : r.queued}),
      el("td", {class: "num", text: n ? n.rate.toFixed(n.rate < 10 ? 2 : 0) : ""}),
      el("td", {class: "num", text: n && n.latency_ms ? ms(n.latency_ms.mean) + " / " + ms(n.latency_ms.max) : ""}),
      el("td", {text: n && n.last ? n.last.endpoint + ": " + n.last.outcome + ", " + dur(n.last.ago) + " ago" : ""}));
    table.append(tr);
  }
  const box = el("div", {class: "amesh " + am.state, "data-actor-mesh": am.name}, head, table);
  if (am.size > am.ranks.length) box.append(el("div", {class: "more", text: (am.size - am.ranks.length) + " more rank(s) not listed"}));
  return box;
}

function select(which) {
  selected = which;
  document.querySelectorAll("tr.actor").forEach(tr => tr.classList.toggle("selected",
    tr.dataset.address === which.address && tr.dataset.mesh === which.mesh && Number(tr.dataset.rank) === which.rank));
  document.getElementById("detail").replaceChildren(el("p", {class: "hint", text: "asking its proc\u2026"}));
  pollNow();
}

function renderDetail(d) {
  const box = document.getElementById("detail");
  const row = d.row || {};
  const name = (row.cls ? row.cls + " " : "") + "'" + d.mesh + "' rank " + d.rank;
  const parts = [el("h2", {}, name, " ", row.state ? badge(row.state) : null)];
  if (d.proc) parts.push(el("div", {class: "hint", text: "proc " + d.proc.proc_id + " \u00b7 host " + d.proc.host + " \u00b7 pid " + d.proc.pid}));
  if (row.failure) {
    parts.push(el("h3", {class: "error", text: "failed: " + row.failure.summary}));
    if (row.failure.traceback) parts.push(el("pre", {id: "detail-traceback", text: row.failure.traceback}));
  }
  if (!d.answered) parts.push(el("p", {class: "error", text: "its proc did not answer: " + d.reason}));
  const a = d.actor;
  if (a) {
    parts.push(el("p", {id: "detail-doing"}, a.endpoint ?
      el("span", {class: "busy", text: "in endpoint " + a.endpoint + (d.async ? " (async)" : "") + " for " + dur(a.running_for)}) :
      el("span", {class: "idle", text: "idle: waiting for its next message"}),
      " \u00b7 " + a.queued + " message(s) queued" +
      (a.numbers && a.numbers.latency_ms ? " \u00b7 " + a.numbers.rate.toFixed(2) + " calls/s, mean " + ms(a.numbers.latency_ms.mean) : "")));
    if (d.frames.length) {
      const pre = el("pre", {id: "detail-frames"});
      for (const f of d.frames) {
        pre.append(el("span", {class: f.user ? "user" : ""}, '  File "' + f.file + '", line ' + f.line + ", in " + f.function + "\n"));
        if (f.source) pre.append("    " + f.source + "\n");
      }
      parts.push(el("h3", {text: "stack (innermost last)"}), pre);
    }
  } else if (d.answered && !row.failure) {
    parts.push(el("p", {class: "hint", text: "its proc has no such actor now (stopped?)"}));
  }
  if (d.recent.length) {
    const t = el("table", {id: "detail-recent"}, el("tr", {}, ["endpoint", "outcome", "took", "queued", "ago"].map(h => el("th", {text: h}))));
    for (const c of d.recent.slice(0, 20)) {
      t.append(el("tr", {}, el("td", {text: c.endpoint}),
        el("td", {class: c.outcome.startsWith("returned") ? "" : "error", text: c.outcome}),
        el("td", {class: "num", text: ms(c.took_ms)}), el("td", {class: "num", text: ms(c.queued_ms)}),
        el("td", {class: "num", text: dur(c.ago)})));
    }
    parts.push(el("h3", {text: "last calls (newest first, of " + d.recent.length + ")"}), t);
  }
  box.replaceChildren(...parts);
}

// -- the timeline tab ---------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) { const t = document.createElementNS(SVG, "title"); t.textContent = text; node.append(t); }
  return node;
}

function renderTimeline(t) {
  const holder = document.getElementById("timeline");
  const note = document.getElementById("timeline-note");
  note.textContent = t.note || "";
  if (t.dropped) note.textContent += " \u00b7 " + t.dropped + " event(s) dropped (ring full)";
  if (t.missing && Object.keys(t.missing).length) note.textContent += " \u00b7 not answering: " + Object.keys(t.missing).join(", ");
  const W = Math.max(holder.clientWidth || 900, 600), LABEL = 250, LANE = 22, TOP = 24;
  const plot = W - LABEL - 12, win = t.window;
  const H = TOP + Math.max(t.lanes.length, 1) * LANE + 8;
  const root = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H});
  const x = ago => LABEL + (win - ago) / win * plot;
  for (let i = 0; i <= 6; i++) {
    const ago = win * (6 - i) / 6;
    root.append(svg("line", {x1: x(ago), x2: x(ago), y1: TOP - 4, y2: H, stroke: "#eef0f4"}));
    root.append(Object.assign(svg("text", {x: x(ago), y: 14, "text-anchor": i === 6 ? "end" : "middle", class: "axis"}),
      {textContent: ago === 0 ? "now" : "\u2212" + dur(ago)}));
  }
  if (!t.lanes.length) {
    root.append(Object.assign(svg("text", {x: LABEL, y: TOP + 15, class: "axis"}), {textContent: "no calls handled in this window"}));
  }
  t.lanes.forEach((lane, i) => {
    const y = TOP + i * LANE;
    const g = svg("g", {class: "lane", "data-track": lane.track, "data-proc": lane.proc_id});
    g.append(svg("rect", {x: 0, y: y, width: W, height: LANE, fill: i % 2 ? "#fafbfc" : "#ffffff"}));
    g.append(Object.assign(svg("text", {x: 8, y: y + 15, class: "label"}), {textContent: lane.track + "  \u00b7 " + lane.proc_id}));
    for (const s of lane.spans) {
      const x0 = x(s.from), x1 = x(s.to);
      g.append(svg("rect", {x: x0, y: y + 4, width: Math.max(x1 - x0, 1.5), height: LANE - 8, rx: 2,
        fill: s.ok ? "var(--call)" : "var(--fail)", class: "span"},
        (s.count > 1 ? s.count + " calls (" + s.name + ")" : s.name) + ", " + dur(s.from - s.to)));
    }
    if (lane.running) {
      const x0 = x(lane.running[0]);
      g.append(svg("rect", {x: x0, y: y + 4, width: Math.max(x(0) - x0, 2), height: LANE - 8, rx: 2,
        fill: "var(--busy)", class: "running"}, "still running, for " + dur(lane.running[0]) + " or more"));
    }
    for (const m of lane.instants) {
      const color = m.name.includes("fail") ? "var(--fail)" : m.name.includes("stall") ? "var(--busy)" : "#444";
      g.append(svg("path", {d: "M" + x(m.at) + " " + (y + 2) + " l4 -0 l-4 8 l-4 -8 z", fill: color, class: "instant"}, m.name));
    }
    root.append(g);
  });
  holder.replaceChildren(root);
}

// -- the stacks tab -----------------------------------------------------------------------

function renderStacks(s) {
  const sel = document.getElementById("stacks-proc");
  const want = sel.value;
  sel.replaceChildren(el("option", {value: "", text: "the whole job"}),
    ...s.procs.map(p => el("option", {value: p.address, text: p.label + (p.answered ? "" : " (not answering)")})));
  sel.value = want;
  document.getElementById("stacks-text").textContent = s.text;
  stacksShown = true;
}

// -- polling ----------------------------------------------------------------------------

async function pollOnce() {
  if (tab === "overview") {
    const s = await api("/api/state");
    renderOverview(s);
    if (selected) renderDetail(await api("/api/actor", selected));
  } else if (tab === "timeline") {
    renderTimeline(await api("/api/timeline", {window: document.getElementById("window").value}));
  } else if (document.getElementById("stacks-live").checked || !stacksShown) {
    renderStacks(await api("/api/stacks", {proc: document.getElementById("stacks-proc").value}));
  }
}

async function loop() {
  if (inFlight) return;
  inFlight = true;
  clearTimeout(timer);
  try {
    await pollOnce();
    setStatus(true, "live \u00b7 " + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus(false, "not answering: " + e.message);
  } finally {
    inFlight = false;
    timer = setTimeout(loop, POLL_MS);
  }
}
function pollNow() { if (!inFlight) loop(); else setTimeout(pollNow, 50); }

document.querySelectorAll("nav button").forEach(b => b.addEventListener("click", () => {
  tab = b.dataset.tab;
  document.querySelectorAll("nav button").forEach(o => o.classList.toggle("active", o === b));
  document.querySelectorAll(".tab").forEach(s => s.classList.toggle("active", s.id === "tab-" + tab));
  stacksShown = false;
  pollNow();
}));
document.getElementById("window").addEventListener("change", pollNow);
document.getElementById("stacks-proc").addEventListener("change", () => { stacksShown = false; pollNow(); });
loop();
</script>
</body>
</html>
"""
