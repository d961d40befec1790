// Copy the installed front-end packages into static/vendor/, where the app serves them itself.
import { copyFileSync, mkdirSync } from "node:fs";

const assets = {
  "node_modules/htmx.org/dist/htmx.min.js": "static/vendor/htmx.min.js",
  "node_modules/htmx-ext-sse/dist/sse.min.js": "static/vendor/htmx-ext-sse.min.js",
};
mkdirSync("static/vendor", { recursive: true });
for (const [from, to] of Object.entries(assets)) {
  copyFileSync(from, to);
  console.log(`vendored ${to}`);
}
