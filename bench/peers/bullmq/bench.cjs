// BullMQ's own stalled-job recovery, driven step by step by bench/peers/run.py.
//
//   node bench.cjs seed N      jobs added with Queue.addBulk, then taken the way
//                              Worker.moveToActive takes them (RPOPLPUSH wait ->
//                              active, processedOn, ats += 1), with no lock left:
//                              their worker died and the lock's PX ran out.
//   node bench.cjs recover     the Worker's stalled check, as its timer runs it:
//                              pass 1 marks every active job in the `stalled`
//                              set, then (the stalledInterval having passed:
//                              the stalled-check key is deleted instead of
//                              waiting 30 s) pass 2 moves the marked, unlocked
//                              jobs back to wait. Starts when a line arrives
//                              on stdin (after printing "ready"); prints JSON.
//   node bench.cjs verify N    every job left active, is in wait, and carries
//                              stc = 1; prints JSON.
//
// Redis port in BENCH_REDIS_PORT. The queue is "bench".
'use strict';

const { Queue, Worker } = require('bullmq');
const IORedis = require('ioredis');

const port = Number(process.env.BENCH_REDIS_PORT);
const QUEUE = 'bench';
const CHUNK = 5000;

function connection() {
  return new IORedis({ host: '127.0.0.1', port, maxRetriesPerRequest: null, enableOfflineQueue: true });
}

async function seed(n) {
  const conn = connection();
  const queue = new Queue(QUEUE, { connection: conn });
  await queue.waitUntilReady();
  const keys = queue.keys;
  for (let start = 0; start < n; start += CHUNK) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + CHUNK); i++) {
      jobs.push({ name: 'send-email', data: { to: 'user@example.com', template: 'welcome', i } });
    }
    await queue.addBulk(jobs);
  }
  const processedOn = Date.now();
  for (let start = 0; start < n; start += CHUNK) {
    const pipeline = conn.pipeline();
    for (let i = start; i < Math.min(n, start + CHUNK); i++) pipeline.rpoplpush(keys.wait, keys.active);
    const moved = await pipeline.exec();
    const rows = conn.pipeline();
    for (const [err, jobId] of moved) {
      if (err || !jobId) throw new Error(`seed: wait ran dry (${err})`);
      rows.hset(queue.toKey(jobId), 'processedOn', processedOn);
      rows.hincrby(queue.toKey(jobId), 'ats', 1);
    }
    await rows.exec();
  }
  const active = await conn.llen(keys.active);
  await queue.close();
  await conn.quit();
  if (active !== n) throw new Error(`seed: ${active} active, expected ${n}`);
  console.log(JSON.stringify({ seeded: n, active }));
}

async function recover() {
  const conn = connection();
  const worker = new Worker(QUEUE, async () => {}, {
    connection: conn, autorun: false, maxStalledCount: 1, stalledInterval: 30000,
  });
  await worker.waitUntilReady();
  const keys = worker.keys;
  const client = connection();
  const passes = [];
  await client.ping();
  // run.py starts its PING client on "ready", then says go.
  process.stdout.write('ready\n');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  process.stdin.pause();
  const started = performance.now();
  for (const pass of ['mark', 'recover']) {
    if (pass === 'recover') await client.del(keys['stalled-check']);
    const t0 = performance.now();
    let recovered = 0;
    const onStalled = () => { recovered += 1; };
    worker.on('stalled', onStalled);
    await worker.moveStalledJobsToWait();
    worker.off('stalled', onStalled);
    passes.push({ pass, seconds: (performance.now() - t0) / 1000, recovered });
  }
  const seconds = (performance.now() - started) / 1000;
  await worker.close();
  await client.quit();
  await conn.quit().catch(() => {});
  console.log(JSON.stringify({ passes, seconds }));
}

async function verify(n) {
  const conn = connection();
  const queue = new Queue(QUEUE, { connection: conn });
  const keys = queue.keys;
  const [active, wait] = await Promise.all([conn.llen(keys.active), conn.llen(keys.wait)]);
  const ids = await conn.lrange(keys.wait, 0, -1);
  let marked = 0;
  for (let start = 0; start < ids.length; start += CHUNK) {
    const pipeline = conn.pipeline();
    for (const id of ids.slice(start, start + CHUNK)) pipeline.hget(queue.toKey(id), 'stc');
    for (const [err, stc] of await pipeline.exec()) if (!err && stc === '1') marked += 1;
  }
  const unique = new Set(ids).size;
  await queue.close();
  await conn.quit();
  const ok = active === 0 && wait === n && unique === n && marked === n;
  console.log(JSON.stringify({ ok, active, wait, unique, marked }));
  if (!ok) process.exitCode = 1;
}

const [mode, arg] = process.argv.slice(2);
const run = { seed: () => seed(Number(arg)), recover, verify: () => verify(Number(arg)) }[mode];
if (!run) {
  console.error('usage: node bench.cjs seed N | recover | verify N');
  process.exit(2);
}
run().catch((err) => { console.error(err); process.exit(1); });
