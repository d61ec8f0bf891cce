// impyard console: the only script. Two small behaviours, driven by attributes so pages carry no script:
//  * data-refresh-url="/x/fragment" (with data-refresh-s, default 3): the element's content is replaced by that
//    fragment every few seconds (the Now page's live view). A failed fetch keeps what is shown and marks it stale.
//  * data-confirm="Text": a form asks before it posts (Forget, Deny).
"use strict";
(function () {
  function refresh(el) {
    var url = el.getAttribute("data-refresh-url");
    var every = Math.max(1, parseFloat(el.getAttribute("data-refresh-s") || "3")) * 1000;
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
        .then(function (html) { el.innerHTML = html; el.removeAttribute("data-stale"); })
        .catch(function () { el.setAttribute("data-stale", "true"); })
        .finally(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh-url]").forEach(refresh);
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); }
      });
    });
  });
})();
