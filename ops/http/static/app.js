// raftmq's management UI (served as /static/app.js by ops/http/server.py; the page is index.html).
//
// A login form opens a session (POST /api/login: an HttpOnly cookie and a CSRF token); every API
// call then goes with the cookie, and every change with the token in X-CSRF-Token.  The tabs are
// RabbitMQ's (Overview, Connections, Channels, Exchanges, Queues, Admin) and raftmq's Cluster, on the API;
// lists are paged and filtered by the server (page, page_size, name, use_regex).  What a user sees
// follows its tags as the server reports them (/api/whoami "grants": ops/http/login.py), and the
// API refuses what the tags do not allow whatever the page shows.  Text from the server is put in
// the page with textContent only (never as HTML).
"use strict";

const REFRESH_MS = 5000;
const state = {user: null, csrf: "", grants: [], overview: null, timer: null, view: null};

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.reason || body.error)) || `HTTP ${status}`);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = {"X-Requested-With": "XMLHttpRequest"};  // 401 without a Basic challenge
  if (method !== "GET") headers["X-CSRF-Token"] = state.csrf;
  const init = {method, headers, credentials: "same-origin"};
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(location.origin + path, init);
  // Members that did not answer a cluster-wide list (ops/http/members.py): their rows are absent.
  state.missing = response.headers.get("X-Raftmq-Members-Missing") || "";
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (response.status === 401 && path !== "/api/login") {
    showLogin("Your session has ended: log in again.");
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

const enc = encodeURIComponent;
const may = tag => state.grants.includes(tag);

// ------------------------------------------------------------------ DOM helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
  return el;
}

function flash(text, ok = true) {
  const el = document.getElementById("flash");
  el.textContent = text;
  el.className = ok ? "ok" : "error";
}

async function act(what, fn) {
  try {
    await fn();
    if (what) flash(what);
    await refresh();
  } catch (error) {
    flash(error.message, false);
  }
}

// Deleting and purging ask first, as RabbitMQ's UI does ("Are you sure? This object cannot be
// recovered after deletion."): in the page (a bar with Yes/Cancel after the button) rather than
// window.confirm, so that nothing blocks the page's script.  One question open at a time.
function confirmThen(question, what, fn) {
  return event => {
    document.getElementById("confirm")?.remove();
    const bar = h("div", {id: "confirm", class: "confirm", role: "alertdialog"}, h("span", {id: "confirm-question",
      text: `${question} This cannot be undone.`}), " ",
      h("button", {id: "confirm-yes", type: "button", text: "Yes", onclick: () => { bar.remove(); act(what, fn); }}), " ",
      h("button", {id: "confirm-no", type: "button", text: "Cancel", onclick: () => bar.remove()}));
    event.currentTarget.after(bar);
  };
}

function table(id, columns, rows) {
  // columns: [header, row -> value or node, {numeric, cls}]
  return h("table", {id, class: "list"},
    h("thead", {}, h("tr", {}, columns.map(([title]) => h("th", {text: title})))),
    h("tbody", {}, rows.map(row => h("tr", {}, columns.map(([, get, opts = {}]) => {
      const value = get(row);
      const td = h("td", {class: [opts.numeric ? "n" : "", opts.cls ? opts.cls(row) : ""].join(" ").trim() || null});
      if (value instanceof Node) td.appendChild(value);
      else td.textContent = value === null || value === undefined ? "" : String(value);
      return td;
    })))));
}

function field(label, input) {
  return h("tr", {}, h("th", {}, h("label", {for: input.id, text: label})), h("td", {}, input));
}

function select(id, options, value) {
  return h("select", {id}, options.map(([v, label]) => h("option", {value: v, selected: v === value}, label)));
}

function val(id) { return document.getElementById(id).value; }

function section(title, ...content) {
  return h("section", {}, h("h3", {text: title}), ...content);
}

function features(item) {
  return [item.durable ? "D" : "", item.auto_delete ? "AD" : "", item.exclusive ? "Excl" : "",
          item.internal ? "I" : ""].filter(Boolean).join(" ");
}

function rate(details) { return details && details.rate !== undefined ? `${details.rate}/s` : ""; }

function jsonArguments(id) {
  const text = val(id).trim();
  if (!text) return {};
  const value = JSON.parse(text);
  if (typeof value !== "object" || Array.isArray(value)) throw new Error("Arguments must be a JSON object");
  return value;
}

// ------------------------------------------------------------------ paged lists (server side)

// A list filtered and paged by the server, as RabbitMQ's UI: ?page=&page_size=&name=&use_regex=.
class Pager {
  constructor(id, path, columns) {
    Object.assign(this, {id, path, columns, page: 1, pageSize: 100, name: "", regex: false});
    this.root = h("div", {id});
  }

  controls(result) {
    const pages = Array.from({length: result.page_count}, (_, i) => [String(i + 1), String(i + 1)]);
    const pageSelect = select(`${this.id}-page`, pages, String(result.page));
    pageSelect.addEventListener("change", () => { this.page = Number(pageSelect.value); this.load(); });
    const filter = h("input", {id: `${this.id}-filter`, value: this.name, placeholder: "Filter"});
    filter.addEventListener("input", () => { this.name = filter.value; });  // kept across refreshes
    filter.addEventListener("change", () => { this.name = filter.value; this.page = 1; this.load(); });
    const regex = h("input", {id: `${this.id}-regex`, type: "checkbox", checked: this.regex});
    regex.addEventListener("change", () => { this.regex = regex.checked; this.page = 1; this.load(); });
    const size = select(`${this.id}-size`, [["20", "20"], ["100", "100"], ["500", "500"]], String(this.pageSize));
    size.addEventListener("change", () => { this.pageSize = Number(size.value); this.page = 1; this.load(); });
    return h("div", {class: "pager"}, "Page ", pageSelect, ` of ${result.page_count} - Filter: `, filter,
             h("label", {}, regex, " Regex"), ` Displaying ${result.items.length} item(s) of `,
             h("span", {id: `${this.id}-count`, text: result.filtered_count}),
             ` (${result.total_count} in all), page size up to: `, size);
  }

  async load() {
    const query = new URLSearchParams({page: this.page, page_size: this.pageSize, name: this.name,
                                       use_regex: String(this.regex), pagination: "true"});
    let result;
    try {
      result = await api("GET", `${this.path}?${query}`);
    } catch (error) {
      if (error.status === 400 && this.page > 1) { this.page = 1; return this.load(); }
      this.root.replaceChildren(h("p", {class: "error", text: error.message}));
      return;
    }
    const focused = document.activeElement && document.activeElement.id;
    const missing = state.missing ? h("p", {id: `${this.id}-missing`, class: "error",
      text: `Not answering (their rows are missing): ${state.missing}`}) : null;
    this.root.replaceChildren(...[missing, this.controls(result), table(`${this.id}-table`, this.columns,
                                                                        result.items)].filter(Boolean));
    if (focused && focused.startsWith(this.id)) document.getElementById(focused)?.focus();
  }
}

// ------------------------------------------------------------------ views

async function vhostNames() {
  return (await api("GET", "/api/vhosts?columns=name")).map(v => v.name);
}

const views = {};

views.overview = async () => {
  const nodes = h("div", {id: "nodes-box"});
  const totals = h("div", {id: "totals-box"});
  const chart = h("canvas", {id: "chart", width: 720, height: 140});
  const main = [section("Totals", totals, chart), may("monitoring") ? section("Nodes", nodes) : null];
  const samples = [];
  async function load() {
    const overview = await api("GET", "/api/overview");
    state.overview = overview;
    const q = overview.queue_totals, o = overview.object_totals, m = overview.message_stats || {};
    totals.replaceChildren(
      h("h4", {text: "Queued messages"}),
      table("queued", [["Ready", x => x.messages_ready, {numeric: true}], ["Unacked", x => x.messages_unacknowledged,
        {numeric: true}], ["Total", x => x.messages, {numeric: true}], ["Delayed", x => x.messages_delayed,
        {numeric: true}]], [q]),
      h("h4", {text: "Message rates"}),
      table("rates", [["Publish", x => rate(x.publish_details)], ["Deliver / get", x => rate(x.deliver_get_details)],
        ["Acknowledge", x => rate(x.ack_details)], ["Unroutable (drop)", x => rate(x.drop_unroutable_details)]], [m]),
      h("h4", {text: "Global counts"}),
      table("object-totals", [["Connections", x => x.connections, {numeric: true}], ["Channels", x => x.channels,
        {numeric: true}], ["Exchanges", x => x.exchanges, {numeric: true}], ["Queues", x => x.queues, {numeric: true}],
        ["Consumers", x => x.consumers, {numeric: true}]], [o]),
      h("h4", {text: "Listeners"}),
      table("listeners", [["Protocol", x => x.protocol], ["Bound to", x => x.ip_address], ["Port", x => x.port,
        {numeric: true}]], overview.listeners || []));
    samples.push(q.messages || 0);
    if (samples.length > 120) samples.shift();
    draw(chart, samples);
    if (may("monitoring")) {
      const rows = await api("GET", "/api/nodes");
      nodes.replaceChildren(table("nodes", [
        ["Name", n => n.name], ["Running", n => n.running ? "yes" : "no", {cls: n => n.running ? "" : "down"}],
        ["Raft role", n => n.raft && n.raft.role, {cls: n => n.raft && n.raft.leader ? "leader" : ""}],
        ["Term", n => n.raft && n.raft.term, {numeric: true}],
        ["Commit index", n => n.raft && n.raft.commit_index, {numeric: true}],
        ["Applied index", n => n.raft && n.raft.applied_index, {numeric: true}],
        ["Lag (entries)", n => n.raft && n.raft.lag, {numeric: true}]], rows));
    }
  }
  return {title: "Overview", content: main, load};
};

// Several series on one chart (the queue page's publish / deliver / ack rates): each {label, color,
// samples}; the last 120 samples, scaled to the largest value shown.
function drawSeries(canvas, series, title) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const max = Math.max(1, ...series.flatMap(s => s.samples));
  series.forEach((s, n) => {
    ctx.strokeStyle = s.color;
    ctx.beginPath();
    s.samples.forEach((v, i) => {
      const x = canvas.width * i / 119, y = canvas.height - 4 - (canvas.height - 8) * v / max;
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
    ctx.fillStyle = s.color;
    ctx.fillText(s.label, 6 + 90 * n, canvas.height - 6);
  });
  ctx.fillStyle = "#555";
  ctx.fillText(`${title} (max ${max})`, 6, 12);
}

function draw(canvas, samples) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const max = Math.max(1, ...samples);
  ctx.strokeStyle = "#36c";
  ctx.beginPath();
  samples.forEach((s, i) => {
    const x = canvas.width * i / 119, y = canvas.height - 4 - (canvas.height - 8) * s / max;
    i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#555";
  ctx.fillText(`queued messages (max ${max})`, 6, 12);
}

views.connections = async () => {
  const pager = new Pager("connections", "/api/connections", [
    ["Name", c => c.name], ["Node", c => c.node], ["User name", c => c.user], ["Virtual host", c => c.vhost],
    ["Protocol", c => c.protocol], ["Channels", c => c.channels, {numeric: true}]]);
  return {title: "Connections", content: [pager.root], load: () => pager.load()};
};

views.channels = async () => {
  const pager = new Pager("channels", "/api/channels", [
    ["Channel", c => c.name], ["Node", c => c.node], ["User name", c => c.user], ["State", c => c.state],
    ["Consumers", c => c.consumer_count, {numeric: true}], ["Unacked", c => c.messages_unacknowledged,
      {numeric: true}], ["Prefetch", c => c.prefetch_count, {numeric: true}]]);
  return {title: "Channels", content: [pager.root], load: () => pager.load()};
};

function objectLink(kind, item) {
  const name = item.name === "" ? "(AMQP default)" : item.name;
  return h("a", {href: `#/${kind}/${enc(item.vhost)}/${enc(item.name || "amq.default")}`, text: name});
}

views.exchanges = async () => {
  const pager = new Pager("exchanges", "/api/exchanges", [
    ["Virtual host", e => e.vhost], ["Name", e => objectLink("exchanges", e)], ["Type", e => e.type],
    ["Features", features]]);
  const vhosts = await vhostNames();
  const types = (state.overview || await api("GET", "/api/overview")).exchange_types.map(t => [t.name, t.name]);
  const form = h("form", {id: "exchange-form"}, h("table", {class: "form"},
    field("Virtual host:", select("exchange-vhost", vhosts.map(v => [v, v]), "/")),
    field("Name:", h("input", {id: "exchange-name", required: true})),
    field("Type:", select("exchange-type", types, "direct")),
    field("Durability:", select("exchange-durable", [["true", "Durable"], ["false", "Transient"]], "true")),
    field("Auto delete:", select("exchange-auto-delete", [["false", "No"], ["true", "Yes"]], "false")),
    field("Internal:", select("exchange-internal", [["false", "No"], ["true", "Yes"]], "false")),
    field("Arguments:", h("input", {id: "exchange-arguments", placeholder: "{\"alternate-exchange\": \"ae\"}"})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "exchange-add", type: "submit", text: "Add exchange"})))));
  form.addEventListener("submit", event => {
    event.preventDefault();
    const name = val("exchange-name");
    act(`Exchange ${name} added.`, () => api("PUT", `/api/exchanges/${enc(val("exchange-vhost"))}/${enc(name)}`, {
      type: val("exchange-type"), durable: val("exchange-durable") === "true",
      auto_delete: val("exchange-auto-delete") === "true", internal: val("exchange-internal") === "true",
      arguments: jsonArguments("exchange-arguments")}));
  });
  return {title: "Exchanges", content: [section("All exchanges", pager.root), section("Add a new exchange", form)],
          load: () => pager.load()};
};

views.queues = async () => {
  const pager = new Pager("queues", "/api/queues", [
    ["Virtual host", q => q.vhost], ["Name", q => objectLink("queues", q)], ["Type", q => q.type],
    ["Features", features], ["State", q => q.state], ["Ready", q => q.messages_ready, {numeric: true}],
    ["Unacked", q => q.messages_unacknowledged, {numeric: true}], ["Total", q => q.messages, {numeric: true}],
    ["incoming", q => rate(q.message_stats && q.message_stats.publish_details)]]);
  const vhosts = await vhostNames();
  const form = h("form", {id: "queue-form"}, h("table", {class: "form"},
    field("Virtual host:", select("queue-vhost", vhosts.map(v => [v, v]), "/")),
    field("Name:", h("input", {id: "queue-name", required: true})),
    field("Durability:", select("queue-durable", [["true", "Durable"], ["false", "Transient"]], "true")),
    field("Auto delete:", select("queue-auto-delete", [["false", "No"], ["true", "Yes"]], "false")),
    field("Arguments:", h("input", {id: "queue-arguments", placeholder: "{\"x-message-ttl\": 60000}"})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "queue-add", type: "submit", text: "Add queue"})))));
  form.addEventListener("submit", event => {
    event.preventDefault();
    const name = val("queue-name");
    act(`Queue ${name} added.`, () => api("PUT", `/api/queues/${enc(val("queue-vhost"))}/${enc(name)}`, {
      durable: val("queue-durable") === "true", auto_delete: val("queue-auto-delete") === "true",
      arguments: jsonArguments("queue-arguments")}));
  });
  return {title: "Queues", content: [section("All queues", pager.root), section("Add a new queue", form)],
          load: () => pager.load()};
};

function publishForm(exchangePath, routingKey) {
  const form = h("form", {id: "publish-form"}, h("table", {class: "form"},
    routingKey === null ? field("Routing key:", h("input", {id: "publish-key"})) : null,
    field("Delivery mode:", select("publish-delivery", [["1", "1 - Non-persistent"], ["2", "2 - Persistent"]], "2")),
    field("Payload:", h("textarea", {id: "publish-payload"})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "publish-send", type: "submit", text: "Publish message"})))));
  form.addEventListener("submit", event => {
    event.preventDefault();
    act(null, async () => {
      const answer = await api("POST", `${exchangePath}/publish`, {
        routing_key: routingKey === null ? val("publish-key") : routingKey, payload: val("publish-payload"),
        payload_encoding: "string", properties: {delivery_mode: Number(val("publish-delivery"))}});
      flash(answer.routed ? "Message published." : "Message published, but not routed.", answer.routed);
    });
  });
  return form;
}

function bindingsTable(id, rows, unbind) {
  return table(id, [["From", b => b.source === "" ? "(Default exchange binding)" : b.source],
    ["To", b => b.destination], ["Routing key", b => b.routing_key], ["Arguments", b => JSON.stringify(b.arguments)],
    ["", b => b.source === "" ? "" : h("button", {class: "unbind", text: "Unbind", onclick: unbind(b)})]], rows);
}

function unbindAction(b) {
  const kind = b.destination_type === "queue" ? "q" : "e";
  return confirmThen(`Remove the binding from ${b.source} to ${b.destination} (${b.routing_key})?`, "Binding removed.",
    () => api("DELETE", `/api/bindings/${enc(b.vhost)}/e/${enc(b.source)}/${kind}/${enc(b.destination)}/` +
              enc(b.properties_key)));
}

views.exchange = async (vhost, name) => {
  const path = `/api/exchanges/${enc(vhost)}/${enc(name)}`;
  const details = h("div", {id: "exchange-details"}), bindings = h("div", {id: "exchange-bindings"});
  const bind = h("form", {id: "bind-form"}, h("table", {class: "form"},
    field("To:", select("bind-kind", [["q", "To queue"], ["e", "To exchange"]], "q")),
    field("Name:", h("input", {id: "bind-destination", required: true})),
    field("Routing key:", h("input", {id: "bind-key"})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "bind-add", type: "submit", text: "Bind"})))));
  bind.addEventListener("submit", event => {
    event.preventDefault();
    act("Binding added.", () => api("POST", `/api/bindings/${enc(vhost)}/e/${enc(name)}/${val("bind-kind")}/` +
      enc(val("bind-destination")), {routing_key: val("bind-key"), arguments: {}}));
  });
  const remove = h("button", {id: "exchange-delete", type: "button", text: "Delete this exchange",
    onclick: confirmThen(`Delete the exchange ${name}?`, `Exchange ${name} deleted.`, async () => {
      await api("DELETE", path);
      location.hash = "#/exchanges";
    })});
  async function load() {
    const e = await api("GET", path);
    details.replaceChildren(table("exchange-info", [["Virtual host", x => x.vhost], ["Type", x => x.type],
      ["Features", features], ["Arguments", x => JSON.stringify(x.arguments)]], [e]));
    bindings.replaceChildren(bindingsTable("exchange-bindings-table",
      await api("GET", `${path}/bindings/source`), unbindAction));
  }
  const content = [section("Overview", details), section("Bindings", bindings),
    name === "amq.default" ? null : section("Add binding from this exchange", bind),
    section("Publish message", publishForm(path, null)),
    name === "amq.default" ? null : section("Delete this exchange", remove)];
  return {title: `Exchange: ${name === "amq.default" ? "(AMQP default)" : name}`, content, load};
};

views.queue = async (vhost, name) => {
  const path = `/api/queues/${enc(vhost)}/${enc(name)}`;
  const details = h("div", {id: "queue-details"}), consumers = h("div", {id: "queue-consumers"});
  const bindings = h("div", {id: "queue-bindings"}), results = h("div", {id: "get-results"});
  const bind = h("form", {id: "bind-form"}, h("table", {class: "form"},
    field("From exchange:", h("input", {id: "bind-source", required: true})),
    field("Routing key:", h("input", {id: "bind-key"})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "bind-add", type: "submit", text: "Bind"})))));
  bind.addEventListener("submit", event => {
    event.preventDefault();
    act("Binding added.", () => api("POST", `/api/bindings/${enc(vhost)}/e/${enc(val("bind-source"))}/q/${enc(name)}`,
      {routing_key: val("bind-key"), arguments: {}}));
  });
  const get = h("form", {id: "get-form"}, h("table", {class: "form"},
    field("Ack Mode:", select("get-ackmode", [["ack_requeue_true", "Nack message requeue true"],
      ["ack_requeue_false", "Automatic ack"], ["reject_requeue_true", "Reject requeue true"],
      ["reject_requeue_false", "Reject requeue false"]], "ack_requeue_true")),
    field("Encoding:", select("get-encoding", [["auto", "Automatic string/base64"], ["base64", "base64"]], "auto")),
    field("Messages:", h("input", {id: "get-count", type: "number", value: 1, min: 1})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "get-messages", type: "submit", text: "Get Message(s)"})))));
  get.addEventListener("submit", event => {
    event.preventDefault();
    act(null, async () => {
      const messages = await api("POST", `${path}/get`, {count: Number(val("get-count")), ackmode: val("get-ackmode"),
                                                         encoding: val("get-encoding"), truncate: 50000});
      results.replaceChildren(...(messages.length === 0 ? [h("p", {class: "error", text: "Queue is empty"})] : []),
        ...messages.map((m, i) => h("div", {class: "message"}, h("b", {text: `Message ${i + 1}`}),
          h("p", {text: `The server reported ${m.message_count} messages remaining.`}),
          table(`message-${i + 1}`, [["Exchange", x => x.exchange || "(AMQP default)"], ["Routing Key",
            x => x.routing_key], ["Redelivered", x => x.redelivered ? "●" : "○"], ["Properties",
            x => JSON.stringify(x.properties)], ["Payload", x => `${x.payload_bytes} bytes, Encoding: ${x.payload_encoding}`]],
            [m]), h("pre", {class: "payload", text: m.payload}))));
    });
  });
  const purge = h("button", {id: "queue-purge", type: "button", text: "Purge Messages",
    onclick: confirmThen(`Purge every ready message of the queue ${name}?`, "Queue contents purged.",
                         () => api("DELETE", `${path}/contents`))});
  const remove = h("button", {id: "queue-delete", type: "button", text: "Delete Queue",
    onclick: confirmThen(`Delete the queue ${name} and its messages?`, `Queue ${name} deleted.`, async () => {
      await api("DELETE", path);
      location.hash = "#/queues";
    })});
  const chart = h("canvas", {id: "queue-chart", width: 720, height: 140}), rates = h("div", {id: "queue-rates"});
  const series = [{label: "publish", color: "#36c", stat: "publish", samples: []},
                  {label: "deliver / get", color: "#0a6", stat: "deliver_get", samples: []},
                  {label: "ack", color: "#f60", stat: "ack", samples: []}];
  // raftmq's own: the queue's audit events (GET /api/raftmq/queues/.../events, ops/http/ownpages.py);
  // without a history on this node, how to keep and read one (the CLI).
  const audit = h("div", {id: "queue-audit"});
  const auditButton = h("button", {id: "queue-audit-show", type: "button", text: "Show the latest audit events",
    onclick: async () => {
      try {
        const a = await api("GET", `/api/raftmq/queues/${enc(vhost)}/${enc(name)}/events?limit=100`);
        audit.replaceChildren(h("p", {text: `${a.events.length} event(s) among the history's events back to ` +
                                            `#${a.scanned_to ?? "-"} (history #${a.first_seq}-#${a.last_seq}).`}),
          table("queue-audit-table", [["Seq", e => e.seq, {numeric: true}],
            ["Time", e => new Date(e.time_us / 1000).toLocaleTimeString()], ["Event", e => e.kind],
            ["Message id", e => e.message_id, {numeric: true}], ["Exchange", e => e.exchange],
            ["Routing key", e => e.routing_key], ["Size", e => e.size, {numeric: true}], ["Detail", e => e.detail]],
            a.events));
      } catch (error) {
        audit.replaceChildren(h("p", {id: "queue-audit-hint", text: error.status === 404 ?
          "This node keeps no audit history. Start nodes with audit_retention = \"metadata\" (or the queue " +
          "argument x-audit-retention), then read it here or with: raftmq snapshot --data-dir DIR --out SNAP; " +
          "raftmq audit summary --snapshot SNAP" : error.message}));
      }
    }});
  async function load() {
    const q = await api("GET", path);
    const m = q.message_stats || {};
    rates.replaceChildren(table("queue-rates-table", [["Publish", x => rate(x.publish_details)],
      ["Deliver / get", x => rate(x.deliver_get_details)], ["Acknowledge", x => rate(x.ack_details)],
      ["Published (total)", x => x.publish, {numeric: true}], ["Delivered / got (total)", x => x.deliver_get,
        {numeric: true}], ["Acknowledged (total)", x => x.ack, {numeric: true}]], [m]));
    for (const s of series) {
      s.samples.push((m[`${s.stat}_details`] || {}).rate || 0);
      if (s.samples.length > 120) s.samples.shift();
    }
    drawSeries(chart, series, "messages/s");
    details.replaceChildren(table("queue-info", [["Virtual host", x => x.vhost], ["Features", features],
      ["State", x => x.state], ["Consumers", x => x.consumers, {numeric: true}],
      ["Ready", x => x.messages_ready, {numeric: true}], ["Unacked", x => x.messages_unacknowledged, {numeric: true}],
      ["Total", x => x.messages, {numeric: true}], ["Arguments", x => JSON.stringify(x.arguments)]], [q]));
    consumers.replaceChildren(table("consumers-table", [["Channel", c => c.channel_details.name],
      ["Consumer tag", c => c.consumer_tag], ["Ack required", c => c.ack_required ? "●" : "○"],
      ["Exclusive", c => c.exclusive ? "●" : "○"], ["Prefetch count", c => c.prefetch_count, {numeric: true}]],
      q.consumer_details || []));
    bindings.replaceChildren(bindingsTable("queue-bindings-table", await api("GET", `${path}/bindings`), unbindAction));
  }
  const content = [section("Overview", details), section("Message rates", rates, chart),
    section("Consumers", consumers), section("Bindings", bindings),
    section("Add binding to this queue", bind),
    section("Publish message", h("p", {text: "Message will be published to the default exchange with routing key " +
      `${name}, routing it to this queue.`}), publishForm(`/api/exchanges/${enc(vhost)}/amq.default`, name)),
    section("Get messages", h("p", {text: "Warning: getting messages from a queue is a destructive action."}),
            get, results),
    section("Delete", remove), section("Purge", purge),
    section("Audit events", h("p", {text: "The latest events of this queue in this node's audit history " +
      "(declared, routed, delivered, acked, dead-lettered...)."}), auditButton, audit)];
  return {title: `Queue ${name}`, content, load};
};

// raftmq's own page (RabbitMQ has none): the Raft view of the node the page is served by, from
// GET /api/raftmq/cluster (ops/http/raftview.py; monitoring users).  Lag is the leader's knowledge:
// on a follower that column is empty.  "Reported" columns are each member's own numbers, asked from
// it (ops/http/members.py), with the age of its answer; digests are made on request only (a walk of
// each member's whole state): the button asks GET /api/raftmq/digests.
function bytes(n) {
  if (n === null || n === undefined) return "";
  return n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / (1 << 20)).toFixed(1)} MiB`;
}

views.cluster = async () => {
  const summary = h("div", {id: "raft-summary-box"}), members = h("div", {id: "raft-members-box"});
  const changes = h("div", {id: "leader-changes-box"}), snapshots = h("div", {id: "snapshots-box"});
  const digests = h("div", {id: "digests-box"});
  const compare = h("button", {id: "digests-compare", type: "button", text: "Compare state digests",
    onclick: async () => {
      compare.disabled = true;
      digests.replaceChildren(h("p", {text: "Asking every member for a digest..."}));
      try {
        const d = await api("GET", "/api/raftmq/digests");
        const verdict = d.digests_agree === true ? "Replicas at the same applied index have the same digest." :
          d.digests_agree === false ? "DIFFERENT digests at the same applied index: the replicas diverged." :
          "No two members were at the same applied index: compare again when traffic stops.";
        digests.replaceChildren(h("div", {}, h("p", {id: "digests-verdict", class: d.digests_agree === false ? "error" : "",
                                        text: verdict}),
          d.members_missing.length ? h("p", {class: "error", text: `Not answering: ${d.members_missing.join(", ")}`}) : null,
          table("digests", [["Member", x => x.name], ["Applied index", x => x.applied_index, {numeric: true}],
            ["Digest (model + bodies)", x => x.digest, {cls: () => "digest"}], ["Model", x => (x.model_digest || "").slice(0, 16)],
            ["Bodies", x => (x.bodies_digest || "").slice(0, 16)], ["Age (s)", x => x.age, {numeric: true}]], d.members)));
      } catch (error) {
        digests.replaceChildren(h("p", {class: "error", text: error.message}));
      } finally {
        compare.disabled = false;
      }
    }});
  async function load() {
    const c = await api("GET", "/api/raftmq/cluster");
    const p = c.prevote;
    summary.replaceChildren(table("raft-summary", [["Seen from", x => x.node], ["Leader", x => x.leader || "none",
      {cls: x => x.leader ? "leader" : "down"}], ["Term", x => x.term, {numeric: true}],
      ["Leader changes", x => x.leader_changes, {numeric: true}],
      ["Connected partners", x => x.connected_partners.join(", ")],
      ["Majority lost", x => x.majority_lost, {numeric: true}],
      ["Snapshots damaged", x => x.snapshots_damaged, {numeric: true}],
      ["Pre-vote rounds / won", () => `${p.rounds} / ${p.won}`], ["Pre-votes granted / refused",
        () => `${p.granted} / ${p.refused}`],
      ["Members not answering", x => (x.members_missing || []).join(", ") || "none",
        {cls: x => (x.members_missing || []).length ? "down" : ""}]], [c]));
    const own = n => n.reported || {};
    members.replaceChildren(table("raft-members", [
      ["Name", n => n.name], ["Running", n => n.running ? "yes" : "no", {cls: n => n.running ? "" : "down"}],
      ["Role", n => n.raft.role, {cls: n => n.raft.leader ? "leader" : ""}],
      ["Term", n => n.raft.term, {numeric: true}],
      ["Commit index", n => n.raft.commit_index, {numeric: true}],
      ["Applied index", n => n.raft.applied_index, {numeric: true}],
      ["Lag (entries, leader's view)", n => n.raft.lag, {numeric: true}],
      ["Reported commit index", n => own(n).commit_index, {numeric: true}],
      ["Reported applied index", n => own(n).applied_index, {numeric: true}],
      ["Reported role / term", n => n.reported ? `${own(n).role} / ${own(n).term}` : "no answer"],
      ["Answer age (s)", n => own(n).age, {numeric: true}]], c.members));
    const snaps = c.members.flatMap(n => (own(n).snapshots || []).slice(0, 3).map(s => ({member: n.name, ...s})));
    snapshots.replaceChildren(snaps.length === 0 ? h("p", {text: "No snapshot written or loaded since the members started."}) :
      table("snapshots", [["Member", x => x.member], ["Time", x => new Date(x.time).toLocaleTimeString()],
        ["Raft index", x => x.index, {numeric: true}], ["Size", x => bytes(x.bytes), {numeric: true}],
        ["How", x => x.how]], snaps));
    changes.replaceChildren(c.recent_leader_changes.length === 0 ? h("p", {text: "No leader seen yet."}) :
      table("leader-changes", [["Time", x => new Date(x.time).toLocaleTimeString()], ["Term", x => x.term,
        {numeric: true}], ["Leader", x => x.leader], ["Previous leader", x => x.previous || "(first seen)"]],
        c.recent_leader_changes));
  }
  return {title: "Cluster", content: [section("Raft", summary), section("Members", members),
    section("Last snapshots (up to 3 per member, newest first)", snapshots),
    section("Replicas' state digests", h("p", {text: "Each member hashes its whole state (queues, messages, " +
      "bodies) when asked; replicas at the same applied index must agree."}), compare, digests),
    section("Last leader changes (newest first)", changes)], load};
};

// raftmq's own: sessions a client can resume on any node (AMQP 0-10 sessions, AMQP 1.0 durable links),
// from GET /api/raftmq/sessions (ops/http/ownpages.py): a user sees its own, monitoring users all.
views.sessions = async () => {
  const when = ms => ms === null || ms === undefined ? "" : new Date(ms).toLocaleTimeString();
  const pager = new Pager("sessions", "/api/raftmq/sessions", [
    ["Kind", x => x.kind], ["Name", x => x.name], ["Virtual host", x => x.vhost], ["User", x => x.user],
    ["State", x => x.state, {cls: x => x.state === "detached" ? "down" : ""}],
    ["Detached at", x => when(x.detached_at)], ["Resumable until", x => x.state === "detached" ? when(x.expires_at) : ""],
    ["Timeout (s)", x => x.timeout, {numeric: true}], ["Unsettled (replayed on resume)", x => x.unsettled,
      {numeric: true}], ["Subscriptions", x => x.subscriptions, {numeric: true}]]);
  return {title: "Resumable sessions and links", content: [h("p", {text: "AMQP 0-10 sessions and AMQP 1.0 " +
    "durable links are replicated: a client resumes them on any node, within their timeout once detached."}),
    pager.root], load: () => pager.load()};
};

// raftmq's own: delayed and deduplicated messages (GET /api/raftmq/held).
views.held = async () => {
  const box = h("div", {id: "held-box"});
  async function load() {
    const d = await api("GET", "/api/raftmq/held");
    box.replaceChildren(
      table("held-totals", [["Delayed now", x => x.messages_delayed, {numeric: true}],
        ["Delayed (since start)", x => x.delayed, {numeric: true}], ["Released when due", x => x.delay_released,
          {numeric: true}], ["Delays refused", x => x.delay_refused, {numeric: true}],
        ["Deduplicated (dropped)", x => x.deduplicated, {numeric: true}]], [d]),
      h("h4", {text: "Plugin exchanges"}),
      table("held-exchanges", [["Virtual host", e => e.vhost], ["Exchange", e => objectLink("exchanges", e)],
        ["Type", e => e.type], ["Delayed messages", e => e.messages_delayed, {numeric: true}],
        ["Cache entries", e => e.cache_info && e.cache_info.entries, {numeric: true}],
        ["Cache size", e => e.cache_info && e.cache_info.size, {numeric: true}]], d.exchanges),
      h("h4", {text: "Queues with a deduplication cache"}),
      table("held-queues", [["Virtual host", q => q.vhost], ["Queue", q => objectLink("queues", q)],
        ["Cache entries", q => q.cache_entries, {numeric: true}]], d.queues));
  }
  return {title: "Delayed and deduplicated messages", content: [box], load};
};

views.admin = async () => {
  const users = new Pager("users", "/api/users", [["Name", u => u.name], ["Tags", u => u.tags.join(", ")],
    ["Has password", u => u.password_hash || u.source === "config" ? "●" : "○"]]);
  const permissions = h("div", {id: "permissions-box"}), vhostsBox = h("div", {id: "vhosts-box"});
  const vhosts = await vhostNames();
  const tagHelp = h("span", {class: "tag-help"}, ["Admin", "Monitoring", "Policymaker", "Management", "None"].map(
    label => h("a", {id: `tag-${label.toLowerCase()}`, onclick: () => {
      document.getElementById("user-tags-new").value = label === "None" ? "" :
        label === "Admin" ? "administrator" : label.toLowerCase();
    }, text: `[${label}]`})));
  const addUser = h("form", {id: "user-form"}, h("table", {class: "form"},
    field("Username:", h("input", {id: "user-name-new", required: true, autocomplete: "off"})),
    field("Password:", h("input", {id: "user-password", type: "password", autocomplete: "new-password"})),
    field("Tags:", h("input", {id: "user-tags-new"})), h("tr", {}, h("th"), h("td", {}, tagHelp)),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "user-add", type: "submit", text: "Add user"})))));
  addUser.addEventListener("submit", event => {
    event.preventDefault();
    const name = val("user-name-new");
    act(`User ${name} added.`, () => api("PUT", `/api/users/${enc(name)}`,
                                         {password: val("user-password"), tags: val("user-tags-new")}));
  });
  const setPermission = h("form", {id: "permission-form"}, h("table", {class: "form"},
    field("User:", h("input", {id: "perm-user", required: true})),
    field("Virtual Host:", select("perm-vhost", vhosts.map(v => [v, v]), "/")),
    field("Configure regexp:", h("input", {id: "perm-configure", value: ".*"})),
    field("Write regexp:", h("input", {id: "perm-write", value: ".*"})),
    field("Read regexp:", h("input", {id: "perm-read", value: ".*"})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "perm-set", type: "submit", text: "Set permission"})))));
  setPermission.addEventListener("submit", event => {
    event.preventDefault();
    act("Permission set.", () => api("PUT", `/api/permissions/${enc(val("perm-vhost"))}/${enc(val("perm-user"))}`,
      {configure: val("perm-configure"), write: val("perm-write"), read: val("perm-read")}));
  });
  const addVhost = h("form", {id: "vhost-form"}, h("table", {class: "form"},
    field("Name:", h("input", {id: "vhost-name", required: true})),
    h("tr", {}, h("th"), h("td", {}, h("button", {id: "vhost-add", type: "submit", text: "Add virtual host"})))));
  addVhost.addEventListener("submit", event => {
    event.preventDefault();
    act(`Virtual host ${val("vhost-name")} added.`, () => api("PUT", `/api/vhosts/${enc(val("vhost-name"))}`));
  });
  async function load() {
    await users.load();
    permissions.replaceChildren(table("permissions-table", [["User", p => p.user], ["Virtual host", p => p.vhost],
      ["Configure regexp", p => p.configure], ["Write regexp", p => p.write], ["Read regexp", p => p.read],
      ["", p => h("button", {class: "clear-permission", text: "Clear", onclick: confirmThen(
        `Clear ${p.user}'s permissions on ${p.vhost}?`, "Permission cleared.",
        () => api("DELETE", `/api/permissions/${enc(p.vhost)}/${enc(p.user)}`))})]],
      await api("GET", "/api/permissions")));
    vhostsBox.replaceChildren(table("vhosts-table", [["Name", v => v.name], ["Ready", v => v.messages_ready,
      {numeric: true}], ["Unacked", v => v.messages_unacknowledged, {numeric: true}], ["Total", v => v.messages,
      {numeric: true}]], await api("GET", "/api/vhosts")));
  }
  return {title: "Admin", content: [section("Users", users.root), section("Add a user", addUser),
    section("Permissions", permissions), section("Set permission", setPermission),
    section("Virtual Hosts", vhostsBox), section("Add a new virtual host", addVhost)], load};
};

// ------------------------------------------------------------------ routing, login, refresh

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "queues" && parts.length === 3) return ["queues", views.queue, parts.slice(1)];
  if (parts[0] === "exchanges" && parts.length === 3) return ["exchanges", views.exchange, parts.slice(1)];
  if (parts[0] === "users" && may("administrator")) return ["admin", views.admin, []];
  if (parts[0] === "cluster" && may("monitoring")) return ["cluster", views.cluster, []];
  if (parts[0] === "sessions") return ["sessions", views.sessions, []];
  if (parts[0] === "held") return ["held", views.held, []];
  const tab = {connections: "connections", channels: "channels", exchanges: "exchanges", queues: "queues"}[parts[0]];
  return tab ? [tab, views[tab], []] : ["overview", views.overview, []];
}

async function show() {
  if (!state.user) return;
  const [tab, view, args] = route();
  for (const link of document.querySelectorAll("#tabs a")) link.classList.toggle("selected", link.id === `tab-${tab}`);
  const main = document.getElementById("main");
  try {
    const built = await view(...args);
    state.view = built;
    main.replaceChildren(h("h2", {id: "view-title", text: built.title}), ...built.content.filter(Boolean));
    await refresh();
  } catch (error) {
    state.view = null;
    main.replaceChildren(h("p", {class: "error", id: "view-error", text: error.message}));
  }
}

async function refresh() {
  if (!state.view) return;
  try {
    await state.view.load();
    document.getElementById("status").textContent = `Refreshed ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("status").textContent = `Not refreshed: ${error.message}`;
  }
}

function signedIn(me) {
  Object.assign(state, {user: me.name, csrf: me.csrf_token, grants: me.grants || []});
  document.getElementById("login").hidden = true;
  document.getElementById("app").hidden = false;
  document.getElementById("user-name").textContent = me.name;
  document.getElementById("user-tags").textContent = me.tags.length ? `(${me.tags.join(", ")})` : "";
  document.getElementById("tab-admin").hidden = !may("administrator");
  document.getElementById("tab-cluster").hidden = !may("monitoring");
  clearInterval(state.timer);
  state.timer = setInterval(refresh, REFRESH_MS);
  api("GET", "/api/overview").then(o => {
    state.overview = o;
    document.getElementById("node").textContent = `— ${o.node}`;
  }).catch(() => {});
  show();
}

function showLogin(message) {
  clearInterval(state.timer);
  Object.assign(state, {user: null, csrf: "", grants: [], view: null});
  document.getElementById("app").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

async function login(event) {
  event.preventDefault();
  const username = val("login-username"), password = val("login-password");
  try {
    const me = await api("POST", "/api/login", {username, password});
    document.getElementById("login-password").value = "";
    flash("");
    signedIn(me);
  } catch (error) {
    showLogin(error.status === 401 ? "Login failed" : error.message);
  }
}

async function logout() {
  try { await api("POST", "/api/logout"); } catch (error) { /* the session may be gone already */ }
  showLogin("");
}

async function start() {
  document.getElementById("login-form").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", logout);
  window.addEventListener("hashchange", show);
  try {
    signedIn(await api("GET", "/api/whoami"));
  } catch (error) {
    showLogin("");
  }
}

start();
