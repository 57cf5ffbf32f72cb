// The holdfast status page: polls status.json while the tab is visible and
// draws it. Every string from the server (names, subjects, reasons) goes
// in with textContent, never as markup.
"use strict";

(function () {
  const interval = 3000; // ms between two polls
  let timer = null;
  let polling = false;
  let lastUpdate = 0;

  // el makes an element with a class and a text.
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function byId(id) { return document.getElementById(id); }

  function num(n) { return (n === undefined || n === null) ? "-" : Number(n).toLocaleString("en-US"); }

  function bytes(n) {
    if (n === undefined || n === null || n < 0) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
  }

  function pct(r) { return (100 * r).toFixed(r < 0.1 ? 1 : 0) + "%"; }

  // ago is how long before now t was, or "-" for none.
  function ago(t) {
    if (!t || t.startsWith("0001-")) return "-";
    const s = Math.max(0, (Date.now() - Date.parse(t)) / 1000);
    if (s < 90) return s.toFixed(s < 10 ? 1 : 0) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " d ago";
  }

  function duration(seconds) {
    if (!seconds) return "-";
    if (seconds < 120) return seconds + " s";
    if (seconds < 7200) return Math.round(seconds / 60) + " min";
    if (seconds < 172800) return Math.round(seconds / 3600) + " h";
    return Math.round(seconds / 86400) + " d";
  }

  // meter is a bar of ratio r (0..1), warning from 80%.
  function meter(r) {
    const m = el("div", "meter" + (r >= 0.95 ? " full" : r >= 0.8 ? " high" : ""));
    const bar = el("span");
    bar.style.width = Math.min(100, Math.max(0, 100 * r)).toFixed(1) + "%";
    m.appendChild(bar);
    return m;
  }

  // card starts a card titled title, keyed by data-KIND=name for tests
  // and scripts, and returns it with its list of fields.
  function card(kind, name, title, tags) {
    const c = el("div", "card");
    c.dataset[kind] = name;
    const h = el("h3", null, title);
    for (const t of tags || []) h.appendChild(el("span", "tag", t));
    c.appendChild(h);
    const dl = el("dl");
    c.appendChild(dl);
    return { card: c, dl: dl };
  }

  // field adds a row to dl; value is text or an element. field names the
  // row (data-field) so that a test can read it.
  function field(dl, label, value, field, cls) {
    const dd = el("dd", cls);
    if (value instanceof Node) dd.appendChild(value); else dd.textContent = String(value);
    if (field) dd.dataset.field = field;
    dl.append(el("dt", null, label), dd);
    return dd;
  }

  function verdict(st) {
    if (!st.health) return "unknown";
    if (st.health.status === "ok" && !st.healthy) return "degraded";
    return st.health.status;
  }

  function renderHealth(st) {
    const v = verdict(st);
    byId("health").className = v;
    byId("verdict").textContent = v;
    const list = byId("reasons");
    list.replaceChildren();
    const h = st.health || {};
    const problems = (h.problems || []).concat(st.problems || []);
    if (st.error && problems.indexOf(st.error) < 0) problems.unshift(st.error);
    for (const p of problems) list.appendChild(el("li", "bad", p));
    for (const w of h.warnings || []) list.appendChild(el("li", "warn", w));
  }

  function renderMeta(st) {
    const d = st.daemon;
    byId("meta").textContent = d ? d.server_name + " · " + d.version + " · pid " + d.pid + " · started " + ago(d.started) : "";
    if (d) document.title = "holdfast " + d.server_name + " (" + verdict(st) + ")";
  }

  function usage(dl, label, u, key) {
    const text = bytes(u.used) + (u.limit > 0 ? " of " + bytes(u.limit) + " (" + pct(u.used / u.limit) + ")" : "");
    const dd = field(dl, label, text, key);
    if (u.limit > 0) dd.appendChild(meter(u.used / u.limit));
  }

  function renderStore(st) {
    const js = st.jetstream || {};
    const box = byId("store");
    box.replaceChildren();
    const dl = el("dl");
    box.appendChild(dl);
    if (!js.enabled) {
      field(dl, "JetStream", "not available: " + (js.error || "unknown"), "jetstream", "bad");
      return;
    }
    usage(dl, "file", js.file, "file");
    usage(dl, "memory", js.memory, "memory");
    field(dl, "directory", js.store_dir || "-", "store_dir");
    if (js.disk_size) {
      const used = 1 - js.disk_free / js.disk_size;
      const dd = field(dl, "disk", bytes(js.disk_free) + " free of " + bytes(js.disk_size), "disk", used >= 0.9 ? "warn" : null);
      dd.appendChild(meter(used));
    }
    field(dl, "sync", js.sync || "-", "sync");
    if (js.domain) field(dl, "domain", js.domain, "domain");
    field(dl, "streams / consumers", num(js.streams) + " / " + num(js.consumers));
  }

  function limit(dl, label, value, ratio, key) {
    const dd = field(dl, label, value + (ratio !== undefined ? " (" + pct(ratio) + ")" : ""), key);
    if (ratio !== undefined) dd.appendChild(meter(ratio));
  }

  function renderStreams(st) {
    const box = byId("streams");
    box.replaceChildren();
    for (const s of st.streams || []) {
      const tags = [];
      if (s.dead_letter) tags.push("dead letters");
      if (s.group_commit === "on") tags.push("group commit");
      const { card: c, dl } = card("stream", s.name, s.name, tags);
      if (!s.exists) {
        field(dl, s.unknown ? "unknown" : "missing", s.error || "does not exist", "error", "bad");
        box.appendChild(c);
        continue;
      }
      const r = s.limit_ratio || {};
      field(dl, "messages", num(s.messages), "messages");
      field(dl, "bytes", bytes(s.bytes), "bytes");
      if (s.max_msgs > 0) limit(dl, "max_msgs", num(s.max_msgs), r.max_msgs, "max_msgs");
      if (s.max_bytes > 0) limit(dl, "max_bytes", bytes(s.max_bytes), r.max_bytes, "max_bytes");
      if (s.max_age_seconds > 0) limit(dl, "max_age", duration(s.max_age_seconds), r.max_age, "max_age");
      field(dl, "discard", s.discard || "-");
      field(dl, "first / last seq", num(s.first_seq) + " / " + num(s.last_seq), "seqs");
      field(dl, "last message", ago(s.last_time), "last_time");
      if (s.subjects) field(dl, "subjects", s.subjects.join(" "), "subjects");
      let gc = s.group_commit || "off";
      const g = s.group_commit_stats;
      if (gc === "on" && g && g.batches > 0) gc += ": " + num(g.batches) + " batches, avg " + (g.batched_msgs / g.batches).toFixed(1) + " msgs";
      field(dl, "group commit", gc, "group_commit");
      if (s.leader && s.replicas && s.replicas.length) field(dl, "leader", s.leader, "leader");
      box.appendChild(c);
    }
  }

  function workersText(c) {
    const w = c.workers;
    if (!w) return "unknown (the daemon did not answer)";
    if (w.configured === 0) return "none (read by other clients)";
    if (w.draining) return w.configured + " draining for a reload (" + w.in_flight + " busy)";
    if (!w.running) return w.configured + " NOT RUNNING";
    return w.configured + " (" + w.in_flight + " busy)";
  }

  function renderFailure(c, f) {
    const box = el("div", "failure");
    box.dataset.field = "last_failure";
    box.appendChild(el("div", "muted",
      (f.dead_lettered ? "last failure, dead-lettered, " : "last failure, retried, ") + ago(f.time) +
      ": seq " + f.stream_seq + ", delivery " + f.delivery + ", subject "));
    box.lastChild.appendChild(el("span", "text", f.subject));
    box.appendChild(el("div", "text", f.reason));
    c.appendChild(box);
  }

  // chart draws a consumer's last 15 minutes (history: {t, backlog,
  // acked} every 10 s) as two lines in an inline SVG: the backlog, and
  // the messages handled per second between two samples.
  function chart(history) {
    const svgNS = "http://www.w3.org/2000/svg";
    const w = 300, h = 40;
    const wrap = el("div", "chart");
    if (!history || history.length < 2) {
      wrap.appendChild(el("span", "muted", "chart: a point every 10 s, from a minute after start"));
      return wrap;
    }
    const t0 = Date.parse(history[0].t), t1 = Date.parse(history[history.length - 1].t);
    const span = Math.max(1, t1 - t0);
    const rates = history.map(function (s, i) {
      if (i === 0) return 0;
      const dt = (Date.parse(s.t) - Date.parse(history[i - 1].t)) / 1000;
      return dt > 0 && s.acked >= history[i - 1].acked ? (s.acked - history[i - 1].acked) / dt : 0;
    });
    function line(values, cls) {
      const top = Math.max(1, Math.max.apply(null, values));
      const pts = values.map(function (v, i) {
        const x = (Date.parse(history[i].t) - t0) / span * w;
        const y = h - 2 - v / top * (h - 4);
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" ");
      const p = document.createElementNS(svgNS, "polyline");
      p.setAttribute("points", pts);
      p.setAttribute("class", cls);
      return { p: p, top: top };
    }
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("preserveAspectRatio", "none");
    const backlog = line(history.map(function (s) { return s.backlog; }), "backlog");
    const rate = line(rates, "rate");
    svg.append(backlog.p, rate.p);
    wrap.appendChild(svg);
    const now = history[history.length - 1];
    const legend = el("div", "muted", "last " + Math.round(span / 60000) + " min: backlog " + num(now.backlog) +
      " (max " + num(backlog.top) + "), handled " + rates[rates.length - 1].toFixed(1) + "/s (max " + rate.top.toFixed(1) + "/s)");
    legend.dataset.field = "chart";
    wrap.appendChild(legend);
    return wrap;
  }

  function renderConsumers(st) {
    const box = byId("consumers");
    box.replaceChildren();
    for (const co of st.consumers || []) {
      const tags = [co.stream];
      if (co.handler && co.workers && co.workers.configured > 0) tags.push(co.handler);
      const { card: c, dl } = card("consumer", co.stream + "/" + co.name, co.name, tags);
      if (!co.exists) {
        field(dl, co.unknown ? "unknown" : "missing", co.error || "does not exist", "error", "bad");
      }
      field(dl, "backlog", num(co.pending), "pending", co.pending > 0 ? "warn" : null);
      field(dl, "ack pending", num(co.ack_pending) + " / " + num(co.max_ack_pending), "ack_pending");
      field(dl, "redelivered", num(co.redelivered), "redelivered");
      field(dl, "workers", workersText(co), "workers", co.workers && co.workers.configured > 0 && !co.workers.running ? "bad" : null);
      const w = co.workers;
      if (w && w.configured > 0) {
        field(dl, "handled", num(w.processed) + " (" + num(w.acked) + " acked, " + num(w.retried) + " retried, " +
          num(w.dead_lettered) + " dead-lettered)", "handled");
        if (w.dead_letter_error) field(dl, "dead letter failing", w.dead_letter_error, "dead_letter_error", "bad");
      }
      if (co.dead_letter_stream) {
        field(dl, "dead letters", num(co.dead_letters) + " in " + co.dead_letter_stream, "dead_letters",
          co.dead_letters > 0 ? "warn" : null);
      }
      if (co.lost_to_retention) field(dl, "lost to retention", num(co.lost_to_retention), "lost", "bad");
      if (co.stalled) field(dl, "stalled", "yes", "stalled", "bad");
      if (co.filter_subject) field(dl, "filter", co.filter_subject, "filter_subject");
      for (const wa of co.warnings || []) c.appendChild(el("div", "warn text", wa));
      if (w && w.last_failure) renderFailure(c, w.last_failure);
      // The samples every 10 s, and now: the chart moves at each refresh.
      const live = (co.history || []).slice();
      if (live.length > 0) live.push({ t: new Date().toISOString(), backlog: co.pending + co.ack_pending, acked: w ? w.acked : 0 });
      c.appendChild(chart(live));
      box.appendChild(c);
    }
  }

  function renderEdge(st) {
    const e = st.leafnodes;
    const box = byId("edge");
    box.replaceChildren();
    byId("edge-section").hidden = !e;
    if (!e) return;
    for (const l of e.links || []) {
      const { card: c, dl } = card("link", l.remote, "link " + l.remote);
      field(dl, "state", l.connected ? "connected" + (l.address ? " to " + l.address : "") : "DISCONNECTED", "state", l.connected ? "good" : "bad");
      field(dl, "since", ago(l.since));
      field(dl, "connects", num(l.connects));
      if (l.problem) field(dl, "dropped", l.problem, "problem", "bad");
      box.appendChild(c);
    }
    for (const f of e.forwards || []) {
      const { card: c, dl } = card("forward", f.consumer, "forward " + f.consumer, [f.stream, "to " + f.domain]);
      field(dl, "state", f.problem ? "WAITING: " + f.problem : f.ready ? "ready" : "waiting for the link", "state", f.problem ? "bad" : f.ready ? "good" : "warn");
      field(dl, "backlog", num(f.backlog), "backlog", f.backlog > 0 ? "warn" : null);
      field(dl, "oldest unforwarded", f.oldest_unforwarded ? ago(f.oldest_unforwarded).replace(" ago", " old") : "-", "lag");
      field(dl, "last forward", ago(f.last_forward));
      field(dl, "hub position", f.hub_position_known ? "seq " + num(f.hub_position) : "unknown", "position");
      field(dl, "forwarded", num(f.forwarded) + " (" + num(f.batches) + " batches, " + num(f.skipped) + " skipped, " + num(f.duplicates) + " duplicates)");
      if (f.refused || f.errors) field(dl, "refused / errors", num(f.refused) + " / " + num(f.errors), null, "bad");
      if (f.resent || f.gone) field(dl, "hub lost", num(f.resent) + " sent again, " + num(f.gone) + " lost on both sides", null, "bad");
      box.appendChild(c);
    }
    for (const s of e.sources || []) {
      const { card: c, dl } = card("source", s.stream + "/" + s.source, (s.mirror ? "mirror " : "source ") + s.source, [s.stream]);
      field(dl, "lag", num(s.lag), "lag", s.lag > 0 ? "warn" : null);
      let state = "ok";
      if (s.stalled) state = "STALLED for " + duration(Math.round(s.stalled_for / 1e9));
      else if (s.unreachable) state = "waiting for the link";
      else if (s.error) state = "ERROR: " + s.error;
      field(dl, "state", state, "state", state === "ok" ? "good" : "bad");
      box.appendChild(c);
    }
    for (const s of e.edges || []) {
      const { card: c, dl } = card("edge", s.edge + "/" + s.stream, "edge " + s.edge, [s.stream]);
      field(dl, "link", s.linked ? "linked" : "not linked", "linked", s.linked ? "good" : "warn");
      field(dl, "last seq", num(s.last_seq), "last_seq");
      field(dl, "waiting there", num(s.pending), "pending", s.pending > 0 ? "warn" : null);
      field(dl, "stored there", ago(s.last_origin_time));
      field(dl, "seen here", ago(s.last_seen), "last_seen");
      field(dl, "messages seen", num(s.messages));
      box.appendChild(c);
    }
  }

  function renderMQTT(st) {
    const m = st.mqtt;
    byId("mqtt-section").hidden = !m;
    const box = byId("mqtt");
    box.replaceChildren();
    if (!m) return;
    const dl = el("dl");
    box.appendChild(dl);
    field(dl, "listen", m.listen);
    field(dl, "devices", num(m.connections) + " connected (" + num(m.accepted) + " since start)", "devices");
    field(dl, "sessions kept", num(m.sessions), "sessions");
    field(dl, "deliveries unacked", num(m.in_flight), "in_flight");
    field(dl, "PUBACKs once stored", num(m.acked), "acked");
    field(dl, "waiting for the stream", num(m.holding), "holding", m.holding > 0 ? "warn" : null);
    field(dl, "barriers", num(m.barriers) + (m.failed ? ", " + num(m.failed) + " failed" : ""), "barriers", m.failed ? "bad" : null);
    field(dl, "streams devices publish into", (m.streams || []).join(", ") || "none", "streams");
    field(dl, "refused: no stream takes the topic", num(m.refused || 0), "refused", m.refused ? "bad" : null);
    if (m.last_error) field(dl, "last failure", m.last_error, "problem", "bad");
  }

  // Dead letters: fetched when a consumer's count changes (and every
  // tenth poll), not on every poll. Admin actions need a login (Basic
  // credentials) and carry the CSRF token /api/whoami gives an admin.
  let dlqKey = null, dlqPolls = 0, who = { user: "", admin: false };

  async function whoami() {
    try {
      const resp = await fetch("api/whoami", { cache: "no-store" });
      who = await resp.json();
    } catch (err) { who = { user: "", admin: false }; }
    const login = byId("login");
    login.replaceChildren();
    if (who.user) login.appendChild(el("span", "tag", who.user + (who.admin ? " (admin)" : "")));
    else { const a = el("a", "tag", "log in"); a.href = "login"; login.appendChild(a); }
  }

  async function act(path, body, confirmText) {
    if (confirmText && !window.confirm(confirmText)) return;
    const out = byId("dlq-actions");
    out.textContent = "working…";
    try {
      const resp = await fetch(path, {
        method: "POST", cache: "no-store",
        headers: { "Content-Type": "application/json", "X-Holdfast-CSRF": who.csrf || "" },
        body: JSON.stringify(body),
      });
      const r = await resp.json();
      out.textContent = resp.ok ? "done: " + JSON.stringify(r) : "refused (" + resp.status + "): " + (r.error || "");
      out.className = resp.ok ? "good" : "bad";
    } catch (err) {
      out.textContent = "failed: " + err.message;
      out.className = "bad";
    }
    dlqKey = null;
    poll();
  }

  function button(text, name, onclick) {
    const b = el("button", null, text);
    b.type = "button";
    b.dataset.action = name;
    b.addEventListener("click", onclick);
    return b;
  }

  async function showDetail(d) {
    const box = byId("dlq-detail");
    box.hidden = false;
    box.replaceChildren(el("h3", null, d.stream + " #" + d.seq));
    try {
      const resp = await fetch("deadletter.json?stream=" + encodeURIComponent(d.stream) + "&seq=" + d.seq, { cache: "no-store" });
      const full = await resp.json();
      if (!resp.ok) throw new Error(full.error || resp.status);
      const dl = el("dl");
      box.appendChild(dl);
      for (const k of Object.keys(full.header || {}).sort()) field(dl, k, full.header[k].join(", "));
      const pre = el("pre", "payload", full.preview + (full.truncated ? "\n… (" + num(full.size) + " bytes in all)" : ""));
      pre.dataset.field = "payload";
      box.appendChild(pre);
    } catch (err) {
      box.appendChild(el("div", "bad", "cannot read it: " + err.message));
    }
  }

  async function renderDeadLetters(st) {
    const consumers = (st.consumers || []).filter(function (c) { return c.dead_letter_stream; });
    byId("dlq-section").hidden = consumers.length === 0;
    if (consumers.length === 0) return;
    const key = consumers.map(function (c) { return c.name + ":" + c.dead_letters; }).join(",");
    if (key === dlqKey && ++dlqPolls % 10 !== 0) return;
    dlqKey = key;
    await whoami();
    let list = [];
    try {
      const resp = await fetch("deadletters.json?limit=20", { cache: "no-store" });
      list = (await resp.json()).dead_letters || [];
    } catch (err) { return; }
    const box = byId("dlq");
    box.replaceChildren();
    if (who.admin) {
      for (const co of consumers) {
        if (!co.dead_letters) continue;
        const newest = list.filter(function (d) { return d.consumer === co.name; }).reduce(function (m, d) { return Math.max(m, d.seq); }, 0);
        const bar = el("div", "card");
        bar.dataset.dlqConsumer = co.name;
        bar.appendChild(el("h3", null, co.name));
        bar.appendChild(button("replay all", "replay-all", function () {
          act("api/deadletters/replay", { consumer: co.name, all: true }, "Replay every dead letter of " + co.name + "?");
        }));
        if (newest) bar.appendChild(button("purge up to #" + newest, "purge", function () {
          act("api/deadletters/purge", { consumer: co.name, upto: newest }, "Delete the dead letters of " + co.name + " up to #" + newest + " for good?");
        }));
        box.appendChild(bar);
      }
    }
    if (list.length === 0) box.appendChild(el("div", "card", "none"));
    for (const d of list) {
      const { card: c, dl } = card("deadletter", d.stream + "/" + d.seq, d.original_subject || d.consumer, [d.consumer, "#" + d.seq]);
      field(dl, "failed", ago(d.failed_at), "failed_at");
      field(dl, "deliveries", num(d.deliveries), "deliveries");
      field(dl, "reason", d.reason || "-", "reason", "bad");
      field(dl, "payload", d.preview + (d.truncated ? " …" : ""), "preview");
      c.appendChild(button("details", "details", function () { showDetail(d); }));
      if (who.admin) c.appendChild(button("replay", "replay", function () {
        act("api/deadletters/replay", { stream: d.stream, seq: d.seq });
      }));
      box.appendChild(c);
    }
  }

  function renderCluster(st) {
    const cl = st.cluster;
    byId("cluster-section").hidden = !cl;
    const box = byId("cluster");
    box.replaceChildren();
    if (!cl) return;
    const dl = el("dl");
    box.appendChild(dl);
    field(dl, "cluster", cl.name || "-");
    field(dl, "this node", cl.node);
    field(dl, "meta leader", cl.meta_leader || "none", "meta_leader", cl.meta_leader ? null : "bad");
    for (const p of cl.peers || []) {
      let state = p.current ? "current" : "behind by " + num(p.lag);
      if (p.offline) state = "down" + (p.down_since ? " since " + ago(p.down_since) : "");
      field(dl, p.name, state, null, p.offline ? "bad" : p.current ? "good" : "warn");
    }
  }

  function render(st) {
    renderMeta(st);
    renderHealth(st);
    renderStore(st);
    renderEdge(st);
    renderMQTT(st);
    renderCluster(st);
    renderConsumers(st);
    renderDeadLetters(st);
    renderStreams(st);
  }

  function showUpdated(text) {
    byId("updated").textContent = text;
  }

  async function poll() {
    timer = null;
    if (polling || document.visibilityState === "hidden") return;
    polling = true;
    try {
      const resp = await fetch("status.json", { cache: "no-store" });
      const st = await resp.json();
      render(st);
      lastUpdate = Date.now();
      showUpdated("updated " + new Date(lastUpdate).toLocaleTimeString());
    } catch (err) {
      // holdfast restarting or unreachable: keep the last figures, say so,
      // and let no earlier verdict stand for a holdfast that does not answer.
      const since = lastUpdate ? "; figures from " + new Date(lastUpdate).toLocaleTimeString() : "";
      showUpdated("cannot reach holdfast (" + err.message + ")" + since);
      byId("health").className = "unknown";
      byId("verdict").textContent = "unreachable";
      byId("reasons").replaceChildren(el("li", "bad", "holdfast does not answer: stopped, restarting or out of reach (" + err.message + ")" + since));
      document.title = "holdfast (unreachable)";
    } finally {
      polling = false;
      schedule();
    }
  }

  function schedule() {
    if (timer === null && document.visibilityState !== "hidden") timer = setTimeout(poll, interval);
  }

  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "hidden") {
      if (timer !== null) clearTimeout(timer);
      timer = null;
      showUpdated("paused while hidden");
    } else if (timer === null) {
      poll();
    }
  });

  poll();
})();
