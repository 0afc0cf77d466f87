// The playground: asks POST /v1/answer (or /v1/answer/batch) and shows the answer in its context.
// Text from the user or the server is only ever put into the page as textContent (never HTML).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, samples: [], results: [], context: "" };

function setText(el, text) { el.textContent = text; return el; }

function showError(message) {
  const box = $("error");
  box.hidden = !message;
  setText(box, message || "");
}

// The API key, when the server wants one, lives in the key field only (never in storage or the URL).
function authHeaders(headers) {
  const key = $("api-key").value.trim();
  return key ? { ...headers, authorization: `Bearer ${key}` } : headers;
}

function needKey(message) {
  $("key-row").hidden = false;
  if (message) showError(message);
  $("api-key").focus();
}

async function getJSON(url) {
  const r = await fetch(url, { headers: authHeaders({ accept: "application/json" }) });
  if (r.status === 401) {
    needKey("");
    throw new Error(`${url}: this server needs an API key (HTTP 401); enter it above`);
  }
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

async function loadModel() {
  try {
    const m = await getJSON("/v1/model");
    state.model = m;
    setText($("model-line"),
      `Model ${m.name} (${m.head} head, ${m.precision}, ${m.backend}); ${decisionText(m)}; ` +
      `windows of ${m.max_seq_len} tokens; ${m.ready ? "ready" : "loading"}.`);
    $("threshold").placeholder = modelThreshold(m);
  } catch (e) {
    setText($("model-line"), `Could not read /v1/model: ${e.message}`);
  }
}

// How the served model decides "no answer": a fitted answerability model or a plain threshold.
function decisionText(m) {
  const a = m.answerability;
  if (!a || a.kind !== "fitted") return `no-answer threshold ${m.no_answer_threshold}`;
  const rules = {
    threshold: `no-answer threshold ${a.threshold}`,
    expected_gain: "no-answer threshold per question (expected gain)",
    none: "answers no question (its fitted rule did not beat answering none; set a threshold, 1 for the best span always)",
  };
  const rule = rules[a.rule] || `rule ${a.rule}`;
  const cv = a.cv_f1 == null ? "" : ` (cross-validated F1 ${a.cv_f1.toFixed(1)} vs ${a.cv_no_answer_f1.toFixed(1)} answering none)`;
  return `${rule}, P(answerable) from ${a.features.join(", ")}${cv}`;
}

function modelThreshold(m) {
  const a = m.answerability;
  if (a && a.kind === "fitted" && a.rule !== "threshold") return "model's rule";
  return `model's: ${a && a.threshold != null ? a.threshold : m.no_answer_threshold}`;
}

async function loadSamples() {
  try {
    state.samples = await getJSON("/playground/samples.json");
  } catch (e) {
    state.samples = [];
  }
  const select = $("sample");
  state.samples.forEach((s, i) => {
    const opt = document.createElement("option");
    opt.value = String(i);
    opt.textContent = s.title;
    select.appendChild(opt);
  });
}

function pickSample() {
  const s = state.samples[Number($("sample").value)];
  if (!s || $("sample").value === "") return;
  $("context").value = s.context;
  $("question").value = s.questions.join("\n");
  $("batch").checked = s.questions.length > 1;  // one question per line, each asked on its own
}

function requestBody(question, context) {
  const body = { question, context, top_k: Number($("top-k").value) || 1 };
  const t = $("threshold").value.trim();
  if (t !== "") body.threshold = Number(t);
  return body;
}

async function post(url, body) {
  const r = await fetch(url, {
    method: "POST",
    headers: authHeaders({ "content-type": "application/json", accept: "application/json" }),
    body: JSON.stringify(body),
  });
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (r.status === 401) needKey("");
  if (!r.ok) {
    const what = data && data.message ? `${data.error}: ${data.message}` : r.statusText || "error";
    throw new Error(`HTTP ${r.status} ${what}`);
  }
  if (data === null) throw new Error(`HTTP ${r.status}: the server's answer is not JSON`);
  return data;
}

function renderContext(context, res) {
  const view = $("context-view");
  view.replaceChildren();
  // The answer is a <mark>; with "no answer", the best span the model declined is outlined instead.
  const answered = res && !res.is_impossible && res.start >= 0;
  const span = answered ? res : (res && res.best_span) || null;
  if (!span) {
    view.appendChild(document.createTextNode(context));
    return;
  }
  // The API's offsets count code points (Python str); JS strings index UTF-16 units, so slice code points.
  const chars = Array.from(context);
  const el = document.createElement(answered ? "mark" : "span");
  if (!answered) el.className = "best-span";
  el.dataset.start = String(span.start);
  el.dataset.end = String(span.end);
  el.textContent = chars.slice(span.start, span.end).join("");
  view.append(document.createTextNode(chars.slice(0, span.start).join("")), el,
    document.createTextNode(chars.slice(span.end).join("")));
}

function fact(dl, name, value, id) {
  const dt = document.createElement("dt");
  const dd = document.createElement("dd");
  dt.textContent = name;
  dd.textContent = value;
  if (id) dd.id = id;
  dl.append(dt, dd);
}

function threshold() {
  const t = $("threshold").value.trim();
  if (t !== "") return String(Number(t));
  return state.model ? modelThreshold(state.model) : "the model's";
}

// What set a question's threshold (the answer's "rule"), in words.
const RULES = {
  request: "the no-answer threshold you set",
  server: "this server's no-answer threshold",
  cls: "the model's no-answer threshold",
  threshold: "the model's fitted answerability rule",
  expected_gain: "the model's expected-gain rule",
};

// Why "no answer": the rule's bar on P(answerable) (answered iff p(no answer) <= threshold), so a
// P(answerable) above one half beside "No answer" reads as the rule it is, not a contradiction.
function whyNoAnswer(res, pAnswerable) {
  if (!res.best_span) return "No span of this context can be an answer.";
  if (res.rule === "none") return "The model answers no question: its fitted answerability rule did not beat answering none.";
  const rule = RULES[res.rule] || "the server's rule";
  if (res.threshold == null) return `Declined by ${rule}.`;
  if (res.threshold === 0) return `Declined by ${rule}: at 0 it answers no question.`;
  const bar = `P(answerable) ≥ ${(1 - res.threshold).toFixed(3)}`;
  const when = res.rule === "expected_gain"
    ? `only when fairly sure: ${bar} here (the better the best span looks, the lower the bar)`
    : `only when ${bar}`;
  const weighed = res.rule === "expected_gain" && res.reason ? ` (${res.reason.replace(/^no answer: /, "")})` : "";
  return `Declined by ${rule}: it answers ${when}; this question's is ${pAnswerable.toFixed(3)}${weighed}. ` +
    "A threshold of 1 answers with the best span whatever the rule says.";
}

function renderOne(res, thresholdUsed) {
  const line = $("answer-line");
  line.replaceChildren();
  const pAnswerable = res.answerable_prob == null ? 1 - res.no_answer_prob : res.answerable_prob;
  if (res.is_impossible) {
    line.appendChild(setText(document.createElement("strong"), "No answer"));
    line.appendChild(document.createTextNode(` (P(answerable) ${pAnswerable.toFixed(2)})`));
    if (res.best_span) {
      line.appendChild(document.createTextNode(" — best span: "));
      line.appendChild(setText(document.createElement("q"), res.best_span.text));
    }
  } else {
    line.appendChild(setText(document.createElement("strong"), res.answer));
    line.appendChild(document.createTextNode(` (P(answerable) ${pAnswerable.toFixed(2)})`));
  }
  line.dataset.impossible = String(res.is_impossible);
  setText($("why"), res.is_impossible ? whyNoAnswer(res, pAnswerable) : "").hidden = !res.is_impossible;
  const facts = $("facts");
  facts.replaceChildren();
  fact(facts, "P(answerable)", pAnswerable.toFixed(4), "answerable-prob");
  fact(facts, "p(no answer)", res.no_answer_prob.toFixed(4), "no-answer-prob");
  fact(facts, "threshold", res.threshold == null ? thresholdUsed : String(Number(res.threshold.toFixed(4))), "threshold-used");
  fact(facts, "span score", res.score === null ? "–" : res.score.toFixed(3));
  fact(facts, "characters", res.start < 0 ? "–" : `${res.start}–${res.end}`);
  const t = res.timing_ms;
  fact(facts, "timing (ms)", `featurize ${t.featurize.toFixed(1)}, queue ${t.queue.toFixed(1)}, ` +
    `inference ${t.inference.toFixed(1)}, decode ${t.decode.toFixed(1)}, total ${t.total.toFixed(1)}`, "timing");
  renderContext(state.context, res);
  const rows = (res.n_best || []).map((e) => {
    const tr = document.createElement("tr");
    for (const v of [e.text, `${e.start}–${e.end}`, e.score.toFixed(3), e.probability.toFixed(4)]) {
      tr.appendChild(setText(document.createElement("td"), v));
    }
    return tr;
  });
  $("nbest").tBodies[0].replaceChildren(...rows);
  $("nbest-box").hidden = rows.length === 0;
}

function select(index) {
  state.results.forEach((_, i) => {
    $("batch-table").tBodies[0].rows[i].classList.toggle("selected", i === index);
  });
  renderOne(state.results[index].res, state.results[index].threshold);
}

function renderBatch(questions, results, thresholdUsed) {
  state.results = results.map((res, i) => ({ question: questions[i], res, threshold: thresholdUsed }));
  const rows = state.results.map(({ question, res }, i) => {
    const tr = document.createElement("tr");
    tr.tabIndex = 0;
    tr.append(setText(document.createElement("td"), question),
      setText(document.createElement("td"), res.is_impossible ? "(no answer)" : res.answer),
      setText(document.createElement("td"), res.no_answer_prob.toFixed(4)));
    tr.addEventListener("click", () => select(i));
    tr.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); select(i); } });
    return tr;
  });
  $("batch-table").tBodies[0].replaceChildren(...rows);
  $("batch-results").hidden = false;
  select(0);
}

async function ask(ev) {
  if (ev) ev.preventDefault();
  if ($("ask").disabled) return;  // one request at a time: answers render in the order asked
  showError("");
  const context = $("context").value;
  const lines = $("question").value.split("\n").map((q) => q.trim()).filter((q) => q);
  if (!context.trim() || lines.length === 0) {
    showError("Enter a context and a question.");
    return;
  }
  const batch = $("batch").checked;
  if (!batch && lines.length > 1) {
    showError("One question per line: check Batch to ask each line, or leave a single question.");
    return;
  }
  const button = $("ask");
  button.disabled = true;
  try {
    state.context = context;
    const used = threshold();
    if (batch) {
      const data = await post("/v1/answer/batch", { items: lines.map((q) => requestBody(q, context)) });
      renderBatch(lines, data.results, used);
    } else {
      $("batch-results").hidden = true;
      state.results = [];
      renderOne(await post("/v1/answer", requestBody(lines[0], context)), used);
    }
    $("result").hidden = false;
    $("result").dataset.done = String(Date.now());
  } catch (e) {
    $("result").hidden = true;
    showError(e.message);
  } finally {
    button.disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("ask-form").addEventListener("submit", ask);
  $("sample").addEventListener("change", pickSample);
  $("api-key").addEventListener("change", loadModel);
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) ask(ev);
  });
  loadModel();
  loadSamples();
});
