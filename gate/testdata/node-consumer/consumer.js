// A consumer that is not Go: it reads the gate's output queue with
// amqplib and manual acks, and writes each message ID it receives to
// stdout, one per line, before acking it (at least once: a line is never
// missing for an acked message). It knows nothing of idemq.
//
//   AMQP_URL=amqp://... QUEUE=name [PREFETCH=50] [IDLE_MS=120000] node consumer.js
//
// It prints "ready" on stderr once it consumes, and stops (closing its
// channel and connection, so every ack reaches the broker, and exiting 0)
// on SIGTERM or SIGINT, when stdin closes (its parent died), or after
// IDLE_MS without a message. Any AMQP error exits 1.
'use strict';

const amqp = require('amqplib');

const url = process.env.AMQP_URL;
const queue = process.env.QUEUE;
const prefetch = Number(process.env.PREFETCH || 50);
const idleMs = Number(process.env.IDLE_MS || 120000);

function fail(err) {
  process.stderr.write(`consumer: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
}

async function main() {
  if (!url || !queue) fail('AMQP_URL and QUEUE are required');
  const conn = await amqp.connect(url);
  let stopping = false;
  conn.on('error', (err) => { if (!stopping) fail(err); });
  conn.on('close', () => { if (!stopping) fail('connection closed'); });
  const ch = await conn.createChannel();
  ch.on('error', (err) => { if (!stopping) fail(err); });
  await ch.prefetch(prefetch);

  let idle;
  const stop = async (why) => {
    if (stopping) return;
    stopping = true;
    clearTimeout(idle);
    process.stderr.write(`consumer: stopping (${why})\n`);
    try {
      await ch.close();
      await conn.close();
    } catch (err) {
      process.stderr.write(`consumer: close: ${err}\n`);
    }
    // Exit only once stdout has been flushed to the pipe.
    process.stdout.write('', () => process.exit(0));
  };
  const touch = () => {
    clearTimeout(idle);
    idle = setTimeout(() => stop(`idle ${idleMs} ms`), idleMs);
  };

  await ch.consume(queue, (msg) => {
    if (msg === null) { // cancelled by the broker (queue deleted)
      stop('consumer cancelled');
      return;
    }
    touch();
    process.stdout.write(`${msg.properties.messageId}\n`);
    ch.ack(msg);
  }, { noAck: false });
  touch();

  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  process.stdin.on('end', () => stop('stdin closed'));
  process.stdin.on('error', () => stop('stdin closed'));
  process.stdin.resume();
  process.stderr.write('ready\n');
}

main().catch(fail);
