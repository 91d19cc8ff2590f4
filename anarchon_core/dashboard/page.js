"use strict";
// Draws api/state every second. Every value from the store goes into text
// nodes (textContent, title), never into markup: names are shown as written.
(function () {
  const REFRESH_MS = 1000;
  const $ = (id) => document.getElementById(id);
  const tokenInput = $("token");
  tokenInput.value = sessionStorage.getItem("anarchon-token") || "";
  tokenInput.addEventListener("input", () => sessionStorage.setItem("anarchon-token", tokenInput.value));
  $("actions").addEventListener("submit", (e) => e.preventDefault());

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "-" : String(text);
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }
  function when(seconds) {
    if (seconds === null || seconds === undefined) return "-";
    return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }
  function ago(now, seconds) {
    if (seconds === null || seconds === undefined) return "-";
    const d = Math.max(0, now - seconds);
    return d < 120 ? d.toFixed(0) + "s ago" : when(seconds);
  }
  async function act(verb, job) {
    const message = $("message");
    message.textContent = "…";
    try {
      const answer = await fetch("api/" + verb, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Anarchon-Token": tokenInput.value },
        body: JSON.stringify({ job: job }),
      });
      const body = await answer.json();
      message.textContent = answer.ok ? job + ": " + body.done : (body.error || answer.statusText);
    } catch (err) {
      message.textContent = String(err);
    }
    refresh();
  }
  function button(td, label, verb, job) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = verb;
    b.textContent = label;
    b.addEventListener("click", () => act(verb, job));
    td.appendChild(b);
  }
  function timeline(td, items) {
    const box = document.createElement("div");
    box.className = "timeline";
    for (const item of items) {
      const mark = document.createElement("span");
      if (item.kind === "gap") {
        mark.className = "gap";
        mark.textContent = "×" + item.slots;
        mark.title = item.slots + " slot(s) did not run (missed, overlapped or paused)";
      } else {
        mark.className = item.state + (item.takeover ? " takeover" : "") + (item.manual ? " manual" : "");
        mark.textContent = item.takeover ? "#" + item.attempt : (item.manual ? "▸" : "•");
        mark.title = when(item.slot) + " · " + item.owner + " · attempt " + item.attempt + " · " +
          item.state + (item.manual ? " · run now" : "");
      }
      box.appendChild(mark);
    }
    td.appendChild(box);
  }
  // The slots to come: from the job's schedule (in UTC, and in its zone if another),
  // DST gaps and folds marked; "ended" past its end; else an estimate (≈) or "-".
  function toCome(td, job) {
    if (job.ended) {
      td.textContent = "ended";
      td.classList.add("ended");
      td.title = job.schedule || "";
      return;
    }
    if (job.upcoming && job.upcoming.length) {
      td.textContent = "";
      for (const slot of job.upcoming) {
        const line = document.createElement("div");
        let text = when(slot.at);
        if (job.zone && job.zone !== "UTC") {
          text += " (" + slot.local.slice(0, 19).replace("T", " ") + " " + job.zone + ")";
        }
        if (slot.note) {
          text += " ⚠";
          line.className = "dst";
          line.title = slot.note;
        }
        line.textContent = text;
        td.appendChild(line);
      }
      td.title = job.schedule || "";
      return;
    }
    td.textContent = job.next ? (job.next.estimated ? "≈ " : "") + when(job.next.at) : "-";
  }
  function draw(state) {
    $("namespace").textContent = state.namespace;
    $("error").hidden = true;
    $("actions").hidden = !state.actions;
    const summary = state.jobs.length + state.more_jobs + " job(s), " + state.instances.length +
      " live instance(s)" + (state.paused_namespace ? " — the whole namespace is PAUSED" : "") +
      " — updated " + when(state.now);
    $("summary").textContent = summary;
    const jobs = $("jobs").tBodies[0];
    const rows = [];
    for (const job of state.jobs) {
      const tr = document.createElement("tr");
      tr.dataset.job = job.name;
      cell(tr, job.name, "name");
      const pausedCell = cell(tr, job.paused ? (job.paused_why ? "on failure" : "yes") : state.paused_namespace ? "namespace" : "no", "paused paused-" + (job.paused ? "yes" : "no"));
      if (job.paused && job.paused_why) pausedCell.title = job.paused_why;
      cell(tr, when(job.slot), "slot");
      cell(tr, job.owner, "owner");
      cell(tr, job.attempt, "attempt");
      cell(tr, job.state, "state state-" + job.state);
      cell(tr, job.lease_left === null ? "-" : job.lease_left.toFixed(1) + "s", "lease");
      cell(tr, ago(state.now, job.last_success), "success");
      if (job.limit && job.limit.startsWith("limit reached")) {
        cell(tr, job.limit, "next ended");
      } else {
        const next = cell(tr, "", "next");
        toCome(next, job);
        if (job.limit) next.title = job.limit;
      }
      timeline(cell(tr, "", "recent"), job.timeline);
      const controls = cell(tr, "", "controls");
      if (state.actions) {
        if (job.paused) button(controls, "Resume", "resume", job.name);
        else button(controls, "Pause", "pause", job.name);
        button(controls, "Run now", "trigger", job.name);
      }
      rows.push(tr);
    }
    jobs.replaceChildren(...rows);
    const strays = state.strays || [];
    $("strays").hidden = !strays.length;
    $("strays").textContent = "Also sent by a scheduler that is not anarchon's (a stock beat still running?): " +
      strays.map((s) => s.job + " ×" + s.count + " (last " + when(s.last_at) + (s.sender ? " from " + s.sender : "") + ")").join("; ");
    $("more").hidden = !state.more_jobs;
    $("more").textContent = state.more_jobs + " more job(s) not shown.";
    const instances = $("instances").tBodies[0];
    const lines = [];
    for (const inst of state.instances) {
      const tr = document.createElement("tr");
      tr.dataset.instance = inst.name;
      cell(tr, inst.name, "name");
      cell(tr, inst.host);
      cell(tr, inst.pid);
      cell(tr, inst.version);
      cell(tr, inst.jobs);
      cell(tr, inst.seen.toFixed(1) + "s ago");
      cell(tr, inst.behind || inst.deferred ? inst.behind.toFixed(1) + "s, " + inst.deferred + " claims deferred" : "-", "behind");
      cell(tr, inst.holds.length ? inst.holds.join(", ") : "-", "holds");
      lines.push(tr);
    }
    instances.replaceChildren(...lines);
  }
  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const answer = await fetch("api/state", { cache: "no-store" });
      const body = await answer.json();
      if (answer.ok) draw(body);
      else { $("error").hidden = false; $("error").textContent = body.error || answer.statusText; }
    } catch (err) {
      $("error").hidden = false;
      $("error").textContent = "cannot reach the dashboard: " + err;
    } finally {
      busy = false;
    }
  }
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
