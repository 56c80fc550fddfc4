// The "Spans" toggle on each turn of the conversation page: every span of the turn as a tree on a
// time axis (GET /api/rounds/<id>/spans/), fetched when opened. An open waterfall stays open and
// is fetched again whenever the live page swaps in a new version of its turn (the turn changed).
//
// Span names and attributes are untrusted trace content: they reach the page only as text
// (textContent, title, createElement); no string from the API is ever parsed as HTML.
import { goToLogin, serialised } from "./live.js";

const INDENT_PX = 14;
const MAX_INDENT_LEVELS = 24; // deeper spans line up at this indent; their depth is in the details
const KIND_LABELS = { llm: "LLM", tool: "Tool", agent: "Agent", chain: "Chain", other: "Span" };
const open = new Map(); // container id -> { container, refresh }

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function formatMs(ms) {
  if (ms === null || ms === undefined) return "running";
  if (ms === 0) return "0 ms";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.floor((ms % 60000) / 1000)} s`;
}

// The badge: the span's kind, or for an unmapped span what its instrumentation calls it
// (RETRIEVER, compression, …), so a retriever does not read as just "Span".
function kindLabel(span) {
  if (span.kind !== "other") return KIND_LABELS[span.kind] || span.kind;
  const own = span.attributes["openinference.span.kind"] || span.attributes["ctxlens.span.kind"];
  return typeof own === "string" && own ? own.toLowerCase().replace(/_/g, " ") : KIND_LABELS.other;
}

function facts(span) {
  const out = [
    ["Kind", kindLabel(span)],
    ["Status", span.status_message ? `${span.status}: ${span.status_message}` : span.status],
    ["Starts at", `+${formatMs(span.start_offset_ms)}`],
    ["Duration", formatMs(span.duration_ms)],
  ];
  if (span.model) out.push(["Model", span.model]);
  if (span.tool_name) out.push(["Tool", span.tool_name]);
  if (span.input_tokens !== null || span.output_tokens !== null) {
    out.push(["Tokens", `${span.input_tokens ?? "–"} in / ${span.output_tokens ?? "–"} out`]);
  }
  if (span.langgraph_node) out.push(["LangGraph node", span.langgraph_node]);
  for (const [key, value] of Object.entries(span.attributes)) out.push([key, value]);
  out.push(["Span id", span.span_id]);
  if (span.parent_span_id) out.push([span.orphan ? "Parent (not in this turn)" : "Parent", span.parent_span_id]);
  if (span.depth > MAX_INDENT_LEVELS) out.push(["Depth", span.depth]);
  return out;
}

function spanRow(span, axisMs) {
  const failed = span.status === "error";
  const li = el("li", `wf-row${failed ? " failed" : ""}${span.running ? " running" : ""}`);
  li.dataset.kind = span.kind;
  li.dataset.spanId = span.span_id;
  li.dataset.depth = span.depth;
  const details = el("details");
  const summary = el("summary");
  // On hover: what the row is, then the same facts as when it is expanded.
  summary.title = [`${span.name} · ${kindLabel(span)} · ${formatMs(span.duration_ms)}`,
    ...facts(span).slice(1).map(([key, value]) => `${key}: ${value}`)].join("\n");

  const label = el("span", "wf-label");
  label.style.paddingLeft = `${Math.min(span.depth, MAX_INDENT_LEVELS) * INDENT_PX}px`;
  label.append(el("span", `badge kind-${span.kind}`, kindLabel(span)));
  let name;
  if (span.timeline) {
    name = el("a", "wf-name", span.name);
    name.href = `#${span.timeline.anchor}`; // the entry on this page's timeline
    name.title = `Go to this ${span.timeline.type === "llm" ? "LLM call" : span.timeline.type} in the timeline`;
  } else {
    name = el("span", "wf-name", span.name);
  }
  label.append(name);
  if (span.langgraph_node) label.append(el("span", "wf-node", span.langgraph_node));
  if (failed) label.append(el("span", "badge status-error", "Error"));

  const track = el("span", "wf-track");
  const bar = el("span", "wf-bar");
  const end = span.duration_ms === null ? axisMs : span.start_offset_ms + span.duration_ms;
  bar.style.left = `${axisMs ? (100 * span.start_offset_ms) / axisMs : 0}%`;
  bar.style.width = `${axisMs ? (100 * (end - span.start_offset_ms)) / axisMs : 100}%`;
  track.append(bar);

  summary.append(label, track, el("span", "wf-duration", formatMs(span.duration_ms)));
  const list = el("dl", "wf-facts");
  for (const [key, value] of facts(span)) {
    const item = el("div");
    item.append(el("dt", null, key), el("dd", null, value));
    list.append(item);
  }
  details.append(summary, list);
  li.append(details);
  return li;
}

function render(container, data) {
  if (!data.spans.length) {
    container.replaceChildren(el("p", "hint", "No spans stored for this turn."));
    return;
  }
  const head = el("p", "wf-summary hint");
  head.textContent = `${data.span_count} span${data.span_count === 1 ? "" : "s"} · ${formatMs(data.duration_ms)}`;
  if (data.spans_omitted) {
    head.append(el("span", "wf-omitted",
      ` · showing the first ${data.spans.length} by start time; ${data.spans_omitted} left out`));
  }
  const axis = el("div", "wf-axis");
  axis.setAttribute("aria-hidden", "true");
  for (const fraction of [0, 0.5, 1]) axis.append(el("span", null, formatMs(data.duration_ms * fraction)));
  const rows = el("ol", "wf-rows");
  rows.append(...data.spans.map((span) => spanRow(span, data.duration_ms)));
  container.replaceChildren(head, axis, rows);
}

async function load(container, url) {
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (response.status === 401) { goToLogin(); return; }
  if (response.status === 404) {
    container.replaceChildren(el("p", "hint", "This turn is no longer stored."));
    return;
  }
  if (!response.ok) {
    if (!container.querySelector(".wf-rows")) container.replaceChildren(el("p", "hint", "Could not load the spans; retrying…"));
    throw new Error(`${url}: HTTP ${response.status}`);
  }
  render(container, await response.json());
}

function toggle(button) {
  const id = button.getAttribute("aria-controls");
  const container = document.getElementById(id);
  if (!container) return;
  if (open.has(id)) {
    open.delete(id);
    container.hidden = true;
    button.setAttribute("aria-expanded", "false");
    return;
  }
  const url = button.dataset.spansUrl;
  // A closed waterfall stops fetching, retries included.
  const entry = { container, refresh: serialised(() => (open.get(id) === entry ? load(entry.container, url) : undefined)) };
  open.set(id, entry);
  container.replaceChildren(el("p", "hint", "Loading spans…"));
  container.hidden = false;
  button.setAttribute("aria-expanded", "true");
  entry.refresh();
}

document.addEventListener("click", (event) => {
  const button = event.target.closest?.(".spans-toggle");
  if (button) toggle(button);
});

// The live page replaces a turn's whole element when the turn changes (and the whole timeline
// after a reconnect): put an open waterfall back in the new element, then fetch it again.
function reopen(turn) {
  for (const [id, entry] of open) {
    const fresh = turn.querySelector(`#${CSS.escape(id)}`);
    if (!fresh || fresh === entry.container) continue;
    fresh.replaceWith(entry.container);
    turn.querySelector(`[aria-controls="${CSS.escape(id)}"]`)?.setAttribute("aria-expanded", "true");
    entry.refresh();
  }
}

new MutationObserver((records) => {
  for (const record of records) {
    for (const node of record.addedNodes) {
      if (node.nodeType !== Node.ELEMENT_NODE) continue;
      if (node.classList.contains("turn")) reopen(node);
      else if (node.id === "timeline") node.querySelectorAll(".turn").forEach(reopen);
    }
  }
}).observe(document.querySelector("main") || document.body, { childList: true, subtree: true });
