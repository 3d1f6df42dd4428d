// The batchinfer dashboard: plain JS over the Batches API. Every value from the server is put in the page
// with textContent, never as HTML. The key lives in sessionStorage (gone when the tab closes).
"use strict";
const POLL_MS = Number(new URLSearchParams(location.search).get("poll_ms")) || 1000;
const FINAL = ["completed", "failed", "expired", "cancelled"];
const $ = (id) => document.getElementById(id);
let selected = null, timer = null, samples = {}, statsCache = {}, admin = false;

function key() { return sessionStorage.getItem("batchinfer_key"); }

async function api(path, options = {}) {
  const res = await fetch(path, { ...options, headers: { Authorization: "Bearer " + key(), ...(options.headers || {}) } });
  if (!res.ok) {
    const body = await res.json().catch(() => ({}));
    throw Object.assign(new Error((body.error && body.error.message) || res.statusText), { status: res.status });
  }
  return res;
}
const json = async (path, options) => (await api(path, options)).json();

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}
function row(cells) { const tr = el("tr"); for (const c of cells) tr.append(c instanceof Node ? wrap(c) : el("td", c)); return tr; }
function wrap(node) { const td = el("td"); td.append(node); return td; }
function bar(fraction) {
  const outer = el("span", null, "bar"), inner = el("div");
  inner.style.width = Math.round(Math.min(1, fraction) * 100) + "%";
  outer.append(inner);
  return outer;
}
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
function left(b) {
  if (FINAL.includes(b.status) || !b.expires_at) return "";
  const s = Math.max(0, b.expires_at - Date.now() / 1000);
  return s > 3600 ? (s / 3600).toFixed(1) + " h" : s > 60 ? Math.round(s / 60) + " min" : Math.round(s) + " s";
}
const pct = (x) => (x * 100).toFixed(1) + "%";
const done = (b) => b.request_counts.completed + b.request_counts.failed;
const ended = (b) => b.completed_at || b.failed_at || b.expired_at || b.cancelled_at;
function hitRate(b) { const i = b.usage.input_tokens; return i ? b.usage.input_tokens_details.cached_tokens / i : 0; }

async function signIn(secret) {
  sessionStorage.setItem("batchinfer_key", secret);
  try {
    const me = await json("/v1/dashboard/me");
    $("who").textContent = me.name + (me.admin ? " (admin)" : "");
    admin = me.admin;
    $("signin").hidden = true; $("app").hidden = false; $("signout").hidden = false;
    $("workers").hidden = !me.admin;
    refresh();
  } catch (err) {
    sessionStorage.removeItem("batchinfer_key");
    $("signin-error").textContent = err.status === 401 ? "That key is wrong or revoked." : err.message;
  }
}

function signOut() { sessionStorage.removeItem("batchinfer_key"); location.reload(); }

async function refresh() {
  clearTimeout(timer);
  try {
    await Promise.all([renderList(), selected ? renderDetail(selected) : null, $("workers").hidden ? null : renderWorkers()]);
  } catch (err) {
    if (err.status === 401) return signOut();
    console.warn(err);
  }
  timer = setTimeout(refresh, POLL_MS);
}

async function renderList() {
  const list = await json("/v1/batches?limit=100" + (admin ? "&all=true" : ""));  // an admin sees every batch
  const body = $("batches").tBodies[0];
  body.replaceChildren();
  for (const b of list.data) {
    const total = b.request_counts.total;
    const state = b.waiting_for ? `${b.status} · waiting for ${b.waiting_for.join(" and ")}` : b.status;
    const tr = row([b.id, b.model || "", el("span", state, "status " + b.status + (b.waiting_for ? " waiting" : "")), bar(total ? done(b) / total : 0),
      `${done(b)}/${total}` + (b.request_counts.failed ? ` (${b.request_counts.failed} failed)` : ""),
      b.usage.total_tokens, pct(hitRate(b)), when(b.created_at), when(ended(b)), left(b)]);
    tr.className = "batch" + (b.id === selected ? " selected" : "");
    tr.dataset.id = b.id;
    tr.addEventListener("click", () => { selected = b.id; refresh(); });
    body.append(tr);
    sample(b);
  }
  $("no-batches").hidden = list.data.length > 0;
}

function sample(b) {  // live tokens/s: the change in output tokens between two polls
  const s = (samples[b.id] = samples[b.id] || []), now = Date.now() / 1000, last = s[s.length - 1];
  if (!last || last.tokens !== b.usage.output_tokens || now - last.t > 5) s.push({ t: now, tokens: b.usage.output_tokens });
  if (s.length > 120) s.shift();
}

async function renderDetail(id) {
  const b = await json("/v1/batches/" + encodeURIComponent(id));
  $("detail").hidden = false;
  $("d-id").textContent = b.id;
  $("d-status").textContent = b.waiting_for  // a service is down: the batch waits and resumes by itself
    ? `${b.status} · waiting for ${b.waiting_for.join(" and ")} (unreachable since ${when(b.waiting_since)})` : b.status;
  $("d-status").className = "status " + b.status + (b.waiting_for ? " waiting" : "");
  const steps = [["created", b.created_at], ["validated", b.queued_at], ["in progress", b.in_progress_at],
    ["paused", b.paused_at], ["cancelling", b.cancelling_at], ["finalizing", b.finalizing_at], ["completed", b.completed_at],
    ["failed", b.failed_at], ["expired", b.expired_at], ["cancelled", b.cancelled_at]];
  const seen = steps.filter(([, t]) => t).sort((a, b) => a[1] - b[1]);  // in the order they happened
  $("d-timeline").replaceChildren(...seen.map(([name, t]) => el("li", `${name}: ${when(t)}`)));
  if (!FINAL.includes(b.status)) $("d-timeline").append(el("li", `expires: ${when(b.expires_at)}`, "pending"));
  renderLinks(b);
  $("d-cancel").hidden = FINAL.includes(b.status) || b.status === "cancelling";
  const groups = await json(`/v1/batches/${encodeURIComponent(id)}/prefix_groups`);
  $("d-groups").tBodies[0].replaceChildren(...groups.data.map((g) => row([g.prefix_key.slice(0, 16), g.adapter || "", g.shared_prefix_len,
    bar(g.requests ? g.done / g.requests : 0), `${g.done}/${g.requests}`, pct(g.hit_rate), g.workers.join(", ")])));
  let stats = statsCache[id];
  if (!stats && FINAL.includes(b.status)) {
    stats = await json(`/v1/dashboard/batches/${encodeURIComponent(id)}/stats`);
    if (stats.final) statsCache[id] = stats;  // an ended batch's figures never change
  }
  renderLatency(stats);
  drawChart(stats && stats.final ? stats.tokens_per_s : liveRates(samples[id] || []));
}

function renderLinks(b) {
  const links = $("d-links");
  links.replaceChildren();
  for (const [label, fileId] of [["Download output", b.output_file_id], ["Download errors", b.error_file_id]]) {
    if (!fileId) continue;
    const a = el("a", label);
    a.href = "#";
    a.addEventListener("click", (e) => { e.preventDefault(); download(fileId, `${b.id}-${label.split(" ")[1]}.jsonl`); });
    links.append(a, " ");
  }
}

async function download(fileId, name) {  // a plain link cannot send the key: fetch, then save the blob
  const blob = await (await api(`/v1/files/${encodeURIComponent(fileId)}/content`)).blob();
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob); a.download = name; a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function renderLatency(stats) {
  const f = (x) => (x === null || x === undefined ? "–" : (x * 1000).toFixed(1) + " ms");
  const rows = stats && stats.final ? [["TTFT", stats.ttft_p50_s, stats.ttft_p99_s], ["TPOT", stats.tpot_p50_s, stats.tpot_p99_s]]
    : [["TTFT", null, null], ["TPOT", null, null]];
  $("d-latency").tBodies[0].replaceChildren(...rows.map(([n, a, b]) => row([n, f(a), f(b)])));
}

function liveRates(s) {
  const out = [];
  for (let i = 1; i < s.length; i++) out.push([s[i].t, (s[i].tokens - s[i - 1].tokens) / Math.max(0.001, s[i].t - s[i - 1].t)]);
  return out;
}

function drawChart(points) {
  const c = $("d-chart"), g = c.getContext("2d"), pad = 30;
  g.clearRect(0, 0, c.width, c.height);
  g.fillStyle = "#888"; g.font = "11px system-ui";
  if (points.length < 1) { g.fillText("no tokens yet", pad, c.height / 2); return; }
  const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1);
  const ymax = Math.max(1, ...points.map((p) => p[1]));
  const x = (t) => pad + ((t - t0) / (t1 - t0)) * (c.width - pad - 8), y = (v) => c.height - 18 - (v / ymax) * (c.height - 30);
  g.strokeStyle = "#ddd"; g.beginPath(); g.moveTo(pad, y(0)); g.lineTo(c.width - 8, y(0)); g.stroke();
  g.fillText(ymax.toFixed(0), 2, y(ymax) + 4); g.fillText("0", 2, y(0) + 4);
  g.fillText(Math.round(t1 - t0) + " s", c.width - 40, c.height - 4);
  g.strokeStyle = "#3b6fe0"; g.lineWidth = 2; g.beginPath();
  points.forEach(([t, v], i) => (i ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
  g.stroke();
}

async function renderWorkers() {
  const list = await json("/v1/dashboard/workers");
  $("w-table").tBodies[0].replaceChildren(...list.data.map((w) => row([w.name, w.model || "",
    el("span", w.alive ? (w.busy ? "alive, busy" : "alive, idle") : "dead", w.alive ? "alive" : "dead"),
    w.unit_id || "", w.tokens_per_s ? w.tokens_per_s.toFixed(1) : "", w.prefix_groups.length, w.units_done])));
}

$("signin-form").addEventListener("submit", (e) => { e.preventDefault(); signIn($("key").value.trim()); });
$("signout").addEventListener("click", signOut);
$("d-cancel").addEventListener("click", async () => {
  if (!selected || !confirm(`Cancel batch ${selected}? Finished results are kept.`)) return;
  await api(`/v1/batches/${encodeURIComponent(selected)}/cancel`, { method: "POST" });
  refresh();
});
if (key()) signIn(key());
