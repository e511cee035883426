// Runs the management page's script (ops/http/static/index.html) in Node.js against a live node:
// a minimal DOM stands in for the browser (tables, text, a canvas that records its drawing), fetch
// is Node's own with the page's basic credentials added, as a browser does after the login.
// Usage: node ui_harness.js PAGE_FILE BASE_URL USER PASSWORD -> JSON of what the page shows.
"use strict";
const fs = require("fs");
const [pageFile, base, user, password] = process.argv.slice(2);
const html = fs.readFileSync(pageFile, "utf8");
const script = html.match(/<script>([\s\S]*)<\/script>/)[1];

function element(id) {
  const el = {
    id, textContent: "", innerHTML: "", style: {}, className: "", children: [], drawn: 0,
    classList: { add(c) { el.className += " " + c; } },
    appendChild(child) { el.children.push(child); return child; },
    replaceChildren() { el.children = []; },
    getContext() {
      return { clearRect() {}, beginPath() {}, moveTo() { el.drawn++; }, lineTo() { el.drawn++; }, stroke() {},
               set strokeStyle(v) {} };
    },
    width: 720, height: 160,
  };
  el.tBodies = [el];
  return el;
}
const elements = {};
globalThis.document = {
  getElementById(id) { return elements[id] || (elements[id] = element(id)); },
  createElement(tag) { return element(tag); },
};
const auth = "Basic " + Buffer.from(`${user}:${password}`).toString("base64");
const realFetch = globalThis.fetch;
globalThis.fetch = (path, options) => realFetch(base + path, { ...options, headers: { Authorization: auth } });
globalThis.setInterval = () => 0;

(async () => {
  // The page calls refresh() once on load; call it again and wait: two samples on the chart.
  const run = new Function(script + "\nreturn refresh;");
  const refresh = run();
  await new Promise(resolve => setTimeout(resolve, 500));
  await refresh();
  const table = id => elements[id].style.display === "none" ? null
    : elements[id].children.map(tr => tr.children.map(td => td.textContent));
  console.log(JSON.stringify({
    status: elements.status.textContent, node: elements.node.textContent, chartPoints: elements.chart.drawn,
    legend: elements.legend.innerHTML, nodes: table("nodes"), queues: table("queues"),
    connections: table("connections"), channels: table("channels"), users: table("users"),
  }));
})();
