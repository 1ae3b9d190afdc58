// The admin page of a disque-py node: the cluster map, the live workers, the queues with their live
// rates, the dead letters and a job inspector, all read from the node's JSON API (/api/...). No framework and no build step.
// Every value from the API reaches the page through textContent or an attribute, never as HTML.
"use strict";

(function () {
  const REFRESH_MS = 1000;
  const REQUEST_TIMEOUT_MS = 8000;
  const HISTORY = 30; // samples kept per queue for the sparklines (one a second)
  const SPARK_W = 120;
  const SPARK_H = 24;
  const SVG_NS = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);

  // ---- small DOM helpers --------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = String(v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function setText(node, value) {
    const s = value === null || value === undefined ? "" : String(value);
    if (node.textContent !== s) node.textContent = s;
  }

  function fmtInt(n) {
    return typeof n === "number" && isFinite(n) ? n.toLocaleString("en-US") : "–";
  }

  function fmtBytes(n) {
    if (typeof n !== "number" || !isFinite(n)) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
  }

  // a running job's progress ({done, total, note}) as "3/10 note", or "" without one
function progressText(p) {
  if (!p || typeof p.done !== "number") return "";
  const n = typeof p.total === "number" ? p.done + "/" + p.total : String(p.done);
  return typeof p.note === "string" && p.note ? n + " " + p.note : n;
}

function fmtDuration(s) {
    if (typeof s !== "number" || !isFinite(s)) return "–";
    s = Math.floor(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d" + Math.floor((s % 86400) / 3600) + "h";
  }

  function fmtRate(r) {
    if (typeof r !== "number" || !isFinite(r)) return "–";
    return r >= 100 ? Math.round(r).toString() : r.toFixed(1);
  }

  // ---- errors: one banner, one line per source ----------------------------------------------

  const errors = new Map(); // source -> message

  function showError(source, message) {
    errors.set(source, message);
    renderErrors();
  }

  function clearError(source) {
    if (errors.delete(source)) renderErrors();
  }

  function renderErrors() {
    const list = $("error-list");
    list.replaceChildren(...[...errors.values()].map((m) => el("li", { "data-testid": "error-item", text: m })));
    $("error-banner").hidden = errors.size === 0;
  }

  // ---- the API --------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }

  async function api(method, path, body) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), REQUEST_TIMEOUT_MS);
    const init = { method, signal: ctl.signal, headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (exc) {
      const why = exc && exc.name === "AbortError" ? "no answer within " + REQUEST_TIMEOUT_MS / 1000 + " s" : String(exc && exc.message || exc);
      throw new ApiError(method + " " + path + ": the node cannot be reached (" + why + ")", 0);
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    const text = await resp.text();
    try {
      data = text ? JSON.parse(text) : null;
    } catch (exc) {
      data = null;
    }
    if (!resp.ok) {
      const detail = data && typeof data.error === "string" ? data.error : (text || resp.statusText).slice(0, 300);
      throw new ApiError(method + " " + path + ": " + resp.status + " " + detail, resp.status);
    }
    if (data === null) throw new ApiError(method + " " + path + ": the answer is not JSON", resp.status);
    return data;
  }

  const enc = encodeURIComponent;

  // ---- the confirmation dialog ----------------------------------------------------------------

  function confirmAction(message) {
    const dlg = $("confirm-dialog");
    setText($("confirm-message"), message);
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
      dlg.returnValue = "cancel";
      dlg.showModal();
      $("confirm-cancel").focus();
    });
  }

  // ---- the cluster map ------------------------------------------------------------------------

  function nodeAddress(n) {
    const ip = String(n.ip || "");
    return (ip.includes(":") ? "[" + ip + "]" : ip) + ":" + n.port;
  }

  function adminUrl(n) {
    const ip = String(n.ip || "");
    if (!Number.isInteger(n.admin_port) || n.admin_port <= 0 || !/^[0-9A-Za-z.:-]+$/.test(ip)) return null;
    return location.protocol + "//" + (ip.includes(":") ? "[" + ip + "]" : ip) + ":" + n.admin_port + "/";
  }

  function yesNo(v, goodWhen) {
    const s = v ? "yes" : "no";
    return el("span", { class: v === goodWhen ? "ok" : "bad", text: s });
  }

  function renderCluster(data) {
    const nodes = Array.isArray(data.nodes) ? data.nodes : [];
    setText($("myself"), data.myself ? "this node: " + String(data.myself).slice(0, 8) : "");
    setText($("node-count"), "(" + nodes.length + ")");
    const rows = nodes.map((n) => {
      const info = n.info || null;
      const flags = Array.isArray(n.flags) ? n.flags : [];
      const link = String(n.link || "");
      const url = adminUrl(n);
      const idCell = el("td", { class: "mono", title: String(n.id || "") }, String(n.id || "").slice(0, 8));
      const addr = url && !flags.includes("myself")
        ? el("a", { href: url, rel: "noopener noreferrer", title: "admin page of this node" }, nodeAddress(n))
        : nodeAddress(n);
      const bad = !n.reachable || flags.some((f) => f === "fail" || f === "pfail");
      return el("tr", {
        "data-testid": "node-row", "data-node-id": String(n.id || ""),
        "data-reachable": n.reachable ? "yes" : "no",
        class: (bad ? "unreachable" : "") + (flags.includes("myself") ? " myself" : ""),
      },
        idCell,
        el("td", { class: "mono" }, addr),
        el("td", {}, ...flags.map((f) => el("span", { class: "flag flag-" + String(f).replace(/[^a-z0-9-]/gi, ""), text: f }))),
        el("td", {}, el("span", { class: link === "connected" ? "ok" : "bad", text: link || "–" })),
        el("td", {}, n.leaving ? el("span", { class: "warn", text: "leaving" }) : el("span", { class: "muted", text: "no" })),
        el("td", { "data-testid": "node-reachable" }, n.reachable ? yesNo(true, true) : el("span", { class: "bad", text: "unreachable" })),
        el("td", { class: "num" }, info ? fmtInt(info.registered_jobs) : "–"),
        el("td", { class: "num" }, info ? fmtInt(info.registered_queues) : "–"),
        el("td", { class: "num" }, info ? fmtInt(info.connected_clients) : "–"),
        el("td", { class: "num" }, info ? fmtInt(info.blocked_clients) : "–"),
        el("td", { class: "num", "data-testid": "node-memory-data" }, info ? fmtBytes(info.used_memory) : "–"),
        el("td", { class: "num", "data-testid": "node-memory-rss" }, info ? fmtBytes(info.used_memory_rss) : "–"),
        el("td", { class: "num" }, info ? fmtDuration(info.uptime_in_seconds) : "–"),
        el("td", { class: "error-text", "data-testid": "node-error" }, n.error ? String(n.error) : ""),
      );
    });
    $("nodes-body").replaceChildren(...rows);
  }

  // ---- the workers ----------------------------------------------------------------------------
  // /api/workers: every node's WORKER LIST merged by worker ID, each with the jobs it runs (as of
  // its last beat); a job's ID opens it in the inspector.

  function renderWorkers(data) {
    const list = Array.isArray(data.workers) ? data.workers : [];
    setText($("worker-count"), "(" + list.length + ")");
    const rows = list.map((w) => {
      const running = Array.isArray(w.running) ? w.running : [];
      const jobs = running.map((j) => el("div", { class: "running-job", "data-testid": "worker-job", "data-job-id": String(j.id) },
        el("span", { "data-testid": "worker-job-label" }, String(j.label || w.handler || "")), " ",
        el("button", { type: "button", class: "link mono", title: "show the job", onclick: () => inspect(String(j.id)) }, String(j.id)),
        el("span", { class: "muted" }, " on " + String(j.queue) + (typeof j.running_for === "number" ? ", for " + fmtDuration(j.running_for) : "")),
        progressText(j.progress) ? el("span", { "data-testid": "worker-job-progress" }, " " + progressText(j.progress)) : null));
      const more = (w.running_total || 0) - running.length;
      if (more > 0) jobs.push(el("div", { class: "muted" }, "… " + fmtInt(more) + " more"));
      const queues = Array.isArray(w.queues) ? w.queues.map(String).join(", ") : "";
      return el("tr", { "data-testid": "worker-row", "data-worker-id": String(w.id), class: w.stopping ? "stopping" : "" },
        el("td", { class: "mono", title: "handler " + String(w.handler || "") + ", version " + String(w.version || "") }, String(w.id)),
        el("td", { class: "mono" }, String(w.host || "")),
        el("td", { class: "num" }, fmtInt(w.pid)),
        el("td", { class: "mono" }, queues),
        el("td", { class: "num" }, fmtInt(w.concurrency)),
        el("td", { class: "num", "data-testid": "worker-processed" }, fmtInt(w.processed)),
        el("td", { class: "num" }, fmtInt(w.failed)),
        el("td", { class: "num", title: "beats every " + String(w.interval) + " s to node " + String(w.node || "").slice(0, 8) },
          fmtDuration(w.last_beat_ago) + (w.stopping ? " (stopping)" : "")),
        el("td", { "data-testid": "worker-running" }, ...(jobs.length ? jobs : [el("span", { class: "muted" }, "idle")])),
      );
    });
    $("workers-body").replaceChildren(...rows);
    $("workers-empty").hidden = list.length > 0;
    showUnreachable("worker-nodes", "workers", data);
  }

  // the nodes a cluster-wide view could not ask: one line of the banner per view
  function showUnreachable(source, what, data) {
    const unreachable = Array.isArray(data.unreachable) ? data.unreachable : [];
    if (unreachable.length) showError(source, what + ": not asked: " + unreachable.map((u) => String(u.id).slice(0, 8) + " (" + String(u.error) + ")").join(", "));
    else clearError(source);
  }

  // GET a view and render it; its error goes to the banner, under source
  async function refreshView(source, path, render) {
    try {
      render(await api("GET", path));
      clearError(source);
    } catch (exc) {
      showError(source, String(exc.message || exc));
    }
  }

  const refreshWorkers = () => refreshView("workers", "/api/workers", renderWorkers);

  // ---- the stream consumers -------------------------------------------------------------------
  // /api/consumers: Spark queries by their connections' names in every node's CLIENT LIST, each
  // with its lag (its queues' queued jobs, the age of the oldest). CLIENT LIST lists every
  // connection of a node: asked every CONSUMERS_EVERY ticks only. It needs the admin right: a
  // caller without it sees why in the section, not in the banner at every refresh.
  const CONSUMERS_EVERY = 5;
  let consumerTicks = 0;

  function renderConsumers(data) {
    const list = Array.isArray(data.consumers) ? data.consumers : [];
    setText($("consumer-count"), "(" + list.length + (data.truncated ? "; too many queues: some not measured" : "") + ")");
    const rows = list.map((c) => {
      const perQueue = Array.isArray(c.per_queue) ? c.per_queue : [];
      const detail = perQueue.map((q) => String(q.name) + ": " + fmtInt(q.queued) + (q.oldest_age === null ? "" : ", oldest " + fmtDuration(q.oldest_age))).join("\n");
      const conns = Object.values(c.connections || {}).reduce((n, k) => n + (Number(k) || 0), 0);
      return el("tr", { "data-testid": "consumer-row", "data-consumer": String(c.name) },
        el("td", { class: "mono", title: String(c.kind || "") }, String(c.name)),
        el("td", { class: "mono", title: detail }, (Array.isArray(c.queues) ? c.queues : []).map(String).join(", ")),
        el("td", { class: "num", "data-testid": "consumer-queued" }, c.queued === null ? "–" : fmtInt(c.queued)),
        el("td", { class: "num", "data-testid": "consumer-oldest" }, c.oldest_age === null ? "–" : fmtDuration(c.oldest_age)),
        el("td", { class: "num", title: "on " + Object.keys(c.connections || {}).length + " node(s)" }, fmtInt(conns)),
        el("td", { class: "num" }, c.idle === null ? "–" : fmtDuration(c.idle)),
      );
    });
    $("consumers-body").replaceChildren(...rows);
    const empty = $("consumers-empty");
    if (empty.dataset.text) empty.textContent = empty.dataset.text;
    empty.hidden = list.length > 0;
    showUnreachable("consumer-nodes", "consumers", data);
  }

  async function refreshConsumers() {
    if (consumerTicks++ % CONSUMERS_EVERY !== 0) return;
    try {
      renderConsumers(await api("GET", "/api/consumers"));
      clearError("consumers");
    } catch (exc) {
      if (exc.status !== 403) {
        showError("consumers", String(exc.message || exc));
        return;
      }
      clearError("consumers");
      $("consumers-body").replaceChildren();
      setText($("consumer-count"), "");
      const empty = $("consumers-empty");
      if (!empty.dataset.text) empty.dataset.text = empty.textContent;
      empty.textContent = "Not shown: listing the nodes' connections (CLIENT LIST) needs the admin right.";
      empty.hidden = false;
    }
  }

  // ---- the groups -----------------------------------------------------------------------------
  // /api/groups: every node's GROUP LIST merged by group, the busiest first; past the API's
  // limit the others are one "_other" row (a bounded table whatever the number of tenants).

  function renderGroups(data) {
    const list = Array.isArray(data.groups) ? data.groups : [];
    setText($("group-count"), "(" + list.length + (data.truncated ? "+" : "") + ")");
    const num = (v) => (v === null || v === undefined ? "–" : fmtInt(v));
    const rows = list.map((g) => el("tr", { "data-testid": "group-row", "data-group": String(g.name) },
      el("td", { class: "mono" }, String(g.name) + (g.groups ? " (" + fmtInt(g.groups) + " groups)" : "")),
      el("td", { class: "num" }, num(g.weight)),
      el("td", { class: "num", "data-testid": "group-active" }, fmtInt(g.active)),
      el("td", { class: "num", "data-testid": "group-waiting" }, fmtInt(g.waiting)),
      el("td", { class: "num", "data-testid": "group-limit" }, num(g.concurrency)),
      el("td", { class: "num" }, g.rate === null || g.rate === undefined ? "–" : String(g.rate)),
      el("td", {}, g.held ? "yes" : ""),
    ));
    $("groups-body").replaceChildren(...rows);
    $("groups-empty").hidden = list.length > 0;
    showUnreachable("group-nodes", "groups", data);
  }

  const refreshGroups = () => refreshView("groups", "/api/groups", renderGroups);

  // ---- the queues -----------------------------------------------------------------------------

  // name -> {prev: {t, jin, jout}, hist: [{in, out}], row, cells, data}
  const queues = new Map();

  function sparkline(hist) {
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("width", SPARK_W);
    svg.setAttribute("height", SPARK_H);
    svg.setAttribute("viewBox", "0 0 " + SPARK_W + " " + SPARK_H);
    svg.setAttribute("class", "spark");
    svg.setAttribute("data-testid", "queue-spark");
    let max = 0;
    for (const h of hist) max = Math.max(max, h.in, h.out);
    const scale = max > 0 ? (SPARK_H - 2) / max : 0;
    const step = SPARK_W / (HISTORY - 1);
    const x0 = SPARK_W - (hist.length - 1) * step;
    for (const key of ["in", "out"]) {
      if (hist.length < 2) break;
      const pts = hist.map((h, i) => (x0 + i * step).toFixed(1) + "," + (SPARK_H - 1 - h[key] * scale).toFixed(1));
      const line = document.createElementNS(SVG_NS, "polyline");
      line.setAttribute("points", pts.join(" "));
      line.setAttribute("class", "spark-" + key);
      svg.append(line);
    }
    const title = document.createElementNS(SVG_NS, "title");
    title.textContent = "peak " + fmtRate(max) + " jobs/s over the last " + hist.length + " samples";
    svg.append(title);
    return svg;
  }

  function pauseLabel(p) {
    return p === "none" || !p ? "–" : p;
  }

  function queueRow(name) {
    const cells = {
      name: el("td", { class: "mono qname" }, el("button", { type: "button", class: "link", "data-testid": "queue-name", title: "show this queue", onclick: () => showQueue(name) }, name)),
      len: el("td", { class: "num", "data-testid": "queue-len" }),
      blocked: el("td", { class: "num", "data-testid": "queue-blocked" }),
      paused: el("td", { "data-testid": "queue-paused" }),
      rin: el("td", { class: "num", "data-testid": "queue-rate-in" }),
      rout: el("td", { class: "num", "data-testid": "queue-rate-out" }),
      spark: el("td", { class: "spark-cell" }),
    };
    const mode = el("select", { "data-testid": "queue-pause-mode", "aria-label": "pause mode" },
      el("option", { value: "all", text: "all" }), el("option", { value: "in", text: "in" }), el("option", { value: "out", text: "out" }));
    const pauseBtn = el("button", { type: "button", class: "small", "data-testid": "queue-pause", onclick: () => pauseQueue(name, mode.value) }, "Pause");
    const resumeBtn = el("button", { type: "button", class: "small", "data-testid": "queue-unpause", onclick: () => pauseQueue(name, "none") }, "Unpause");
    const actions = el("td", {}, el("div", { class: "actions-cell" }, mode, pauseBtn, resumeBtn));
    const row = el("tr", { "data-testid": "queue-row", "data-queue": name },
      cells.name, cells.len, cells.blocked, cells.paused, cells.rin, cells.rout, cells.spark, actions);
    return { row, cells, resumeBtn };
  }

  function updateQueues(data) {
    const t = typeof data.time === "number" ? data.time : Date.now() / 1000;
    const list = Array.isArray(data.queues) ? data.queues : [];
    const seen = new Set();
    for (const q of list) {
      const name = String(q.name);
      seen.add(name);
      let st = queues.get(name);
      if (!st) {
        st = { prev: null, hist: [], ...queueRow(name) };
        queues.set(name, st);
      }
      let rin = null, rout = null;
      if (st.prev && t > st.prev.t) {
        const dt = t - st.prev.t;
        // a counter that went down (a node restarted, or left) counts as no traffic in that interval
        rin = Math.max(0, (q.jobs_in - st.prev.jin) / dt);
        rout = Math.max(0, (q.jobs_out - st.prev.jout) / dt);
        st.hist.push({ in: rin, out: rout });
        if (st.hist.length > HISTORY) st.hist.shift();
      } else if (st.hist.length) {
        const last = st.hist[st.hist.length - 1];
        rin = last.in; rout = last.out;
      }
      if (!st.prev || t > st.prev.t) st.prev = { t, jin: q.jobs_in, jout: q.jobs_out };
      st.data = q;
      setText(st.cells.len, fmtInt(q.len));
      setText(st.cells.blocked, fmtInt(q.blocked));
      setText(st.cells.paused, pauseLabel(q.paused));
      st.cells.paused.className = q.paused && q.paused !== "none" ? "warn" : "muted";
      st.row.dataset.paused = String(q.paused || "none");
      st.resumeBtn.disabled = !q.paused || q.paused === "none";
      setText(st.cells.rin, rin === null ? "…" : fmtRate(rin));
      setText(st.cells.rout, rout === null ? "…" : fmtRate(rout));
      st.row.dataset.rateIn = rin === null ? "" : String(rin);
      st.row.dataset.rateOut = rout === null ? "" : String(rout);
      st.cells.spark.replaceChildren(sparkline(st.hist));
    }
    for (const name of [...queues.keys()]) if (!seen.has(name)) queues.delete(name);
    $("queues-truncated").hidden = !data.truncated;
    renderQueueOrder(list.map((q) => String(q.name)));
  }

  function renderQueueOrder(order) {
    const needle = $("queue-filter").value.trim().toLowerCase();
    const shown = order.filter((n) => !needle || n.toLowerCase().includes(needle));
    const body = $("queues-body");
    const rows = shown.map((n) => queues.get(n).row);
    // move rows only when the order changed: keeps focus and selection inside the table
    const current = [...body.children];
    if (current.length !== rows.length || current.some((r, i) => r !== rows[i])) body.replaceChildren(...rows);
    setText($("queue-count"), needle ? "(" + shown.length + " of " + order.length + ")" : "(" + order.length + ")");
    $("queues-empty").hidden = shown.length > 0;
    setText($("queues-empty"), order.length ? "No queue matches the filter." : "No queues.");
  }

  let lastOrder = [];

  async function pauseQueue(name, mode) {
    const what = mode === "none" ? "Unpause queue “" + name + "” on every node?" : "Pause queue “" + name + "” (" + mode + ") on every node?";
    if (!(await confirmAction(what))) return;
    try {
      const r = await api("POST", "/api/queues/" + enc(name) + "/pause", { mode });
      clearError("pause");
      const st = queues.get(name);
      if (st && r && typeof r.paused === "string") {
        setText(st.cells.paused, pauseLabel(r.paused));
        st.row.dataset.paused = r.paused;
        st.resumeBtn.disabled = r.paused === "none";
      }
      refreshQueues();
    } catch (exc) {
      showError("pause", String(exc.message || exc));
    }
  }

  async function showQueue(name) {
    const panel = $("queue-detail");
    try {
      const q = await api("GET", "/api/queues/" + enc(name));
      clearError("queue");
      const jobs = Array.isArray(q.jobs) ? q.jobs : [];
      const close = el("button", { type: "button", class: "small", "data-testid": "queue-detail-close", onclick: () => { panel.hidden = true; } }, "close");
      panel.replaceChildren(
        el("h3", {}, "Queue ", el("span", { class: "mono", text: String(q.name) }), " ", close),
        el("p", { class: "muted" },
          "length " + fmtInt(q.len) + " · blocked " + fmtInt(q.blocked) + " · paused " + pauseLabel(q.paused) +
          " · age " + fmtDuration(q.age) + " · idle " + fmtDuration(q.idle) +
          (Array.isArray(q.import_from) && q.import_from.length ? " · imports from " + q.import_from.map((x) => String(x).slice(0, 8)).join(", ") : "")),
        jobs.length
          ? el("table", { class: "jobs", "data-testid": "queue-jobs" },
            el("thead", {}, el("tr", {}, el("th", {}, "first jobs"), el("th", {}, "body"))),
            el("tbody", {}, ...jobs.map((j) => el("tr", {},
              el("td", { class: "mono" }, el("button", { type: "button", class: "link", "data-testid": "queue-job", onclick: () => inspect(String(j.id)) }, String(j.id))),
              el("td", { class: "body-preview" }, String(j.body === undefined ? "" : j.body).slice(0, 120))))))
          : el("p", { class: "muted" }, "No queued jobs."),
      );
      panel.hidden = false;
    } catch (exc) {
      showError("queue", String(exc.message || exc));
    }
  }

  // ---- the job inspector ----------------------------------------------------------------------

  let currentJob = null;

  const JOB_FIELDS = [
    ["id", "ID"], ["queue", "queue"], ["state", "state"], ["repl", "replication"], ["ttl", "TTL (s)"],
    ["ctime", "created"], ["delay", "delay (s)"], ["retry", "retry (s)"], ["nacks", "nacks"],
    ["additional_deliveries", "additional deliveries"], ["nodes_delivered", "nodes delivered"],
    ["nodes_confirmed", "nodes confirmed"], ["next_requeue_within", "next requeue within"],
    ["next_awake_within", "next awake within"], ["dedup", "dedup key"], ["node", "answered by"],
  ];
  // shown only for the jobs that have them
  const OPTIONAL_JOB_FIELDS = new Set(["dedup"]);

  function fieldValue(key, v) {
    if (v === null || v === undefined) return "–";
    if (Array.isArray(v)) return v.length ? v.map((x) => String(x).slice(0, 8)).join(", ") : "none";
    if (key === "ctime" && typeof v === "number") {
      // Disque's ctime is in nanoseconds-ish units when large; show a date when it reads as one
      const secs = v > 1e17 ? v / 1e9 : v > 1e14 ? v / 1e6 : v > 1e11 ? v / 1e3 : v;
      const d = new Date(secs * 1000);
      return isNaN(d.getTime()) ? String(v) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    }
    if (key === "node") return String(v).slice(0, 8);
    if (key === "dedup") return String(v);
    if ((key === "next_requeue_within" || key === "next_awake_within") && typeof v === "number") {
      return v >= 1000 ? (v / 1000).toFixed(1) + " s" : v + " ms";
    }
    if ((key === "ttl" || key === "retry" || key === "delay") && typeof v === "number" && v >= 60) {
      return v + " (" + fmtDuration(v) + ")";
    }
    return String(v);
  }

  function renderJob(job) {
    const fields = JOB_FIELDS.filter(([key]) => !OPTIONAL_JOB_FIELDS.has(key) || (job[key] !== null && job[key] !== undefined));
    const rows = fields.map(([key, label]) => el("tr", { "data-field": key },
      el("th", {}, label),
      el("td", { class: key === "id" || key === "queue" ? "mono" : "", "data-testid": "job-field-" + key, title: Array.isArray(job[key]) ? job[key].join("\n") : null }, fieldValue(key, job[key]))));
    const bodyText = job.body === undefined || job.body === null ? "" : String(job.body);
    rows.push(el("tr", { "data-field": "body" },
      el("th", {}, "body", job.body_encoding && job.body_encoding !== "utf-8" ? el("div", { class: "muted", text: "(" + job.body_encoding + ")" }) : null),
      el("td", {}, el("pre", { class: "body", "data-testid": "job-field-body" }, bodyText))));
    $("job-body").replaceChildren(...rows);
    $("job-view").hidden = false;
    $("job-view").dataset.state = String(job.state || "");
  }

  function jobMessage(text) {
    const p = $("job-message");
    setText(p, text || "");
    p.hidden = !text;
  }

  async function inspect(id, quiet) {
    id = String(id || "").trim();
    $("job-id").value = id;
    if (!id) return;
    if (!quiet) { $("job-result").hidden = true; }
    try {
      const job = await api("GET", "/api/jobs/" + enc(id));
      clearError("job");
      currentJob = String(job.id || id);
      jobMessage("");
      renderJob(job);
    } catch (exc) {
      if (quiet && exc.status === 404) {
        jobMessage("Job " + id + " is no longer known to any node.");
        $("job-view").hidden = true;
        currentJob = null;
        return;
      }
      $("job-view").hidden = true;
      currentJob = null;
      jobMessage(exc.status === 404 ? "No node knows job " + id + "." : "");
      showError("job", String(exc.message || exc));
    }
  }

  const ACTION_TEXT = {
    ack: "Acknowledge job %s (ACKJOB)? It will be deleted from the cluster.",
    nack: "Put job %s back in its queue (NACK)?",
    dequeue: "Remove job %s from its queue (DEQUEUE)?",
  };

  async function jobAction(action) {
    const id = currentJob;
    if (!id) return;
    if (!(await confirmAction(ACTION_TEXT[action].replace("%s", id)))) return;
    const out = $("job-result");
    try {
      const r = await api("POST", "/api/jobs/" + enc(id) + "/" + action);
      clearError("job-action");
      setText(out, action + " " + id + ": result " + String(r && r.result));
      out.dataset.action = action;
      out.dataset.result = String(r && r.result);
      out.hidden = false;
      await inspect(id, true);
    } catch (exc) {
      setText(out, action + " " + id + " failed");
      out.dataset.action = action;
      out.dataset.result = "error";
      out.hidden = false;
      showError("job-action", String(exc.message || exc));
    }
  }

  // ---- dead letters ---------------------------------------------------------------------------
  // /api/dead lists the dead-letter queues, /api/dead/{name} their jobs; requeue and purge are the
  // steps `disque-py dead` runs (ADDJOB to the original queue then ACKJOB; ACKJOB).

  const DEAD_EVERY = 5; // refreshed every this many ticks (a scan of every node's jobs)
  let deadTicks = 0;
  let deadShown = null; // the queue whose jobs are shown
  const deadTraceOpen = new Set(); // the dead letters whose traceback is unfolded (kept over refreshes)

  // A dead letter's traceback (the last failure's, NACK ... TRACE), folded in a row of its own
  // under the job's; as text, like every value.
  function deadTraceRow(j) {
    const id = String(j.id);
    const toggle = (e) => { if (e.target.open) deadTraceOpen.add(id); else deadTraceOpen.delete(id); };
    return el("tr", { class: "trace-row", "data-testid": "dead-job-trace-row", "data-id": id },
      el("td", { colspan: "7" },
        el("details", { "data-testid": "dead-job-trace", "data-id": id, open: deadTraceOpen.has(id), ontoggle: toggle },
          el("summary", {}, "traceback of the last failure"),
          el("pre", { class: "trace", "data-testid": "dead-job-trace-text" }, String(j.traceback)))));
  }

  function renderDead(data) {
    const list = Array.isArray(data.queues) ? data.queues : [];
    setText($("dead-count"), "(" + list.length + ")");
    const rows = list.map((q) => {
      const name = String(q.name);
      const from = Object.entries(q.original_queues || {}).map(([k, v]) => k + " (" + fmtInt(v) + ")").join(", ");
      return el("tr", { "data-testid": "dead-row", "data-queue": name },
        el("td", { class: "mono qname" }, el("button", { type: "button", class: "link", "data-testid": "dead-name", title: "show its jobs", onclick: () => showDead(name) }, name)),
        el("td", { class: "num", "data-testid": "dead-jobs" }, fmtInt(q.count)),
        el("td", { class: "mono", "data-testid": "dead-from" }, from),
        el("td", { class: "num" }, fmtDuration(q.oldest_age)),
        el("td", {}, el("div", { class: "actions-cell" },
          el("button", { type: "button", class: "small", "data-testid": "dead-requeue-all", onclick: () => deadAction(name, "requeue", null) }, "Requeue all"),
          el("button", { type: "button", class: "small danger", "data-testid": "dead-purge-all", onclick: () => deadAction(name, "purge", null) }, "Purge all"))));
    });
    $("dead-body").replaceChildren(...rows);
    $("dead-empty").hidden = list.length > 0;
    showUnreachable("dead-nodes", "dead letters", data);
  }

  async function refreshDead() {
    await refreshView("dead", "/api/dead", renderDead);
    if (deadShown !== null) await showDead(deadShown, true);
  }

  async function showDead(name, quiet) {
    const panel = $("dead-detail");
    try {
      const q = await api("GET", "/api/dead/" + enc(name));
      clearError("dead-queue");
      deadShown = name;
      const jobs = Array.isArray(q.jobs) ? q.jobs : [];
      const close = el("button", { type: "button", class: "small", "data-testid": "dead-detail-close", onclick: () => { panel.hidden = true; deadShown = null; } }, "close");
      panel.replaceChildren(
        el("h3", {}, "Dead letters of ", el("span", { class: "mono", text: String(q.name) }), " ", close),
        el("p", { class: "muted" }, fmtInt(q.count) + " job" + (q.count === 1 ? "" : "s") + (q.truncated ? " (the oldest shown)" : "")),
        jobs.length
          ? el("table", { class: "jobs", "data-testid": "dead-jobs-table" },
            el("thead", {}, el("tr", {}, el("th", {}, "job"), el("th", {}, "original queue"), el("th", { class: "num" }, "deliveries"),
              el("th", {}, "reason"), el("th", { class: "num" }, "age"), el("th", {}, "body"), el("th", {}, "actions"))),
            el("tbody", {}, ...jobs.flatMap((j) => [el("tr", { "data-testid": "dead-job", "data-id": String(j.id) },
              el("td", { class: "mono" }, el("button", { type: "button", class: "link", title: "original job " + String(j.original_id), onclick: () => inspect(String(j.id)) }, String(j.id))),
              el("td", { class: "mono", "data-testid": "dead-job-origin" }, String(j.original_queue)),
              el("td", { class: "num", "data-testid": "dead-job-deliveries" }, fmtInt(j.deliveries)),
              el("td", { "data-testid": "dead-job-reason" }, j.reason === null || j.reason === undefined ? "–" : String(j.reason)),
              el("td", { class: "num" }, fmtDuration(j.age)),
              el("td", { class: "body-preview" }, String(j.body === undefined ? "" : j.body).slice(0, 80)),
              el("td", {}, el("div", { class: "actions-cell" },
                el("button", { type: "button", class: "small", "data-testid": "dead-job-requeue", onclick: () => deadAction(name, "requeue", String(j.id)) }, "Requeue"),
                el("button", { type: "button", class: "small danger", "data-testid": "dead-job-purge", onclick: () => deadAction(name, "purge", String(j.id)) }, "Purge")))),
              typeof j.traceback === "string" && j.traceback ? deadTraceRow(j) : null])))
          : el("p", { class: "muted", "data-testid": "dead-detail-empty" }, "No dead letters in this queue."),
      );
      panel.hidden = false;
    } catch (exc) {
      if (!quiet) showError("dead-queue", String(exc.message || exc));
    }
  }

  async function deadAction(name, action, id) {
    const what = id === null ? "every dead letter of “" + name + "”" : "dead letter " + id;
    const text = action === "requeue"
      ? "Requeue " + what + " to its original queue (ADDJOB, then ACKJOB of the dead letter)?"
      : "Purge " + what + " (ACKJOB)? It cannot be recovered.";
    if (!(await confirmAction(text))) return;
    const out = $("dead-result");
    try {
      const r = await api("POST", "/api/dead/" + enc(name) + "/" + action, id === null ? { all: true } : { ids: [id] });
      const failed = Object.keys(r.errors || {}).length;
      setText(out, action + " " + name + ": " + fmtInt(r.done) + " done" + (failed ? ", " + failed + " failed" : ""));
      out.dataset.action = action;
      out.dataset.done = String(r.done);
      out.hidden = false;
      if (failed) showError("dead-action", action + ": " + Object.entries(r.errors).map(([k, v]) => k + ": " + v).join("; "));
      else clearError("dead-action");
    } catch (exc) {
      setText(out, action + " " + name + " failed");
      out.dataset.action = action;
      out.dataset.done = "error";
      out.hidden = false;
      showError("dead-action", String(exc.message || exc));
    }
    await refreshDead();
  }

  // ---- the refresh loop -----------------------------------------------------------------------

  function setStatus(ok, text) {
    const s = $("conn-status");
    setText(s, text);
    s.className = "status " + (ok ? "up" : "down");
    s.dataset.state = ok ? "connected" : "unreachable";
  }

  async function refreshCluster() {
    try {
      const data = await api("GET", "/api/cluster");
      renderCluster(data);
      clearError("cluster");
      return true;
    } catch (exc) {
      showError("cluster", String(exc.message || exc));
      return exc.status !== 0;
    }
  }

  let queuesAsked = 0;

  async function refreshQueues() {
    const asked = ++queuesAsked;
    try {
      const data = await api("GET", $("queue-all").checked ? "/api/queues?all=1" : "/api/queues");
      if (asked !== queuesAsked) return true; // a later ask (the toggle's) shows its own answer
      updateQueues(data);
      lastOrder = (Array.isArray(data.queues) ? data.queues : []).map((q) => String(q.name));
      clearError("queues");
      return true;
    } catch (exc) {
      showError("queues", String(exc.message || exc));
      return exc.status !== 0;
    }
  }

  let timer = null;
  let ticking = false;

  async function tick() {
    timer = null;
    if (ticking) return;
    ticking = true;
    const dead = deadTicks++ % DEAD_EVERY === 0 ? refreshDead() : null;
    const [a, b] = await Promise.all([refreshCluster(), refreshQueues(), refreshWorkers(), dead, refreshGroups(), refreshConsumers()]);
    if (a && b) setStatus(true, "connected");
    else if (!a && !b) setStatus(false, "node unreachable");
    else setStatus(false, "partial");
    setText($("updated"), "updated " + new Date().toLocaleTimeString());
    ticking = false;
    if ($("auto-refresh").checked) timer = setTimeout(tick, REFRESH_MS);
  }

  function init() {
    $("error-dismiss").addEventListener("click", () => { errors.clear(); renderErrors(); });
    $("queue-filter").addEventListener("input", () => renderQueueOrder(lastOrder));
    $("queue-all").addEventListener("change", () => refreshQueues());
    $("dead-refresh").addEventListener("click", () => refreshDead());
    $("job-form").addEventListener("submit", (ev) => { ev.preventDefault(); inspect($("job-id").value); });
    for (const b of document.querySelectorAll("#job-view [data-action]")) {
      b.addEventListener("click", () => jobAction(b.dataset.action));
    }
    $("auto-refresh").addEventListener("change", () => {
      if ($("auto-refresh").checked && timer === null && !ticking) tick();
    });
    const hash = decodeURIComponent(location.hash.slice(1));
    if (hash.startsWith("D-")) inspect(hash);
    tick();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
