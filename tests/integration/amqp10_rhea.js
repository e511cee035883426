// AMQP 1.0 scenarios with rhea (Node), driven by test_amqp10_rhea.py.
// Usage: node amqp10_rhea.js PORT QUEUE DLQ KEPT ; prints one JSON object with what each step saw.
// Every step is bounded: the whole script exits with code 2 after 20 s.
'use strict';
const rhea = require('rhea');

const [port, queue, dlq, kept] = [Number(process.argv[2]), process.argv[3], process.argv[4], process.argv[5]];
const out = {};
setTimeout(() => { out.timeout = true; console.log(JSON.stringify(out)); process.exit(2); }, 20000);

const container = rhea.create_container({ id: 'rhea-test' });
const conn = container.connect({ host: '127.0.0.1', port, username: 'guest', password: 'guest',
                                 reconnect: false });

function once(emitter, event) { return new Promise((resolve) => emitter.once(event, resolve)); }
function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

async function main() {
  await once(conn, 'connection_open');
  // 1. send 6 messages unsettled: each accepted (2.6.12)
  const sender = conn.open_sender(`/queues/${queue}`);
  await once(sender, 'sendable');
  let accepted = 0;
  sender.on('accepted', () => { accepted += 1; });
  for (let i = 0; i < 6; i++) sender.send({ body: `m${i}`, application_properties: { i } });
  while (accepted < 6) await sleep(10);
  out.accepted = accepted;

  // 2. credit: exactly 2 with credit 2, then drain gets the rest and ends with credit 0 (2.6.7)
  const receiver = conn.open_receiver({ source: `/queues/${queue}`, credit_window: 0, autoaccept: false });
  await once(receiver, 'receiver_open');
  const got = [];
  const deliveries = [];
  receiver.on('message', (ctx) => { got.push(ctx.message.body); deliveries.push(ctx.delivery); });
  receiver.add_credit(2);
  await sleep(400);
  out.with_credit_2 = got.length;
  receiver.drain_credit = receiver.drain_credit || (() => { receiver.drain = true; receiver.flow(); });
  receiver.drain = true;
  receiver.add_credit(10);
  await once(receiver, 'receiver_drained');
  out.after_drain = got.length;
  out.credit_after_drain = receiver.credit;
  out.bodies = got.slice();
  for (const d of deliveries) d.accept();
  receiver.drain = false;

  // 3. outcomes on one message: released (not counted), modified delivery-failed (counted), rejected (dead-lettered)
  sender.send({ body: 'outcome' });
  const counts = [];
  const r2 = conn.open_receiver({ source: `/queues/${queue}`, credit_window: 0, autoaccept: false });
  await once(r2, 'receiver_open');
  for (const action of ['release', 'modified', 'reject']) {
    r2.add_credit(1);
    const ctx = await once(r2, 'message');
    counts.push(ctx.message.delivery_count || 0);
    if (action === 'release') ctx.delivery.release();
    else if (action === 'modified') ctx.delivery.modified({ delivery_failed: true });
    else ctx.delivery.reject({ condition: 'test:rejected', description: 'by the test' });
  }
  out.delivery_counts = counts;

  // 4. a message larger than max-frame-size (multi-frame transfer both ways)
  const big = Buffer.alloc(300000, 7);
  sender.send({ body: rhea.message.data_section(big) });
  r2.add_credit(1);
  const bigCtx = await once(r2, 'message');
  out.big_length = bigCtx.message.body.content ? bigCtx.message.body.content.length : bigCtx.message.body.length;
  bigCtx.delivery.accept();

  // 5. request/reply through a dynamic receiver and an anonymous (null target) sender
  const replies = conn.open_receiver({ source: { dynamic: true } });
  const opened = await once(replies, 'receiver_open');
  const replyTo = opened.receiver.source.address;
  out.reply_to_prefix = replyTo.slice(0, 8);
  const anonymous = conn.open_sender({ target: {} });
  await once(anonymous, 'sendable');
  anonymous.send({ to: replyTo, body: 'pong', correlation_id: 'c9' });
  const reply = await once(replies, 'message');
  out.reply = [reply.message.body, reply.message.correlation_id];

  // 6. what 0-9-1 cannot carry, 1.0 -> 1.0 (stored as sent, format AMQP100): typed application-properties,
  //    absolute-expiry-time, group-sequence, reply-to-group-id, subject.  Two copies: one read back here,
  //    one left in KEPT for the Python side to read with proton (which sees the types).
  const typed = () => ({ body: 'typed', subject: 'subj', group_id: 'g', group_sequence: 7, reply_to_group_id: 'rg',
    absolute_expiry_time: new Date(1900000000123), message_annotations: { 'x-opt-a': 'b' },
    application_properties: { u8: rhea.types.wrap_ubyte(200), ts: rhea.types.wrap_timestamp(1600000000321),
                              sym: rhea.types.wrap_symbol('s'), plain: 'v' } });
  const keptSender = conn.open_sender(`/queues/${kept}`);
  await once(keptSender, 'sendable');
  let keptAccepted = 0;
  keptSender.on('accepted', () => { keptAccepted += 1; });
  keptSender.send(typed());
  keptSender.send(typed());
  while (keptAccepted < 2) await sleep(10);
  const r3 = conn.open_receiver({ source: `/queues/${kept}`, credit_window: 0 });
  await once(r3, 'receiver_open');
  r3.add_credit(1);
  const t = (await once(r3, 'message')).message;
  out.typed = { subject: t.subject, group_sequence: t.group_sequence, reply_to_group_id: t.reply_to_group_id,
    absolute_expiry_time: t.absolute_expiry_time && t.absolute_expiry_time.getTime(),
    annotation: t.message_annotations && t.message_annotations['x-opt-a'],
    u8: t.application_properties.u8, ts: t.application_properties.ts && Number(t.application_properties.ts),
    sym: t.application_properties.sym, plain: t.application_properties.plain };
  r3.close();

  conn.close();
  await once(conn, 'connection_close');
  console.log(JSON.stringify(out));
  process.exit(0);
}

main().catch((err) => { out.error = String(err && err.stack || err); console.log(JSON.stringify(out)); process.exit(1); });
conn.on('connection_error', (ctx) => { out.connection_error = String(ctx.connection.error && ctx.connection.error.description); });
conn.on('disconnected', (ctx) => { if (!out.reply) out.disconnected = String(ctx.error || ''); });
