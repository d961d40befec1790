// A live refresh of the decision panel (someone decided something elsewhere) swaps in a fresh
// panel; a reviewer half-way through a reason or the edit form keeps what they typed, and an open
// edit form stays open. A refresh that brings exactly the markup the panel was last refreshed with
// (the change was elsewhere: another call, or this reviewer's own claim) is not swapped in at all.
// Only refreshes (GET) are touched: the answer to a posted decision carries its own values and errors.
(function () {
  var kept = null;

  // A panel's markup as it matters to the reviewer: the form's CSRF token is signed anew each time
  function comparable(markup) {
    return markup.replace(/name="csrf_token" value="[^"]*"/g, 'name="csrf_token"');
  }

  function typedFields(root) {
    return Array.from(root.querySelectorAll("input[id], textarea[id], select[id]")).filter(function (field) {
      return field.type !== "hidden";
    });
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    kept = null;
    var target = event.detail.target;
    if (!target || target.id !== "decision-panel" || event.detail.requestConfig.verb !== "get") return;
    var markup = comparable(event.detail.serverResponse);
    if (markup === target.lastRefresh) {
      event.detail.shouldSwap = false;
      return;
    }
    var edit = document.getElementById("edit");
    kept = { editOpen: Boolean(edit && edit.open), values: {}, markup: markup };
    typedFields(target).forEach(function (field) { kept.values[field.id] = field.value; });
  });

  document.addEventListener("htmx:afterSwap", function () {
    if (!kept) return;
    var state = kept;
    kept = null;
    var panel = document.getElementById("decision-panel");
    if (panel) panel.lastRefresh = state.markup;
    var edit = document.getElementById("edit");
    if (edit && state.editOpen) edit.open = true;
    Object.keys(state.values).forEach(function (id) {
      var field = document.getElementById(id);
      if (field && field.type !== "hidden") field.value = state.values[id];
    });
  });
})();
