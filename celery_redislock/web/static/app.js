// celery-redislock dashboard: polls api/state and draws it. No dependencies; every value
// from the lock store is put in the page as text (textContent), never as HTML.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const COLUMNS = 8;  // of the table of keys
  const expanded = new Set();
  let last = null;
  let timer = null;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function seconds(value) {
    if (value === null || value === undefined) return "-";
    const s = Math.abs(value);
    const sign = value < 0 ? "-" : "";
    if (s < 60) return sign + s.toFixed(1) + " s";
    if (s < 3600) return sign + Math.floor(s / 60) + " m " + Math.round(s % 60) + " s";
    return sign + Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " m";
  }

  function cut(text, most) {
    return text.length <= most ? text : text.slice(0, most - 1) + "…";
  }

  function usage(row) {
    const limit = row.limit;
    const share = limit ? Math.min(1, row.used / limit) : (row.used ? 1 : 0);
    const fill = el("div", {class: "usage-fill" + (limit && row.used > limit ? " over" :
      limit && row.used >= limit ? " full" : "")});
    fill.style.width = (share * 100).toFixed(1) + "%";
    const configured = row.configured_limit === null ? "?" : row.configured_limit;
    return el("div", {class: "usage"},
      el("div", {class: "usage-bar", role: "meter", "aria-valuenow": row.used,
                 "aria-valuemax": limit === null ? "" : limit}, fill),
      el("span", {class: "usage-text"}, row.used_text),
      row.slots_override === null ? null :
        el("span", {class: "badge badge-override",
                    title: `set-slots override: ${row.slots_override} slots instead of the configured ${configured}`},
          `override ${row.slots_override} (was ${configured})`));
  }

  // Who holds the key: the oldest live holder's task and arguments (its argsrepr, as
  // Flower shows it; text written by whoever sent the task, so only ever put as text),
  // and how many more.
  function heldBy(row) {
    const live = row.holders.filter((h) => !h.expired);
    if (!live.length) return el("span", {class: "muted"}, "-");
    const first = live[0];
    const what = (first.task || first.token) + (first.args ? " " + first.args : "");
    const more = row.holder_count - 1;
    return el("div", {class: "held-by", title: what},
      el("span", {class: "held-task"}, cut(first.task || first.token, 40)),
      more > 0 ? el("span", {class: "muted held-more"}, ` +${more} more`) : null,
      first.args ? el("span", {class: "held-args mono"}, " " + cut(first.args, 48)) : null);
  }

  function spark(row) {
    const width = 160, height = 30, samples = row.history || [];
    const PLOT = width - 18;  // the chart; its scale's label to the right
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const top = Math.max(1, row.limit || 0, ...samples.map((s) => Math.max(s.used, s.waiting)));
    const title = document.createElementNS(SVG, "title");
    title.textContent = `slots used (line) and waiting runs (shaded), ${samples.length} ` +
      `sample(s); the chart's top is ${top}`;
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("class", "spark-max");
    label.setAttribute("x", width - 1);
    label.setAttribute("y", 9);
    label.setAttribute("text-anchor", "end");
    label.textContent = String(top);
    const axis = document.createElementNS(SVG, "line");
    axis.setAttribute("class", "spark-axis");
    axis.setAttribute("x1", 1);
    axis.setAttribute("x2", PLOT - 1);
    axis.setAttribute("y1", 2);
    axis.setAttribute("y2", 2);
    svg.append(title, axis, label);
    if (samples.length < 2) return svg;
    const x = (i) => (i / (samples.length - 1)) * (PLOT - 2) + 1;
    const y = (v) => height - 2 - (v / top) * (height - 4);
    const area = samples.map((s, i) => `${x(i).toFixed(1)},${y(s.waiting).toFixed(1)}`);
    const waiting = document.createElementNS(SVG, "polygon");
    waiting.setAttribute("class", "waiting");
    waiting.setAttribute("points", [`1,${height - 2}`, ...area, `${PLOT - 1},${height - 2}`].join(" "));
    const used = document.createElementNS(SVG, "polyline");
    used.setAttribute("class", "used");
    used.setAttribute("points", samples.map((s, i) => `${x(i).toFixed(1)},${y(s.used).toFixed(1)}`).join(" "));
    svg.insertBefore(waiting, label);
    svg.insertBefore(used, label);
    return svg;
  }

  function paused(row) {
    if (!row.paused) return el("span", {class: "badge badge-no"}, "no");
    return el("span", {class: "badge badge-paused"},
      row.pause_left_seconds === null ? "until resumed" : seconds(row.pause_left_seconds) + " left");
  }

  function isOpen(row) {
    return expanded.has(row.key);
  }

  function toggle(row) {
    if (expanded.has(row.key)) expanded.delete(row.key);
    else expanded.add(row.key);
    if (last) draw(last);
  }

  function keyRow(row) {
    const open = isOpen(row);
    return el("tr", {class: "key-row", "data-key": row.key, "aria-expanded": open,
                     onclick: () => toggle(row)},
      el("td", {class: "key-name"}, el("span", {class: "caret"}, open ? "▾" : "▸"), row.name),
      el("td", {}, usage(row)),
      el("td", {class: "held"}, heldBy(row)),
      el("td", {class: "num"}, row.waiting ? el("span", {class: "badge badge-wait"}, row.waiting) : "0"),
      el("td", {class: row.rate_text ? "rate" : "rate muted"}, row.rate_text || "-"),
      el("td", {}, spark(row)),
      el("td", {}, paused(row)),
      el("td", {class: "num"}, seconds(row.oldest_age_seconds)));
  }

  function holdersTable(row, actions) {
    if (!row.holders.length) return el("p", {class: "muted"}, "No holders.");
    return el("table", {class: "inner holders"},
      el("thead", {}, el("tr", {},
        ["Task", "Arguments", "Task id", "Worker", "Age", "Lease left", "Fence", actions ? "" : null]
          .filter((h) => h !== null).map((h) => el("th", {}, h)))),
      el("tbody", {}, row.holders.map((h) => el("tr", {class: "holder", "data-token": h.token},
        el("td", {}, (h.task || "-") + (h.cost > 1 ? ` (${h.cost} slots)` : "")),
        el("td", {class: "mono args"}, h.args || "-"),
        el("td", {class: "mono task-id"}, h.task_id || "-"),
        el("td", {class: "mono"}, h.worker || "-"),
        el("td", {class: "num"}, seconds(h.age_seconds)),
        el("td", {class: "num" + (h.expired ? " expired" : "")},
          h.expired ? "expired" : seconds(h.lease_left_seconds)),
        el("td", {class: "num mono"}, h.fence),
        actions ? el("td", {}, el("button", {class: "danger", onclick: (e) => {
          e.stopPropagation();
          if (confirm(`Free this slot of ${row.name}? The run is not stopped.`))
            act({action: "release", key: row.key, holder: h.token});
        }}, "Release")) : null))));
  }

  // The parked line: counts only, its runs wait in the broker's parking queue.
  function parkedLine(p) {
    if (!p) return el("p", {class: "muted"}, "Nobody waits.");
    const queue = p.queue_length === null ? "length unknown (broker not asked)" :
      `${p.queue_length} message(s) in the broker`;
    return el("div", {class: "parked"},
      el("h3", {}, `Parked line (${p.waiting})`),
      el("p", {class: "muted"}, `${p.references} reference(s) waiting, ${p.anonymous} anonymous, ` +
        `${p.reserved} reserved, ${p.claimed} claimed, ${p.served} served kept` +
        (p.last_parked_age_seconds === null ? "" : `; last parked ${seconds(p.last_parked_age_seconds)} ago`)),
      el("p", {class: "muted mono"}, `Parking queue ${p.queue}: ${queue}`));
  }

  // A fair limit's sub-lines (fair_by): how many wait, the first by turn; null for none.
  function fairLine(f) {
    if (!f) return null;
    const more = f.sub_lines_waiting - f.first.length;
    return el("div", {class: "fair"},
      el("h3", {}, `Fair sub-lines waiting (${f.sub_lines_waiting})`),
      el("table", {}, el("thead", {}, el("tr", {},
        ...["Sub-line", "Turn", "Waiting", "Weight", "Oldest"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...f.first.map((s) => el("tr", {},
          el("td", {class: "mono"}, s.sub),
          el("td", {class: "num"}, String(s.turn)),
          el("td", {class: "num"}, String(s.waiting)),
          el("td", {class: "num"}, String(s.weight)),
          el("td", {class: "num"}, s.oldest_age_seconds == null ? "-" : seconds(s.oldest_age_seconds)))))),
      more > 0 ? el("p", {class: "muted"}, `… and ${more} more sub-line(s), next by turn`) : null);
  }

  function keyActions(row) {
    const button = (label, body, ask) => el("button", {onclick: (e) => {
      e.stopPropagation();
      const extra = ask ? ask() : {};
      if (extra) act(Object.assign({key: row.key}, body, extra));
    }}, label);
    const number = (question, field) => () => {
      const answer = prompt(question);
      if (answer === null || answer.trim() === "") return null;
      return {[field]: Number(answer)};
    };
    return el("div", {class: "actions"},
      row.paused ? button("Resume", {action: "resume"}) :
        button("Pause…", {action: "pause"}, number(`Pause ${row.name} for how many seconds?`, "seconds")),
      button("Set slots…", {action: "set-slots"}, number(`Slots of ${row.name}:`, "slots")),
      row.slots_override !== null ? button("Clear override", {action: "clear-slots"}) : null);
  }

  function detailRow(row, actions) {
    const limits = [`configured ${row.configured_limit === null ? "?" : row.configured_limit}`];
    if (row.slots_override !== null) limits.push(`override ${row.slots_override}`);
    if (row.reserved) limits.push(`${row.reserved} reserved for runs moved out of parking`);
    return el("tr", {class: "detail", "data-key": row.key}, el("td", {colspan: COLUMNS},
      el("div", {class: "muted mono"}, row.key),
      el("div", {class: "muted"}, "Slots: " + limits.join(", ")),
      el("h3", {}, `Holders (${row.holder_count})`), holdersTable(row, actions),
      parkedLine(row.parked), fairLine(row.fair),
      actions ? keyActions(row) : null));
  }

  function clock(serverTime) {
    return new Date(serverTime * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function draw(state, failure) {
    const filter = document.getElementById("filter").value.trim().toLowerCase();
    const rows = state.keys.filter((row) => !filter || row.name.toLowerCase().includes(filter));
    const body = document.getElementById("keys");
    const fresh = rows.length ? rows.flatMap((row) =>
      isOpen(row) ? [keyRow(row), detailRow(row, state.actions)] : [keyRow(row)]) :
      [el("tr", {class: "empty"}, el("td", {colspan: COLUMNS},
        state.keys.length ? "No key matches the filter." : "No limits in use."))];
    if (failure) {
      fresh.unshift(el("tr", {class: "stale-note"}, el("td", {colspan: COLUMNS},
        `Not live: the lock store cannot be read now (${failure}). ` +
        `Shown: the last read, at ${clock(state.server_time)}.`)));
    }
    body.replaceChildren(...fresh);
    document.querySelector("table.keys").classList.toggle("stale", Boolean(failure));
    const totals = state.totals;
    document.getElementById("total-keys").textContent = totals.keys;
    document.getElementById("total-used").textContent = totals.used;
    document.getElementById("total-waiting").textContent = totals.waiting;
    document.getElementById("total-paused").textContent = totals.paused;
    document.getElementById("clock").textContent = clock(state.server_time);
    const mode = document.getElementById("mode");
    mode.textContent = state.actions ? "actions on" : "read-only";
    mode.className = "pill" + (state.actions ? " pill-actions" : "");
    document.getElementById("token-box").hidden = !state.actions;
  }

  function status(text, kind) {
    const node = document.getElementById("connection");
    node.textContent = text;
    node.className = "pill pill-" + kind;
  }

  function banner(id, text) {
    const node = document.getElementById(id);
    node.textContent = text || "";
    node.hidden = !text;
  }

  function notice(text, ok) {
    banner("notice", text);
    document.getElementById("notice").className = "banner" + (ok ? " banner-ok" : "");
  }

  async function refresh() {
    clearTimeout(timer);
    let wait = last ? last.refresh_seconds : 1;
    try {
      const response = await fetch("api/state", {cache: "no-store", credentials: "same-origin"});
      const state = await response.json();
      if (!response.ok) throw new Error(state.error || `HTTP ${response.status}`);
      last = state;
      wait = state.refresh_seconds;
      draw(state);
      banner("error", "");
      status("live", "live");
    } catch (error) {
      banner("error", "Cannot read the state: " + error.message);
      status("disconnected", "down");
      wait = Math.max(wait, 2);
      if (last) draw(last, error.message);
      else unread(error.message, wait);
    }
    timer = setTimeout(refresh, wait * 1000);
  }

  // Nothing was ever read: say so in the table, instead of "Loading…".
  function unread(message, wait) {
    document.getElementById("keys").replaceChildren(el("tr", {class: "empty unread"},
      el("td", {colspan: COLUMNS},
        `The lock store cannot be read: ${message}. Trying again every ${wait} s.`)));
    for (const id of ["total-keys", "total-used", "total-waiting", "total-paused"])
      document.getElementById(id).textContent = "?";
  }

  async function act(body) {
    const token = document.getElementById("token").value || sessionStorage.getItem("redislock-token") || "";
    try {
      const response = await fetch("api/action", {
        method: "POST", credentials: "omit", cache: "no-store",
        headers: {"Content-Type": "application/json", "X-Redislock-Token": token},
        body: JSON.stringify(body),
      });
      const answer = await response.json();
      if (!answer.ok) throw new Error(answer.error || `HTTP ${response.status}`);
      sessionStorage.setItem("redislock-token", token);
      notice(answer.message, true);
    } catch (error) {
      notice("Action refused: " + error.message, false);
    }
    refresh();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.getElementById("token").value = sessionStorage.getItem("redislock-token") || "";
    document.getElementById("filter").addEventListener("input", () => last && draw(last));
    refresh();
  });
})();
