// Relative times: every <time datetime="..." data-relative> the server rendered (the exact UTC time,
// webapp/web/rendering.py `when`) reads "3 min ago", with the exact time in the viewer's own time
// zone as its title; a <time data-local> reads that exact local time (with seconds only when it has
// data-seconds). Refreshed every minute and after every htmx swap; without JavaScript the exact UTC
// time stays.
(function () {
  "use strict";
  var exact = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", timeZoneName: "short",
  });
  var clock = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit" });
  var clockSeconds = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit", second: "2-digit" });
  var day = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });
  var dayOfYear = new Intl.DateTimeFormat(undefined, { year: "numeric", month: "short", day: "numeric" });

  function relative(moment, now) {
    var seconds = Math.round((now - moment) / 1000);
    var ahead = seconds < 0;
    var s = Math.abs(seconds);
    var text;
    if (s < 45) return ahead ? "in a moment" : "just now";
    if (s < 3600) text = Math.max(1, Math.round(s / 60)) + " min";
    else if (s < 86400) text = Math.round(s / 3600) + " h";
    else if (s < 7 * 86400) {
      var days = Math.round(s / 86400);
      if (days === 1) return ahead ? "tomorrow" : "yesterday";
      text = days + " days";
    } else {
      var sameYear = moment.getFullYear() === now.getFullYear();
      return (sameYear ? day : dayOfYear).format(moment);
    }
    return ahead ? "in " + text : text + " ago";
  }

  function refresh(root) {
    var now = new Date();
    var nodes = (root || document).querySelectorAll("time[datetime][data-relative], time[datetime][data-local]");
    for (var i = 0; i < nodes.length; i++) {
      var node = nodes[i];
      var moment = new Date(node.getAttribute("datetime"));
      if (isNaN(moment.getTime())) continue;
      var sameDay = moment.toDateString() === now.toDateString();
      if (node.hasAttribute("data-relative")) node.textContent = relative(moment, now);
      else if (!sameDay) node.textContent = exact.format(moment);
      else node.textContent = (node.hasAttribute("data-seconds") ? clockSeconds : clock).format(moment);
      node.title = exact.format(moment);
    }
  }

  document.addEventListener("DOMContentLoaded", function () { refresh(document); });
  document.addEventListener("htmx:afterSettle", function () { refresh(document); });
  setInterval(function () { refresh(document); }, 60 * 1000);
})();
