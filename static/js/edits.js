// A live refresh of the decision panel (someone decided something elsewhere) swaps in a fresh
// panel; a reviewer half-way through a reason or the edit form keeps what they typed, and an open
// edit form stays open. Only refreshes (GET) are touched: the answer to a posted decision carries
// its own values and errors.
(function () {
  var kept = null;

  function typedFields(root) {
    return Array.from(root.querySelectorAll("input[id], textarea[id], select[id]")).filter(function (field) {
      return field.type !== "hidden";
    });
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    kept = null;
    var target = event.detail.target;
    if (!target || target.id !== "decision-panel" || event.detail.requestConfig.verb !== "get") return;
    var edit = document.getElementById("edit");
    kept = { editOpen: Boolean(edit && edit.open), values: {} };
    typedFields(target).forEach(function (field) { kept.values[field.id] = field.value; });
  });

  document.addEventListener("htmx:afterSwap", function () {
    if (!kept) return;
    var state = kept;
    kept = null;
    var edit = document.getElementById("edit");
    if (edit && state.editOpen) edit.open = true;
    Object.keys(state.values).forEach(function (id) {
      var field = document.getElementById(id);
      if (field && field.type !== "hidden") field.value = state.values[id];
    });
  });
})();
