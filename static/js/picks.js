// Deciding several calls at once on the inbox: the calls a reviewer ticks stay ticked across the
// list's live refreshes (a call decided elsewhere meanwhile simply leaves the list), a group's box
// ticks every call of the group, and the bulk form, kept at the foot of the screen, shows once a
// call is ticked and says how many are.
(function () {
  var picked = new Set(); // the ticked boxes' values: "<call id>:<hash of the arguments shown>"

  function boxes() { return Array.from(document.querySelectorAll('input[name="call"][form="bulk-form"]')); }

  // The bulk form shows once a call is ticked (without this script it always shows).
  function tell() {
    var line = document.getElementById("bulk-count");
    if (!line) return;
    var count = boxes().filter(function (box) { return box.checked; }).length;
    line.textContent = count ? count + (count === 1 ? " call selected." : " calls selected.")
                             : "Select calls to decide several at once.";
    line.closest("form").classList.toggle("idle", !count);
  }

  document.addEventListener("DOMContentLoaded", tell);

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box.matches('input[name="call"][form="bulk-form"]')) {
      if (box.checked) picked.add(box.value); else picked.delete(box.value);
    } else if (box.matches("input[data-select-group]")) {
      boxes().forEach(function (each) {
        if (each.dataset.group !== box.dataset.selectGroup) return;
        each.checked = box.checked;
        if (box.checked) picked.add(each.value); else picked.delete(each.value);
      });
    } else {
      return;
    }
    tell();
  });

  // after deciding, back to the inbox as it is filtered now (the filters change the address in place)
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.elt.id === "bulk-form") event.detail.parameters.back = location.pathname + location.search;
  });

  document.addEventListener("htmx:afterSwap", function () {
    var present = new Set();
    boxes().forEach(function (box) {
      present.add(box.value);
      box.checked = picked.has(box.value);
    });
    picked.forEach(function (value) { if (!present.has(value)) picked.delete(value); });
    tell();
  });
})();
