// Keyboard shortcuts for reviewers: j/k move through the inbox or between calls, Enter opens,
// a approves, r jumps to the rejection reason. Ignored while typing in a field.
(function () {
  function typing(target) {
    return target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
  }

  function listRows() {
    return Array.from(document.querySelectorAll("[data-keyboard-list] tbody tr[data-href]"));
  }

  function moveSelection(step) {
    var rows = listRows();
    if (!rows.length) return false;
    var current = rows.findIndex(function (row) { return row.classList.contains("selected"); });
    var next = Math.min(rows.length - 1, Math.max(0, current + step));
    rows.forEach(function (row) { row.classList.remove("selected"); });
    rows[next].classList.add("selected");
    rows[next].scrollIntoView({ block: "nearest" });
    return true;
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    var key = event.key;
    if (key === "j" || key === "k") {
      if (moveSelection(key === "j" ? 1 : -1)) return event.preventDefault();
      var link = document.querySelector('a[data-key="' + key + '"]');
      if (link) { event.preventDefault(); window.location.assign(link.href); }
    } else if (key === "Enter") {
      var selected = document.querySelector("[data-keyboard-list] tr.selected[data-href]");
      if (selected) { event.preventDefault(); window.location.assign(selected.dataset.href); }
    } else if (key === "a") {
      var approve = document.getElementById("approve-button");
      if (approve) {
        event.preventDefault();
        // A panel htmx swapped in is only wired up at settle (20 ms later); wire it now, so the
        // shortcut never falls back to a full-page submit.
        if (window.htmx) htmx.process(approve.form);
        approve.click();
      }
    } else if (key === "r") {
      var reason = document.getElementById("reject-reason");
      if (reason) { event.preventDefault(); reason.focus(); }
    }
  });
})();
