// agentrun history: live updates (server-sent events) and the approve / reject / stop buttons.
// The server renders every value escaped; this script only swaps in the server's own HTML fragment.
"use strict";

var lastMessage = "";  // the last action's answer, kept across live updates of the page

function say(text) {
  lastMessage = text;
  var out = document.getElementById("act-result");
  if (out) { out.textContent = text; }
}

function bindButtons() {
  document.querySelectorAll("button.act").forEach(function (button) {
    button.addEventListener("click", function () {
      button.disabled = true;
      // The custom header makes this a CORS-preflighted request: no other site can forge it. An answer names
      // the interrupt and the digest of the question this page shows: the server answers nothing else (409).
      var body = button.dataset.interrupt ?
        JSON.stringify({interrupt: button.dataset.interrupt, digest: button.dataset.digest}) : undefined;
      var headers = {"X-Agentrun-Action": "1"};
      if (body) { headers["Content-Type"] = "application/json"; }
      fetch(button.dataset.action, {method: "POST", headers: headers, body: body, credentials: "same-origin"})
        .then(function (response) {
          return response.json().then(function (body) { return {ok: response.ok, body: body}; });
        })
        .then(function (r) {
          say(r.ok ? r.body.message : "refused: " + r.body.message);
          if (!r.ok) { button.disabled = false; }
          refresh();
        })
        .catch(function (err) { say(String(err)); button.disabled = false; });
    });
  });
}

function refresh() {
  var root = document.getElementById("run");
  if (!root) { return; }
  fetch(root.dataset.timeline, {credentials: "same-origin"})
    .then(function (response) { return response.ok ? response.text() : null; })
    .then(function (text) {
      if (text === null) { return; }
      root.innerHTML = text;  // the server's fragment: every value in it is escaped there
      bindButtons();
      say(lastMessage);
      root.dataset.updated = String(Date.now());
      document.body.dataset.updates = String(Number(document.body.dataset.updates || "0") + 1);
    });
}

function follow() {
  var root = document.getElementById("run");
  if (!root || root.dataset.live !== "1" || !window.EventSource) { return; }
  var source = new EventSource(root.dataset.events);
  source.addEventListener("update", refresh);
  source.addEventListener("end", function () { source.close(); refresh(); });
}

document.addEventListener("DOMContentLoaded", function () { bindButtons(); follow(); });
