// Keyboard shortcuts for reviewers: j/k move through the inbox or between calls, Enter opens,
// a approves, r jumps to the rejection reason. Ignored while typing in a field. An approve button
// with data-confirm-key (an amount above its policy's limit) asks first: a second `a` approves,
// any other key cancels.
(function () {
  var armed = null; // the approve button waiting for its confirming key

  function confirmLine() { return document.getElementById("approve-confirm"); }

  function disarm(sentence) {
    armed = null;
    var line = confirmLine();
    if (line) {
      line.textContent = sentence || "";
      line.hidden = !sentence;
    }
  }

  function approve(button) {
    // A panel htmx swapped in is only wired up at settle (20 ms later); wire it now, so the
    // shortcut never falls back to a full-page submit.
    if (window.htmx) htmx.process(button.form);
    button.click();
  }

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
    if (armed) {
      if (["Shift", "Control", "Alt", "Meta", "CapsLock"].includes(key)) return;
      event.preventDefault();
      var confirmed = armed;
      if (key === "a" && document.body.contains(confirmed)) {
        disarm();
        approve(confirmed);
      } else {
        disarm("Not approved.");
      }
      return;
    }
    if (key === "j" || key === "k") {
      if (moveSelection(key === "j" ? 1 : -1)) return event.preventDefault();
      var link = document.querySelector('a[data-key="' + key + '"]');
      if (link) { event.preventDefault(); window.location.assign(link.href); }
    } else if (key === "Enter") {
      var selected = document.querySelector("[data-keyboard-list] tr.selected[data-href]");
      if (selected) { event.preventDefault(); window.location.assign(selected.dataset.href); }
    } else if (key === "a") {
      var button = document.getElementById("approve-button");
      if (button) {
        event.preventDefault();
        var question = button.dataset.confirmKey;
        if (!question) return approve(button);
        armed = button;
        var line = confirmLine();
        if (line) { line.textContent = question; line.hidden = false; }
      }
    } else if (key === "r") {
      var reason = document.getElementById("reject-reason");
      if (reason) { event.preventDefault(); reason.focus(); }
    }
  });
})();
