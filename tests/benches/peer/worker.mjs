// The peer of `deploy/local/stack bench peer`: what a team would build instead of Tidings, a
// Postgres job queue (graphile-worker) whose workers send each job as a Web Push with node's
// `web-push`, used as their documentation shows. Dedup is the queue's `job_key`, given by the
// enqueuer. `node worker.mjs migrate` installs the queue's schema and exits; `node worker.mjs`
// runs one worker process and prints "ready" once it takes jobs.
//
// Tuned by the environment (benchmarks.md has the values the comparison uses):
// PEER_CONCURRENCY (jobs in flight per process), PEER_POLL_MS, PEER_LOCAL_QUEUE (jobs fetched
// and locked a query; -1: one at a time), PEER_COMPLETE_BATCH_MS (completions batched; -1: none).
// The enqueuer also sets NO_LOG_SUCCESS, graphile-worker's switch for its line per finished job.
import { run, runMigrations } from "graphile-worker";
import webpush from "web-push";

const connectionString = process.env.DATABASE_URL;
const number = (name, fallback) => Number(process.env[name] ?? fallback);

if (process.argv[2] === "migrate") {
  await runMigrations({ connectionString });
  process.exit(0);
}

const vapid = webpush.generateVAPIDKeys();
webpush.setVapidDetails("mailto:bench@tidings.invalid", vapid.publicKey, vapid.privateKey);

// A job: {s: PushSubscription JSON, b: the payload, t: Topic}.
const push = async (job) => {
  await webpush.sendNotification(job.s, job.b, {
    TTL: 3600,
    urgency: "normal",
    topic: job.t,
    timeout: 10000,
  });
};

const concurrency = number("PEER_CONCURRENCY", 64);
const localQueue = number("PEER_LOCAL_QUEUE", 128);
const runner = await run({
  connectionString,
  concurrency,
  maxPoolSize: concurrency + 2,
  pollInterval: number("PEER_POLL_MS", 2000),
  noHandleSignals: false,
  crontab: "",
  taskList: { push },
  preset: {
    worker: {
      localQueue: { size: localQueue },
      completeJobBatchDelay: number("PEER_COMPLETE_BATCH_MS", 10),
    },
  },
});
console.log("ready");
await runner.promise;
