// agentrun history: live updates of a run and of the list (server-sent events), the approve / reject / retry /
// stop buttons.
// The server renders every value escaped; this script only swaps in the server's own HTML fragment, and writes
// what it shows itself (the confirmation) as text, never as HTML.
"use strict";

var lastMessage = "";  // the last action's answer, kept across live updates of the page
var drafts = {};       // the answer fields being typed (by id), kept across live updates of the page
var FIELDS = ["answer-value", "edit-args", "reject-message"];
var source = null;     // the live view's event stream, once one is open

function say(text) {
  lastMessage = text;
  var out = document.getElementById("act-result");
  if (out) { out.textContent = text; }
}

function post(button, body) {
  // The custom header makes this a CORS-preflighted request: no other site can forge it.
  var headers = {"X-Agentrun-Action": "1"};
  if (body !== undefined) { headers["Content-Type"] = "application/json"; }
  button.disabled = true;
  fetch(button.dataset.action, {method: "POST", headers: headers, body: body, credentials: "same-origin"})
    .then(function (response) {
      return response.json().then(function (answer) { return {ok: response.ok, body: answer}; });
    })
    .then(function (r) {
      say(r.ok ? r.body.message : "refused: " + r.body.message);
      if (!r.ok) { button.disabled = false; }
      if (r.ok && button.dataset.verb) { drafts = {}; }
      if (r.ok && button.classList.contains("retry")) { follow(true); }  // the run runs again: follow it
      refresh();
    })
    .catch(function (err) { say(String(err)); button.disabled = false; });
}

// A tool call review's edit: the edited arguments (a JSON object) for the one pending call, its name kept.
function editValue(button) {
  var field = document.getElementById("edit-args");
  var args;
  try {
    args = JSON.parse(field ? field.value : "");
  } catch (err) {
    return {error: "the arguments are not JSON: " + err.message};
  }
  if (args === null || typeof args !== "object" || Array.isArray(args)) {
    return {error: 'the arguments are a JSON object, e.g. {"order_id": "4821"}'};
  }
  return {value: {decisions: [{type: "edit", edited_action: {name: button.dataset.tool, args: args}}]}};
}

// The answer this button sends: the value field's JSON, else the button's default (true / false, or a tool
// call review's decision). Returns {value} or {error}: invalid JSON is said next to the field, nothing is sent.
function answerValue(button) {
  if (button.dataset.hitl === "edit") { return editValue(button); }
  if (button.dataset.hitl === "reject" && button.dataset.tool) {
    var why = document.getElementById("reject-message");
    var decision = {type: "reject"};
    if (why && why.value.trim()) { decision.message = why.value.trim(); }
    return {value: {decisions: [decision]}};
  }
  var field = document.getElementById("answer-value");
  var text = field ? field.value.trim() : "";
  if (!text) { return {value: JSON.parse(button.dataset.default)}; }
  try {
    return {value: JSON.parse(text)};
  } catch (err) {
    return {error: "not JSON: " + err.message + ' (strings need quotes, e.g. "yes")'};
  }
}

function lines(panel, pairs) {
  var list = document.createElement("dl");
  pairs.forEach(function (pair) {
    var term = document.createElement("dt");
    term.textContent = pair[0];
    var detail = document.createElement("dd");
    var code = document.createElement(pair[2] ? "pre" : "span");
    code.textContent = pair[1];
    if (pair[2]) { code.className = "sent"; }
    detail.appendChild(code);
    list.appendChild(term);
    list.appendChild(detail);
  });
  panel.appendChild(list);
}

// Shows exactly what the button will send and sends it only on "Send"; "Cancel" sends nothing.
function confirmThen(button, title, pairs, body) {
  var panel = document.getElementById("act-confirm");
  if (!panel) { return; }
  panel.textContent = "";
  var heading = document.createElement("p");
  heading.className = "confirm-title";
  heading.textContent = title;
  panel.appendChild(heading);
  lines(panel, pairs);
  var send = document.createElement("button");
  send.className = "confirm-send";
  send.textContent = "Send";
  var cancel = document.createElement("button");
  cancel.className = "confirm-cancel";
  cancel.textContent = "Cancel";
  panel.appendChild(send);
  panel.appendChild(cancel);
  panel.hidden = false;
  cancel.addEventListener("click", function () { panel.hidden = true; panel.textContent = ""; refresh(); });
  send.addEventListener("click", function () {
    panel.hidden = true;
    panel.textContent = "";
    post(button, body);
  });
  send.focus();
}

function onAnswer(button) {
  var error = document.getElementById("answer-error");
  var found = answerValue(button);
  if (error) { error.textContent = found.error || ""; }
  if (found.error) { return; }
  var shown = JSON.stringify(found.value, null, 2);
  // An answer names the interrupt and the digest of the question this page shows: the server answers
  // nothing else (409).
  var body = JSON.stringify({interrupt: button.dataset.interrupt, digest: button.dataset.digest, value: found.value});
  var titles = {edit: "Run the tool call with these arguments?", approve: "Approve with this answer?",
    reject: "Reject with this answer?"};
  var pairs = [["Interrupt", button.dataset.ids], ["Question", button.dataset.question]];
  if (button.dataset.tool) { pairs.push(["Tool call", button.dataset.tool]); }
  pairs.push(["Value sent", shown, true]);
  confirmThen(button, titles[button.dataset.hitl || button.dataset.verb], pairs, body);
}

function onRetry(button) {
  var body = JSON.stringify({retry: Number(button.dataset.retry)});
  confirmThen(button, "Retry this run?", [["What happens", button.dataset.confirm]], body);
}

// A step's detail (its state and what it changed) is read when the step is opened, and opened again after a
// live update swapped the page (the server's fragment: every value in it is escaped there).
var openSteps = {};

function bindSteps() {
  document.querySelectorAll("details.step").forEach(function (step) {
    step.addEventListener("toggle", function () {
      var version = step.dataset.version;
      if (!step.open) { delete openSteps[version]; return; }
      openSteps[version] = true;
      if (step.dataset.loaded) { return; }
      step.dataset.loaded = "1";
      fetch(step.dataset.detail, {credentials: "same-origin"})
        .then(function (response) { return response.text().then(function (t) { return {ok: response.ok, text: t}; }); })
        .then(function (r) {
          var body = step.querySelector(".step-body");
          if (!body) { return; }
          if (r.ok) { body.innerHTML = r.text; } else { body.textContent = "could not be read (" + r.text.length + " B)"; }
          step.dataset.shown = "1";
        });
    });
    if (openSteps[step.dataset.version]) { step.open = true; }
  });
}

function bindButtons() {
  bindSteps();
  FIELDS.forEach(function (id) {
    var field = document.getElementById(id);
    if (!field) { return; }
    if (drafts[id] !== undefined) { field.value = drafts[id]; }
    field.addEventListener("input", function () { drafts[id] = field.value; });
  });
  document.querySelectorAll("button.act").forEach(function (button) {
    button.addEventListener("click", function () {
      if (button.dataset.interrupt) { onAnswer(button); }
      else if (button.classList.contains("retry")) { onRetry(button); }
      else { post(button, undefined); }
    });
  });
}

function refresh() {
  var root = document.getElementById("run");
  if (!root) { return; }
  fetch(root.dataset.timeline, {credentials: "same-origin"})
    .then(function (response) { return response.ok ? response.text() : null; })
    .then(function (text) {
      // Never swapped under a confirmation being read (Send and Cancel refresh the page afterwards).
      var panel = document.getElementById("act-confirm");
      if (text === null || (panel && !panel.hidden)) { return; }
      root.innerHTML = text;  // the server's fragment: every value in it is escaped there
      bindButtons();
      say(lastMessage);
      root.dataset.updated = String(Date.now());
      document.body.dataset.updates = String(Number(document.body.dataset.updates || "0") + 1);
    });
}

function follow(again) {
  var root = document.getElementById("run");
  if (!root || !window.EventSource) { return; }
  if (again) { root.dataset.live = "1"; }
  if (root.dataset.live !== "1" || source !== null) { return; }
  source = new EventSource(root.dataset.events);
  source.addEventListener("update", refresh);
  source.addEventListener("end", function () { source.close(); source = null; refresh(); });
}

// The list: each update reads this page's own URL again and swaps in the server's table (escaped there).
function followList() {
  var table = document.getElementById("runs-table");
  if (!table || !window.EventSource) { return; }
  var listSource = new EventSource(table.dataset.events);
  listSource.addEventListener("update", function () {
    fetch(window.location.href, {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("runs-table");
        if (!fresh) { return; }
        table.innerHTML = fresh.innerHTML;
        document.body.dataset.updates = String(Number(document.body.dataset.updates || "0") + 1);
      });
  });
  listSource.addEventListener("end", function () { listSource.close(); });
}

document.addEventListener("DOMContentLoaded", function () { bindButtons(); follow(false); followList(); });
