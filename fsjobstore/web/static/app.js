// fsjobstore dashboard: the theme, live updates (the overview's numbers, a job's progress and
// log), and confirmations. No framework, nothing fetched from elsewhere.
(function () {
  "use strict";
  var saved = null;
  try { saved = localStorage.getItem("fsjobstore-theme"); } catch (e) { /* private mode */ }
  if (saved === "light" || saved === "dark") document.documentElement.setAttribute("data-theme", saved);

  function text(el, value) { if (el) el.textContent = value; }

  function refresh(box) {
    var base = document.body.getAttribute("data-base") || "";  // where the app is mounted
    var url = box.getAttribute("data-refresh");
    var every = parseInt(box.getAttribute("data-every") || "3000", 10);
    function tick() {
      if (document.hidden) return setTimeout(tick, every);
      fetch(url, {credentials: "same-origin", headers: {"Accept": "text/html"}})
        .then(function (r) {
          // Sent to sign in (the session ended: a --token server restarted): go there, whole.
          if (r.redirected && new URL(r.url).pathname === base + "/login") { window.location.href = base + "/login"; return null; }
          if (r.status === 401) { window.location.href = base + "/login"; return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) {
          if (html !== null && !box.contains(document.activeElement)) box.innerHTML = html;
          box.setAttribute("data-updated", String(Date.now()));
        })
        .catch(function () { /* the server is restarting: try again */ })
        .then(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  }

  function follow(box) {
    var source = new EventSource(box.getAttribute("data-events"));
    var shown = (document.getElementById("state") || {}).textContent;  // the state the page was drawn in
    source.addEventListener("error", function () {
      // Closed for good (a 401 once the session ended, a 404 once the job was removed): look at
      // the page again, which signs in or says what became of the job.
      if (source.readyState === EventSource.CLOSED) window.location.replace(window.location.pathname);
    });
    source.addEventListener("job", function (ev) {
      var job = JSON.parse(ev.data);
      var state = document.getElementById("state");
      if (state && state.textContent !== job.state) {
        state.textContent = job.state;
        state.className = "badge big " + job.state;
      }
      text(document.getElementById("attempts"), String(job.attempts));
      var p = job.progress;
      if (p) {
        document.getElementById("progress-box").hidden = false;
        var bar = document.getElementById("progress");
        if (p.total) { bar.max = p.total; bar.value = p.done; } else { bar.removeAttribute("value"); }
        text(document.getElementById("progress-text"),
             p.done + (p.total ? " / " + p.total : "") + (p.message ? " \u00b7 " + p.message : ""));
      }
      var logs = document.getElementById("logs");
      if (logs && job.logs.length) {
        logs.textContent = "";
        job.logs.forEach(function (line) {
          var li = document.createElement("li");
          var t = document.createElement("time");
          t.textContent = new Date(line.at * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
          var n = document.createElement("span");
          n.className = "sub";
          n.textContent = " #" + line.attempt + " ";
          li.appendChild(t); li.appendChild(n); li.appendChild(document.createTextNode(line.line));
          logs.appendChild(li);
        });
        logs.scrollTop = logs.scrollHeight;
      }
      box.setAttribute("data-updated", String(Date.now()));
      if (["fulfilled", "failed", "cancelled"].indexOf(job.state) >= 0 && job.state !== shown) {
        source.close();
        // The final page has the value or error, and the right actions (without the last
        // action's message, which was about the job as it was).
        window.location.replace(window.location.pathname);
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme");
    if (button) button.addEventListener("click", function () {
      var dark = document.documentElement.getAttribute("data-theme") === "dark" ||
        (!document.documentElement.getAttribute("data-theme") && matchMedia("(prefers-color-scheme: dark)").matches);
      var next = dark ? "light" : "dark";
      document.documentElement.setAttribute("data-theme", next);
      try { localStorage.setItem("fsjobstore-theme", next); } catch (e) { /* private mode */ }
    });
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("[data-events]").forEach(follow);
    document.addEventListener("submit", function (ev) {
      var form = ev.target;
      var question = form.getAttribute && form.getAttribute("data-confirm");
      if (question && !window.confirm(question)) ev.preventDefault();
    });
  });
})();
