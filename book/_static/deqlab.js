/* Tables that do not fit the text column even with wrapped cells (a phone's width, or the errata's
   five columns of formulas on a laptop) are shown stacked: one block per row, each cell under its
   column's header, instead of a table whose last columns hide in a scroll box. The test runs after
   MathJax has typeset the page (formulas set a table's minimum width) and again on every resize;
   deqlab.css styles `table.deqlab-stacked`. Without JavaScript the tables stay tables that scroll. */
(function () {
  "use strict";

  function headers(table) {
    const row = table.querySelector("thead tr");
    return row ? Array.from(row.children).map((cell) => cell.textContent.trim()) : [];
  }

  function label(table) {
    const names = headers(table);
    table.querySelectorAll("tbody tr").forEach((row) => {
      Array.from(row.children).forEach((cell, index) => {
        if (names[index]) cell.setAttribute("data-label", names[index]);
        // an empty cell says nothing in a stacked row: no "note:" with nothing after it
        cell.classList.toggle("deqlab-empty-cell", cell.textContent.trim() === "" && !cell.querySelector("img, svg"));
      });
    });
  }

  function fit() {
    document.querySelectorAll("article.bd-article table").forEach((table) => {
      if (!table.querySelector("thead tr")) return; // nothing to label the stacked cells with
      table.classList.remove("deqlab-stacked");
      const room = table.parentElement.clientWidth;
      if (room > 0 && table.getBoundingClientRect().width > room + 1) {
        label(table);
        table.classList.add("deqlab-stacked");
      }
    });
  }

  function afterTypesetting() {
    const mathjax = window.MathJax;
    if (mathjax && mathjax.startup && mathjax.startup.promise) {
      mathjax.startup.promise.then(fit, fit);
    } else {
      fit();
    }
  }

  let pending = null;
  window.addEventListener("resize", () => {
    window.cancelAnimationFrame(pending);
    pending = window.requestAnimationFrame(fit);
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", afterTypesetting);
  } else {
    afterTypesetting();
  }
  if (document.fonts && document.fonts.ready) document.fonts.ready.then(fit);
})();
