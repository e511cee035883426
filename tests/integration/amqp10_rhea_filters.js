// Source filters with rhea receivers (AMQP 1.0 3.5.3, issue 37), driven by test_amqp10_filters_rhea.py.
// Usage: node amqp10_rhea_filters.js PORT QUEUE ; prints one JSON object with what each receiver saw.
// Every step is bounded: the whole script exits with code 2 after 20 s.
'use strict';
const rhea = require('rhea');

const [port, queue] = [Number(process.argv[2]), process.argv[3]];
const out = {};
setTimeout(() => { out.timeout = true; console.log(JSON.stringify(out)); process.exit(2); }, 20000);

const container = rhea.create_container({ id: 'rhea-filters' });
const conn = container.connect({ host: '127.0.0.1', port, username: 'guest', password: 'guest', reconnect: false });

function once(emitter, event) { return new Promise((resolve) => emitter.once(event, resolve)); }
function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

async function receiver(name, filter) {
  const r = conn.open_receiver({ source: { address: `/queues/${queue}`, filter }, credit_window: 20 });
  await once(r, 'receiver_open');
  out[name] = { bodies: [], echoed: Object.keys((r.remote.attach.source || {}).filter || {}) };
  r.on('message', (ctx) => { out[name].bodies.push(ctx.message.body); });
  return r;
}

async function main() {
  await once(conn, 'connection_open');
  const red = await receiver('red', rhea.filter.selector("colour = 'red'"));
  const others = await receiver('others', rhea.filter.selector("colour <> 'red'"));
  const sender = conn.open_sender(`/queues/${queue}`);
  await once(sender, 'sendable');
  let accepted = 0;
  sender.on('accepted', () => { accepted += 1; });
  const messages = [['panda', 'red'], ['grasshopper', 'green'], ['squirrel', 'red'], ['whale', 'blue'],
                    ['stone', null]];
  for (const [body, colour] of messages) {
    sender.send({ body, application_properties: colour ? { colour } : { weight: 1 } });
  }
  while (accepted < messages.length) await sleep(10);
  await sleep(700);
  red.close();
  others.close();
  // A bad selector: the attach is refused (detach with an error).
  const bad = conn.open_receiver({ source: { address: `/queues/${queue}`, filter: rhea.filter.selector('colour =') } });
  const error = await new Promise((resolve) => {
    bad.once('receiver_error', (ctx) => resolve(ctx.receiver.error));
    bad.once('receiver_close', (ctx) => resolve(ctx.receiver.error));
  });
  out.bad = error ? String(error.condition) : null;
  // The message neither selector matches is still there for an unfiltered receiver.
  await receiver('rest', undefined);
  await sleep(700);
  console.log(JSON.stringify(out));
  conn.close();
  process.exit(0);
}

main().catch((err) => { out.error = String(err && err.stack || err); console.log(JSON.stringify(out)); process.exit(1); });
