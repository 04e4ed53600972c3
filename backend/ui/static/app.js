// QuietFleet dashboard: live state from /api/events (server-sent events), devices paged by /api/devices.
// Plain JavaScript, no build step; charts by uPlot (vendored, MIT, see static/vendor/uplot/LICENSE).
"use strict";

const PAGE = 50;
const MAX_POINTS = 3000;          // points kept per query in the page (the server keeps its own bounded history)
const DEVICE_REFRESH_MS = 1000;   // a changing fleet refetches its page of devices at most this often
const S = {
  views: new Map(),               // query id -> QueryView
  skew: 0,                        // server time - browser time (s)
  dev: {offset: 0, q: "", status: "", shown: -1, want: -1, busy: false, last: 0, timer: null},
};

function num(x) {
  if (x === "inf") return Infinity;
  if (x === "-inf") return -Infinity;
  if (x === null || x === undefined || x === "nan") return null;
  return Number(x);
}

function fmt(x) {
  const v = num(x);
  if (v === null || Number.isNaN(v)) return "–";
  if (!Number.isFinite(v)) return v > 0 ? "∞" : "−∞";
  const a = Math.abs(v);
  if (a >= 1e6 || (a > 0 && a < 1e-3)) return v.toExponential(3);
  return v.toFixed(a >= 1000 ? 1 : 3);
}

function fmtCount(x) {
  return (x === null || x === undefined) ? "n/a" : Number(x).toLocaleString("en-US", {maximumFractionDigits: 1});
}

function fmtTime(t) {
  if (t === null || t === undefined) return "–";
  const d = new Date(t * 1000);
  return d.toLocaleTimeString("en-GB", {hour12: false}) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function now() { return Date.now() / 1000 + S.skew; }

function ago(t) {
  if (t === null || t === undefined) return "–";
  const s = Math.max(0, now() - t);
  if (s < 60) return s.toFixed(1) + " s ago";
  if (s < 3600) return Math.floor(s / 60) + " min ago";
  return fmtTime(t);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- one query: its row of numbers and its band over time ---------------------------------------
class QueryView {
  constructor(id) {
    this.id = id;
    this.points = [];             // [time, lo, hi, final, degraded]
    this.plot = null;
    this.dirty = true;
    const c = this.card = el("div", "query");
    c.dataset.id = id;
    c.dataset.points = "0";
    const h = el("div", "head");
    this.f = {};
    for (const [k, cls] of [["id", "qid"], ["kind", "kind"], ["band", "band"], ["guarantee", "badge"],
                            ["final", "badge final"], ["precision", "prec"], ["time", "q-time"]]) {
      this.f[k] = h.appendChild(el("span", cls));
    }
    this.f.id.textContent = id;
    this.f.lo = el("span", "q-lo");
    this.f.hi = el("span", "q-hi");
    this.f.band.append("[", this.f.lo, ", ", this.f.hi, "]");
    c.appendChild(h);
    this.f.reason = c.appendChild(el("div", "reason"));
    this.f.error = c.appendChild(el("div", "qerror"));
    this.chart = c.appendChild(el("div", "chart"));
  }

  update(row) {
    const f = this.f, c = this.card;
    f.kind.textContent = row.kind ? row.kind.toUpperCase() : "";
    f.precision.textContent = row.precision !== null && row.precision !== undefined ? "precision " + fmt(row.precision) : "";
    if (row.members !== undefined) {
      f.lo.textContent = row.members.length + " members";
      f.hi.textContent = row.members.slice(0, 8).join(" ") + (row.members.length > 8 ? " …" : "");
    } else {
      f.lo.textContent = fmt(row.lo);
      f.hi.textContent = fmt(row.hi);
    }
    f.guarantee.textContent = row.guarantee || (row.error ? "error" : "");
    f.guarantee.className = "badge" + (row.degraded ? " degraded" : "");
    f.final.textContent = row.final ? "final" : "provisional";
    f.final.className = "badge" + (row.final ? " final" : "");
    f.final.style.display = row.guarantee ? "" : "none";
    f.time.textContent = row.time !== null && row.time !== undefined ? "at " + fmtTime(num(row.time)) : "";
    f.time.dataset.t = row.time === null || row.time === undefined ? "" : String(row.time);
    f.reason.textContent = row.stale ? "STALE: " + row.stale + ": nobody keeps this answer true"
      : row.degraded ? (row.reason || "degraded") : "";
    f.error.textContent = row.error || "";
    c.classList.toggle("degraded", !!row.degraded || !!row.stale);
    c.classList.toggle("error", !!row.error);
    if (row.history) {
      if (row.reset) this.points = row.history.slice();
      else for (const p of row.history) this.points.push(p);
      if (this.points.length > MAX_POINTS) this.points.splice(0, this.points.length - MAX_POINTS);
      if (row.history.length || row.reset) this.dirty = true;
    }
  }

  // Step series: provisional and final bands (an answer holds until its next change), gaps where a side
  // is unbounded; the provisional band runs on to now. Degraded spans are shaded by the draw hook.
  data(t_now) {
    const pts = this.points.slice().sort((a, b) => a[0] - b[0]);
    const xs = [], plo = [], phi = [], flo = [], fhi = [];
    let lastP = null, lastF = null, lastFinalT = -Infinity;
    for (const p of pts) if (p[3]) lastFinalT = Math.max(lastFinalT, p[0]);
    this.spans = [];
    let open = {0: null, 1: null};
    for (const p of pts) {
      const [t, lo, hi, fin, deg] = p;
      if (fin) lastF = p; else lastP = p;
      const k = fin ? 1 : 0;
      if (deg && open[k] === null) open[k] = t;
      if (!deg && open[k] !== null) { this.spans.push([open[k], t]); open[k] = null; }
      const i = xs.length && xs[xs.length - 1] === t ? xs.length - 1 : xs.length;
      xs[i] = t;
      plo[i] = lastP ? lastP[1] : null; phi[i] = lastP ? lastP[2] : null;
      const fOk = lastF && t <= lastFinalT;
      flo[i] = fOk ? lastF[1] : null; fhi[i] = fOk ? lastF[2] : null;
    }
    for (const k of [0, 1]) if (open[k] !== null) this.spans.push([open[k], t_now]);
    if (lastP && xs.length && t_now > xs[xs.length - 1]) {
      xs.push(t_now); plo.push(lastP[1]); phi.push(lastP[2]); flo.push(null); fhi.push(null);
    }
    return [xs, plo, phi, flo, fhi];
  }

  draw(t_now) {
    if (!this.points.length || typeof uPlot === "undefined") return;
    const data = this.data(t_now);
    const width = Math.max(300, this.chart.clientWidth || 600);
    if (!this.plot) {
      const step = uPlot.paths.stepped({align: 1});
      const view = this;
      this.plot = new uPlot({
        width: width, height: 160, legend: {show: false}, cursor: {drag: {x: true, y: false}},
        scales: {x: {time: true}},
        series: [
          {},
          {label: "lo", stroke: "rgba(40,110,220,.9)", width: 1, paths: step},
          {label: "hi", stroke: "rgba(40,110,220,.9)", width: 1, paths: step},
          {label: "final lo", stroke: "rgba(20,150,70,1)", width: 1.5, paths: step},
          {label: "final hi", stroke: "rgba(20,150,70,1)", width: 1.5, paths: step},
        ],
        bands: [{series: [2, 1], fill: "rgba(40,110,220,.22)"}, {series: [4, 3], fill: "rgba(20,150,70,.35)"}],
        hooks: {draw: [u => view.shade(u)]},
      }, data, this.chart);
    } else {
      if (Math.abs(this.plot.width - width) > 2) this.plot.setSize({width: width, height: 160});
      this.plot.setData(data);
    }
    this.card.dataset.points = String(this.points.length);
    this.dirty = false;
  }

  shade(u) {
    const ctx = u.ctx, b = u.bbox;
    ctx.save();
    ctx.fillStyle = "rgba(220,50,40,.18)";
    for (const [t0, t1] of this.spans || []) {
      const x0 = Math.max(b.left, u.valToPos(t0, "x", true)), x1 = Math.min(b.left + b.width, u.valToPos(t1, "x", true));
      if (x1 > x0) ctx.fillRect(x0, b.top, Math.max(1, x1 - x0), b.height);
    }
    ctx.restore();
  }
}

// ---- live state ----------------------------------------------------------------------------------------
function apply(doc) {
  S.skew = doc.now - Date.now() / 1000;
  document.getElementById("fleet").textContent = "fleet " + doc.fleet;
  const be = document.getElementById("backend"), st = doc.backend;
  be.textContent = !st ? "backend: no state" : st.state === "online"
    ? "backend online" + (st.protocol ? " (" + st.driver + ", " + st.protocol + ")" : "")
    : "backend OFFLINE (" + (st.reason || "unknown") + "): answers are stale";
  be.className = "conn " + (st && st.state === "online" ? "on" : st ? "off" : "");
  const box = document.getElementById("queries");
  const seen = new Set();
  for (const row of doc.queries) {
    seen.add(row.id);
    let v = S.views.get(row.id);
    if (!v) {
      v = new QueryView(row.id);
      S.views.set(row.id, v);
      const empty = box.querySelector(".empty");
      if (empty) empty.remove();
      const after = [...S.views.keys()].filter(k => k > row.id && k !== row.id).sort()[0];
      box.insertBefore(v.card, after ? S.views.get(after).card : null);
    }
    v.update(row);
  }
  for (const [id, v] of S.views) {
    if (!seen.has(id)) { if (v.plot) v.plot.destroy(); v.card.remove(); S.views.delete(id); }
  }
  if (!S.views.size && !box.querySelector(".empty")) box.appendChild(el("p", "empty", "No query answers yet."));
  totals(doc.totals, doc.device_counts);
  S.dev.want = doc.device_counts.version;
  devicesSoon();
}

function totals(t, dc) {
  const set = (id, text) => { document.getElementById(id).textContent = text; };
  set("driver", t.driver || "");
  set("t-messages", fmtCount(t.uplink) + " / " + fmtCount(t.downlink));
  set("t-samples", fmtCount(t.samples));
  set("t-saved", t.saved_vs_samples === null ? "" :
      "ours " + fmtCount(t.ours) + ": " + (100 * t.saved_vs_samples).toFixed(1) + " % saved");
  set("t-deadband", fmtCount(t.deadband));
  set("t-vsdead", t.vs_deadband === null ? "" : "ours " + fmtCount(t.ours) + " = " + t.vs_deadband.toFixed(2) + "× deadband");
  set("t-devices", fmtCount(dc.online) + " / " + fmtCount(dc.offline) + " / " + fmtCount(dc.total));
  set("t-window", (t.window ? "Window: " + t.window + ". " : "") + "Broker counts since the dashboard started"
      + (t.since ? " at " + fmtTime(t.since) : "") + (t.bad ? "; " + t.bad + " undecodable messages" : "") + "."
      + (t.error ? " Totals provider failed: " + t.error : ""));
  set("t-extra", Object.entries(t.extra || {}).map(([k, v]) => k + ": " + (v === null ? "n/a" : v)).join(" · "));
}

let drawTimer = null;
function drawSoon() {
  if (drawTimer) return;
  drawTimer = setTimeout(() => {
    drawTimer = null;
    const t = now();
    for (const v of S.views.values()) if (v.dirty) v.draw(t);
  }, 100);
}

function connect() {
  const conn = document.getElementById("conn");
  const es = new EventSource("/api/events");
  es.onopen = () => { conn.textContent = "live"; conn.className = "conn on"; };
  es.onerror = () => { conn.textContent = "reconnecting"; conn.className = "conn off"; };
  es.addEventListener("state", e => { apply(JSON.parse(e.data)); drawSoon(); });
}

// ---- devices: one page at a time, searched on the server ---------------------------------------
function devicesSoon(force) {
  const d = S.dev;
  if (!force && d.want === d.shown) return;
  if (d.timer) return;
  const wait = force ? 0 : Math.max(0, DEVICE_REFRESH_MS - (Date.now() - d.last));
  d.timer = setTimeout(loadDevices, wait);
}

async function loadDevices() {
  const d = S.dev;
  d.timer = null;
  if (d.busy) { devicesSoon(true); return; }
  d.busy = true;
  d.last = Date.now();
  const want = d.want;
  try {
    const url = "/api/devices?offset=" + d.offset + "&limit=" + PAGE + "&q=" + encodeURIComponent(d.q)
      + "&status=" + encodeURIComponent(d.status);
    const page = await (await fetch(url)).json();
    renderDevices(page);
    d.shown = want;
  } catch (e) {
    console.error(e);
  } finally {
    d.busy = false;
  }
}

function renderDevices(page) {
  const body = document.querySelector("#devices tbody");
  const rows = [];
  for (const r of page.items) {
    const tr = el("tr");
    tr.dataset.id = r.id;
    const status = r.online === true ? "online" : r.online === false ? "offline" : "unknown";
    tr.dataset.status = status;
    tr.appendChild(el("td", "d-id", r.id));
    tr.appendChild(el("td", "d-status " + status, status));
    tr.appendChild(el("td", "d-seen", ago(r.last_seen)));
    const src = tr.appendChild(el("td", "d-sources", r.sources.join(", ")));
    src.title = r.sources.join(", ");
    tr.appendChild(el("td", "d-model", r.model || "–"));
    tr.appendChild(el("td", "d-messages", String(r.messages)));
    tr.appendChild(el("td", "d-births", String(r.births)));
    rows.push(tr);
  }
  if (!rows.length) {
    const tr = el("tr");
    const td = tr.appendChild(el("td", "empty", page.total ? "No device matches." : "No device seen yet."));
    td.colSpan = 7;
    rows.push(tr);
  }
  body.replaceChildren(...rows);
  const first = page.matched ? page.offset + 1 : 0;
  document.getElementById("range").textContent =
    first + "–" + (page.offset + page.items.length) + " of " + page.matched.toLocaleString("en-US")
    + (page.matched !== page.total ? " (" + page.total.toLocaleString("en-US") + " in all)" : "");
  document.getElementById("prev").disabled = page.offset === 0;
  document.getElementById("next").disabled = page.offset + page.items.length >= page.matched;
  S.dev.matched = page.matched;
}

function setup() {
  const d = S.dev;
  let searchTimer = null;
  document.getElementById("search").addEventListener("input", e => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { d.q = e.target.value; d.offset = 0; devicesSoon(true); }, 200);
  });
  document.getElementById("status").addEventListener("change", e => { d.status = e.target.value; d.offset = 0; devicesSoon(true); });
  document.getElementById("prev").addEventListener("click", () => { d.offset = Math.max(0, d.offset - PAGE); devicesSoon(true); });
  document.getElementById("next").addEventListener("click", () => {
    if (d.offset + PAGE < (d.matched || 0)) { d.offset += PAGE; devicesSoon(true); }
  });
  window.addEventListener("resize", () => { for (const v of S.views.values()) v.dirty = true; drawSoon(); });
  // the provisional band runs on to now, and "last seen" ages: redraw once a second
  setInterval(() => { for (const v of S.views.values()) v.dirty = true; drawSoon(); }, 1000);
  connect();
  devicesSoon(true);
}

setup();
