// The narrow-screen layout's two helpers (static/css/app.css does the rest):
// - filters fold away: a <details class="fold"> is rendered closed (open when a filter is set) and
//   opened here on screens wide enough to show it beside the list;
// - tables become stacked cards (table.list): each cell is labelled with its column's heading
//   (data-label, shown before the value), from the table's own <thead>, after htmx swaps too.
(function () {
  "use strict";
  var wide = window.matchMedia("(min-width: 48rem)");

  function label(root) {
    var tables = root.querySelectorAll("table.list");
    for (var t = 0; t < tables.length; t++) {
      var heads = tables[t].querySelectorAll("thead th");
      if (!heads.length) continue;
      var rows = tables[t].querySelectorAll("tbody tr, tfoot tr");
      for (var r = 0; r < rows.length; r++) {
        var cells = rows[r].children;
        for (var c = 0; c < cells.length && c < heads.length; c++) {
          var text = heads[c].textContent.trim();
          if (text && !cells[c].hasAttribute("data-label")) cells[c].setAttribute("data-label", text);
        }
      }
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    label(document);
    if (!wide.matches) return;
    var folds = document.querySelectorAll("details.fold");
    for (var i = 0; i < folds.length; i++) folds[i].open = true;
  });
  document.addEventListener("htmx:afterSettle", function () { label(document); });
})();
