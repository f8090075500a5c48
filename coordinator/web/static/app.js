/* gptrm web console: applies the page's live deltas (server-sent events) to the server-rendered page.
   Every value is written with textContent or as a class name from a fixed set: never parsed as markup. */
"use strict";
(function () {
  const live = document.body.dataset.live;
  const timeX = {time: true};
  // Columns of chart data [times, series...]; one point gets an empty one five minutes before it, so that
  // the time axis spans minutes rather than years.
  function padded(data) {
    if (data[0].length !== 1) return data;
    return data.map((col, i) => [i === 0 ? col[0] - 300 : null].concat(col));
  }

  function setCells(row, cells) {
    for (const [k, v] of Object.entries(cells)) {
      const td = row.querySelector('td[data-k="' + CSS.escape(k) + '"]');
      if (!td) continue;
      const a = td.querySelector("a");
      (a || td).textContent = v;
      if (k === "state") td.className = "st-" + v;
    }
  }

  function newRow(table, id, cells) {
    const tr = document.createElement("tr");
    tr.id = table.id + ":" + id;
    for (const th of table.querySelectorAll("thead th")) {
      const k = th.dataset.k, td = document.createElement("td");
      td.dataset.k = k;
      if (table.dataset.link === k) {
        const a = document.createElement("a");
        a.href = table.dataset.href + "/" + encodeURIComponent(cells[k] || "");
        td.appendChild(a);
      }
      tr.appendChild(td);
    }
    setCells(tr, cells);
    return tr;
  }

  function applyRows(table, delta, newestFirst, cap) {
    if (!table) return;
    const body = table.tBodies[0];
    for (const [id, cells] of Object.entries(delta.upsert || {})) {
      const tr = document.getElementById(table.id + ":" + id);
      if (tr) setCells(tr, cells);
      else if (newestFirst) body.insertBefore(newRow(table, id, cells), body.firstChild);
      else body.appendChild(newRow(table, id, cells));
    }
    for (const id of delta.remove || []) {
      const tr = document.getElementById(table.id + ":" + id);
      if (tr) tr.remove();
    }
    while (cap && body.rows.length > cap) body.deleteRow(body.rows.length - 1);
  }

  function setFacts(dl, facts) {
    if (!dl) return;
    for (const [k, v] of Object.entries(facts)) {
      const dd = dl.querySelector('dd[data-k="' + CSS.escape(k) + '"]');
      if (dd) dd.textContent = v;
    }
  }

  function applyFleet(delta) {
    for (const [id, value] of Object.entries(delta.upsert || {})) {
      const node = document.getElementById("n:" + id);
      if (!node) { document.getElementById("added").hidden = false; continue; }
      const [cells, state] = value.split(" ");
      node.className = "n s-" + state;
      for (let i = 0; i < cells.length; i++) {
        let cell = node.children[i];
        if (!cell) { cell = document.createElement("i"); node.appendChild(cell); }
        cell.className = "c" + cells[i];
      }
    }
    for (const id of delta.remove || []) {
      const node = document.getElementById("n:" + id);
      if (node) node.remove();
    }
    if (delta.summary) setFacts(document.getElementById("summary"), delta.summary);
  }

  const charts = {}, chartData = {};
  function applyCharts(series) {
    if (!window.uPlot) return;
    for (const [sid, points] of Object.entries(series || {})) {
      const fig = document.getElementById("chart:" + sid);
      if (!fig || points.length === 0) continue;
      // The stream sends each point once: a chart keeps what it was sent, the last 360 points.
      const kept = (chartData[sid] = (chartData[sid] || []).concat(points).slice(-360));
      const data = padded([kept.map(p => p[0]), kept.map(p => p[1]), kept.map(p => p[2])]);
      if (charts[sid]) { charts[sid].setData(data); continue; }
      charts[sid] = new uPlot({
        width: Math.min(720, fig.clientWidth || 720), height: 220,
        scales: {x: timeX},
        series: [{}, {label: "load", stroke: "#1f77b4"}, {label: "forecast", stroke: "#ff7f0e", dash: [6, 4]}],
      }, data, fig);
    }
  }

  const elastic = document.getElementById("elastic-chart");
  if (elastic && window.uPlot) {
    const points = JSON.parse(elastic.dataset.points);
    new uPlot({width: Math.min(720, elastic.clientWidth || 720), height: 200, scales: {x: timeX},
               series: [{}, {label: "GPUs", stroke: "#1f77b4", paths: uPlot.paths.stepped({align: 1})}]},
              padded([points.map(p => p[0]), points.map(p => p[1])]), elastic);
  }

  if (window.uPlot) {
    for (const fig of document.querySelectorAll("figure.util-chart")) {
      const d = JSON.parse(fig.dataset.points), gpus = Object.keys(d.gpus);
      new uPlot({width: Math.min(720, fig.clientWidth || 720), height: 200, scales: {x: timeX, y: {range: [0, 100]}},
                 series: [{}].concat(gpus.map((g, i) => ({label: "GPU " + g, stroke: "hsl(" + (i * 47 % 360) + ",60%,45%)"})))},
                padded([d.t].concat(gpus.map(g => d.gpus[g]))), fig);
    }
  }

  if (!live || !window.EventSource) return;
  const table = document.querySelector("main table[data-key]");
  function onDelta(delta) {
    if (live.startsWith("/live/fleet")) applyFleet(delta);
    else if (document.getElementById("task")) {
      const u = delta.upsert || {};
      if (u.facts) setFacts(document.getElementById("task"), u.facts);
      if (u.history) applyRows(document.getElementById("history"), {upsert: u.history}, false, 0);
      if (u.parts) applyRows(document.getElementById("parts"), {upsert: u.parts}, false, 0);
    } else {
      const tasksOrEvents = table && (table.id === "tasks" || table.id === "events");
      applyRows(table, delta, tasksOrEvents, tasksOrEvents ? 500 : 0);
      if (delta.charts) applyCharts(delta.charts);
    }
  }

  const log = document.getElementById("log");
  let logStarted = false;
  const src = new EventSource(live);
  src.addEventListener("delta", e => onDelta(JSON.parse(e.data)));
  src.addEventListener("log", e => {
    if (!log) return;
    if (!logStarted) { log.textContent = ""; logStarted = true; }
    log.textContent += JSON.parse(e.data);
    if (log.textContent.length > 200000) log.textContent = log.textContent.slice(-150000);
    log.scrollTop = log.scrollHeight;
  });
  src.addEventListener("refused", e => { src.close(); document.body.dataset.liveState = "refused: " + JSON.parse(e.data); });
  src.addEventListener("open", () => { document.body.dataset.liveState = "open"; });
  src.addEventListener("error", () => { document.body.dataset.liveState = "reconnecting"; });
})();
