// Keyboard shortcuts for reviewers: j/k move through the inbox or between calls, Enter opens,
// a approves, r jumps to the rejection reason. Ignored while typing in a field. An approve button
// with data-confirm-key (an amount above its policy's limit) asks first: a second `a` approves,
// any other key cancels.
(function () {
  // The question (or "Not approved.") stays on screen across live refreshes of the panel; what is
  // armed is the call (its form's action), not the button, which a refresh replaces.
  var armed = null; // the action of the approve form waiting for its confirming key
  var shown = ""; // what the confirming line says now

  function approveButton() { return document.getElementById("approve-button"); }

  function say(sentence) {
    shown = sentence || "";
    var line = document.getElementById("approve-confirm");
    if (line) {
      line.textContent = shown;
      line.hidden = !shown;
      // the reviewer pressed a key where they are reading: bring the question there (no jump when seen)
      if (shown) line.scrollIntoView({ block: "nearest" });
    }
  }

  function approve(button) {
    // A panel htmx swapped in is only wired up at settle (20 ms later); wire it now, so the
    // shortcut never falls back to a full-page submit.
    if (window.htmx) htmx.process(button.form);
    button.click();
  }

  document.addEventListener("htmx:afterSwap", function () {
    var button = approveButton();
    if (armed && !(button && button.form.action === armed && button.dataset.confirmKey)) {
      armed = null; // decided elsewhere meanwhile: nothing left to confirm
      shown = "";
    }
    if (shown) say(shown);
  });

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
    if (["Shift", "Control", "Alt", "Meta", "CapsLock"].includes(key)) return;
    if (!armed && shown) say(""); // "Not approved." has been read
    if (armed) {
      event.preventDefault();
      var current = approveButton();
      var same = current && current.form.action === armed;
      armed = null;
      if (key === "a" && same) {
        say("");
        approve(current);
      } else {
        say("Not approved.");
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
      var button = approveButton();
      if (button) {
        event.preventDefault();
        var question = button.dataset.confirmKey;
        if (!question) return approve(button);
        armed = button.form.action;
        say(question);
      }
    } else if (key === "r") {
      var reason = document.getElementById("reject-reason");
      if (reason) { event.preventDefault(); reason.focus(); }
    }
  });
})();
