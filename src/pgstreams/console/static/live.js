// pgstreams console: live updates without a build step. Every data-refresh seconds the page is fetched
// again and its #live part swapped in; forms and the scroll position stay as they are.
(function () {
  "use strict";
  var seconds = parseFloat(document.body.getAttribute("data-refresh")) || 3;
  var state = document.getElementById("live-state");
  function update() {
    var live = document.getElementById("live");
    if (!live || document.hidden) { return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "live" } })
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        if (fresh) { live.innerHTML = fresh.innerHTML; }
        if (state) { state.classList.remove("stale"); state.setAttribute("data-updated", String(Date.now())); }
      })
      .catch(function () { if (state) { state.classList.add("stale"); } });
  }
  window.setInterval(update, seconds * 1000);
})();
