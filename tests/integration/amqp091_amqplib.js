// AMQP 0-9-1 scenarios with amqplib (Node), driven by test_compat091_issue32.py.
// Usage: node amqp091_amqplib.js PORT QUEUE ; prints one JSON object with what each step saw.
// Every step is bounded: the whole script exits with code 2 after 20 s (amqplib's callback API
// never hears of a connection closed in answer to update-secret, so a refusal would hang it).
'use strict';
const amqp = require('amqplib');
const amqpcb = require('amqplib/callback_api');

const [port, queue] = [Number(process.argv[2]), process.argv[3]];
const url = `amqp://guest:guest@127.0.0.1:${port}`;
const out = {};
setTimeout(() => { out.timeout = true; console.log(JSON.stringify(out)); process.exit(2); }, 20000);

function callbackUpdateSecret() {
  // amqplib's callback API: updateSecret(secret, reason, cb) and the 'update-secret-ok' event.
  return new Promise((resolve, reject) => {
    amqpcb.connect(url, (err, conn) => {
      if (err) return reject(err);
      let event = false;
      conn.on('update-secret-ok', () => { event = true; });
      conn.updateSecret(Buffer.from('a made-up token'), 'token refresh', (err2) => {
        if (err2) return reject(err2);
        conn.createChannel((err3, ch) => {
          if (err3) return reject(err3);
          ch.checkQueue(queue, (err4, ok) => {
            if (err4) return reject(err4);
            out.callback = { event, queue: ok.queue };
            conn.close(() => resolve());
          });
        });
      });
    });
  });
}

async function main() {
  await callbackUpdateSecret();

  // The promise API: update-secret, then the connection goes on.
  const conn = await amqp.connect(url);
  let closed = null;
  conn.on('close', (err) => { closed = err ? String(err) : 'closed'; });
  await conn.updateSecret(Buffer.from('another made-up token'), 'token refresh');
  const ch = await conn.createChannel();
  let channelClosed = false;
  ch.on('close', () => { channelClosed = true; });
  ch.on('error', () => {});  // the 404 below is a channel error: seen through bindQueue's rejection

  // Unbind of a missing exchange and of a missing queue: unbind-ok, the channel stays open.
  await ch.unbindQueue(queue, `missing-x-${queue}`, 'k');
  await ch.unbindQueue(`missing-q-${queue}`, 'amq.direct', 'k');
  await ch.unbindExchange(`missing-d-${queue}`, 'amq.direct', 'k');
  ch.sendToQueue(queue, Buffer.from('after unbind'));
  let got = false;
  for (let i = 0; i < 50 && !got; i++) {
    got = await ch.get(queue, { noAck: true });
    if (!got) await new Promise((r) => setTimeout(r, 100));
  }
  out.promise = { body: got ? got.content.toString() : null, channelClosed };

  // Bind of a missing exchange: 404, the channel closed.
  try {
    await ch.bindQueue(queue, `missing-x-${queue}`, 'k');
    out.bind = 'ok';
  } catch (e) {
    out.bind = e.code;
  }
  out.closedEarly = closed;  // null: nothing closed the connection before we did
  await conn.close();
  console.log(JSON.stringify(out));
  process.exit(0);
}

main().catch((e) => { out.error = String(e); console.log(JSON.stringify(out)); process.exit(1); });
