// The browser half of Tidings in headless Chromium, against the real services that
// tests/tests/browser.rs starts (api with its demo page, detector, dispatcher, pusher, a fake
// catalog). Only the push service is stood in for (fake-push.js and the relay below); the
// pusher's message is decrypted in the page (decrypt.js) and handed to the service worker
// with the DevTools protocol, as a push service's delivery would be.
//
// Environment: TIDINGS_API (the api's origin), TIDINGS_CATALOG_ADMIN, TIDINGS_CHROMIUM,
// TIDINGS_PLAYWRIGHT (playwright-core's folder), TIDINGS_TLS_CERT/KEY (the relay's),
// TIDINGS_CORS_ALLOWED (an origin the api lets in). Prints one JSON report as its last line;
// exits non-zero on the first failed check.

const assert = require('node:assert/strict');
const http = require('node:http');
const https = require('node:https');
const fs = require('node:fs');
const { installFakePush } = require('./fake-push.js');
const { decryptPush } = require('./decrypt.js');
const { randomUUID } = require('node:crypto');

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (tests/tests/browser.rs sets it)`);
  return v;
};
const API = env('TIDINGS_API');
const CATALOG = env('TIDINGS_CATALOG_ADMIN');
const ALLOWED = env('TIDINGS_CORS_ALLOWED');
const { chromium } = require(env('TIDINGS_PLAYWRIGHT'));

const log = (...a) => console.error('browser-test:', ...a);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function eventually(what, fn, seconds = 30) {
  const until = Date.now() + seconds * 1000;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > until) throw new Error(`${what}: not within ${seconds} s${last ? ` (${last.message})` : ''}`);
    await sleep(100);
  }
}

/** Watches `code` for a price below `amount` with the demo page's form. */
async function watchBelow(page, code, amount) {
  await page.fill('input[name=code]', code);
  await page.selectOption('select[name=kind]', 'price_below');
  await page.fill('input[name=amount]', amount);
  await page.click('#watch-form button[type=submit]');
  await page.waitForSelector(`#watch-list li:has-text("${code}")`);
}

async function setItem(code, item) {
  const r = await fetch(`${CATALOG}/${code}`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ currency: 'EUR', in_stock: true, ...item }),
  });
  assert.equal(r.status, 204, `catalog PUT ${code}`);
}

function listen(server, port) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server));
  });
}

/** The push service's side: takes the pusher's POSTs and keeps each body by endpoint. */
function startRelay() {
  const received = new Map();
  const server = https.createServer(
    { cert: fs.readFileSync(env('TIDINGS_TLS_CERT')), key: fs.readFileSync(env('TIDINGS_TLS_KEY')) },
    (req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        const path = req.url;
        if (req.method !== 'POST' || !path.startsWith('/push/')) {
          res.writeHead(404).end();
          return;
        }
        const list = received.get(path) || [];
        list.push({ body: Buffer.concat(chunks), headers: req.headers });
        received.set(path, list);
        res.writeHead(201, { location: `/messages/${list.length}` }).end();
      });
    },
  );
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      resolve({ server, origin: `https://127.0.0.1:${server.address().port}`, received });
    });
  });
}

async function main() {
  const relay = await startRelay();
  const browser = await chromium.launch({
    executablePath: env('TIDINGS_CHROMIUM'),
    // Chromium's own background traffic is refused by a closed network; it only slows a test.
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  const report = {};
  try {
    const context = await browser.newContext();
    await context.grantPermissions(['notifications'], { origin: API });
    await context.addInitScript(installFakePush, { relay: relay.origin, where: 'page' });
    const page = await context.newPage();
    page.on('pageerror', (e) => log('page error:', e.message));
    page.on('console', (m) => m.type() === 'error' && log('page console:', m.text()));

    // The demo page, served by the api: allow notifications.
    await page.goto(`${API}/web/`);
    await page.click('#enable');
    await page.waitForSelector('#status:has-text("Notifications are on")', { timeout: 20000 });
    const subscriptionOf = () => page.evaluate(() => JSON.parse(localStorage.getItem('tidings-test-subscription')));
    const stored = () =>
      page.evaluate(async () => {
        const { openStore } = await import(new URL('tidings.js', location.href).href);
        const db = await openStore();
        return new Promise((resolve, reject) => {
          const all = db.transaction('devices').objectStore('devices').getAll();
          all.onsuccess = () => resolve(all.result);
          all.onerror = () => reject(all.error);
        });
      });
    const first = await subscriptionOf();
    const [device] = await stored();
    assert.equal(device.endpoint, first.endpoint, 'the device in IndexedDB has the subscription');
    assert.ok(device.token.length > 20, 'the token is kept in IndexedDB');
    assert.ok(!page.url().includes(device.token), 'the token is not in the URL');
    report.device_id = device.deviceId;
    report.first_endpoint = first.endpoint;

    // Amounts in each currency's own minor units, as the notifications write them.
    const amounts = await page.evaluate(async () => {
      const { money } = await import(new URL('tidings.js', location.href).href);
      return [money(1200, 'JPY'), money(1200, 'EUR'), money(1200, 'KWD'), money(123456, 'EUR', 'de'), money(-5, 'USD')];
    });
    assert.deepEqual(amounts, ['1,200 JPY', '12.00 EUR', '1.200 KWD', '1.234,56 EUR', '-0.05 USD']);
    log('registered', device.deviceId);

    // The client sets and reads the device's preferences (then none again, for what follows).
    const preferences = await page.evaluate(async () => {
      const { Tidings } = await import(new URL('tidings.js', location.href).href);
      const t = new Tidings({ api: location.origin });
      const set = await t.setPreferences({ quiet_hours: { start: '23:00', end: '06:30', days: ['sat'] } });
      const read = await t.preferences();
      return { set, read, none: await t.setPreferences({}) };
    });
    const quiet = { quiet_hours: { start: '23:00', end: '06:30', days: ['sat'] } };
    assert.deepEqual(preferences, { set: quiet, read: quiet, none: {} });

    // Watch an item with the page's form; the price drops below the threshold.
    await setItem('SKU-BROWSER', { price: 1200 });
    await watchBelow(page, 'SKU-BROWSER', '10.00');
    await setItem('SKU-BROWSER', { price: 900 });

    // The real pusher's message arrives at the relay, encrypted to the page's keys.
    const path = new URL(first.endpoint).pathname;
    const [message] = await eventually('a push for SKU-BROWSER at the relay', () => relay.received.get(path));
    const vapid = await (await fetch(`${API}/v1/vapid-public-key`)).json();
    assert.equal(message.headers['content-encoding'], 'aes128gcm');
    assert.match(message.headers.authorization, /^vapid t=[\w-]+\.[\w-]+\.[\w-]+, k=/);
    assert.equal(message.headers.authorization.split('k=')[1], vapid.public_key, 'signed with the api\'s VAPID key');
    const plaintext = await page.evaluate(decryptPush, { body: message.body.toString('base64'), record: first });
    const payload = JSON.parse(plaintext);
    log('decrypted in the page:', plaintext);
    assert.match(payload.body, /9\.00 EUR/, 'the re-fetched price is in the payload');
    assert.match(payload.id, /^[0-9a-f-]{36}$/, 'the id is the outbox row id');
    assert.match(payload.tag, /^[0-9a-f]{32}\/price_below:1000$/, 'the tag names the watch and trigger');
    assert.ok(Date.parse(payload.valid_until) > Date.parse(payload.observed_at), 'valid after it was observed');
    assert.equal(payload.data.item, 'SKU-BROWSER');
    report.sent_id = payload.id;
    // The same notification in Declarative Web Push's documented keys, correctable by a worker.
    assert.equal(payload.web_push, 8030);
    assert.equal(payload.mutable, true);
    const documented = ['title', 'lang', 'dir', 'body', 'navigate', 'silent', 'app_badge', 'tag', 'timestamp', 'data'];
    for (const key of Object.keys(payload.notification)) assert.ok(documented.includes(key), `undocumented key ${key}`);
    assert.equal(payload.notification.title, payload.title);
    assert.equal(payload.notification.body, payload.body);
    assert.equal(payload.notification.navigate, payload.url);
    assert.ok(Number.isInteger(payload.notification.timestamp));

    // Delivered to the service worker as a push service would: one notification, shown once
    // even when the same push comes twice.
    const cdp = await context.newCDPSession(page);
    const registrations = [];
    const versions = new Map();
    cdp.on('ServiceWorker.workerRegistrationUpdated', (e) => registrations.push(...e.registrations));
    cdp.on('ServiceWorker.workerVersionUpdated', (e) => e.versions.forEach((v) => versions.set(v.versionId, v)));
    await cdp.send('ServiceWorker.enable');
    const registration = await eventually('the service worker registration', () =>
      registrations.find((r) => !r.isDeleted && r.scopeURL === `${API}/web/`),
    );
    const ours = () => [...versions.values()].filter((v) => v.registrationId === registration.registrationId);
    // What the worker told the page, for a failure's message.
    await page.evaluate(() => {
      window.testHeard = [];
      navigator.serviceWorker.addEventListener('message', (e) => window.testHeard.push(e.data && e.data.type));
    });
    const withVersions = async (e) => {
      const heard = await page.evaluate(() => window.testHeard).catch((x) => x.message);
      throw new Error(`${e.message}; the worker's versions: ${JSON.stringify(ours())}; the page heard: ${JSON.stringify(heard)}`);
    };
    // A push is a functional event: delivered only to an activated worker that runs. Under load
    // the worker may still be starting (or stopped while idle) when the test gets here, and a
    // message handed over then is not dispatched; so start it and wait, as a push service's
    // delivery would. The versions the test sees can lag a worker stopping, so a push can still
    // be dropped (a CI run saw one): as a push service redelivers what the browser did not take,
    // a push the worker does not report handling (it tells open pages of every push it shows)
    // within 10 s is delivered again, three times at most.
    const handled = () => page.evaluate(() => window.testHeard.filter((t) => t === 'tidings:push').length);
    const deliver = async (data) => {
      const before = await handled();
      for (let attempt = 1; ; attempt += 1) {
        await cdp.send('ServiceWorker.startWorker', { scopeURL: registration.scopeURL });
        await eventually('the worker running', () =>
          ours().find((v) => v.status === 'activated' && v.runningStatus === 'running'),
        ).catch(withVersions);
        await cdp.send('ServiceWorker.deliverPushMessage', { origin: API, registrationId: registration.registrationId, data });
        const taken = await eventually('the push handled', async () => (await handled()) > before, 10).catch(() => false);
        if (taken) return;
        if (attempt === 3) await withVersions(new Error('a push delivered three times was never handled'));
        log(`the worker did not handle the push; delivering it again (attempt ${attempt + 1})`);
      }
    };
    const shown = () =>
      page.evaluate(async () =>
        (await (await navigator.serviceWorker.ready).getNotifications()).map((n) => ({
          title: n.title,
          body: n.body,
          tag: n.tag,
          url: n.data && n.data.url,
        })),
      );
    await deliver(plaintext);
    const once = await eventually('the notification shown', async () => {
      const n = await shown();
      return n.length ? n : null;
    }).catch(withVersions);
    assert.equal(once.length, 1);
    assert.match(once[0].body, /9\.00 EUR/);
    assert.equal(once[0].title, payload.title);
    assert.equal(once[0].tag, payload.tag);
    await deliver(plaintext);
    await sleep(500);
    const twice = await shown();
    assert.equal(twice.length, 1, `a second delivery of the same push added a notification: ${JSON.stringify(twice)}`);
    report.notifications = twice;

    // Checked again when shown: the worker asked the api (the price still holds) and reported
    // what it showed, which the history records.
    const history = async () =>
      (await (await fetch(`${API}/v1/notifications`, { headers: { authorization: `Bearer ${device.token}` } })).json()).items;
    const shownAs = (what) =>
      eventually(`the history saying it was shown ${what}`, async () =>
        (await history()).find((n) => n.id === payload.id && n.shown && n.shown.shown === what),
      );
    await shownAs('as_sent');

    // The price went back up before the device came back: it shows what changed, in place of
    // the notification it had (one watch, one tag).
    await setItem('SKU-BROWSER', { price: 1500 });
    // The detector sees it too and the pipeline sends the withdrawal to the same subscription.
    const [, withdrawalMessage] = await eventually('the withdrawal at the relay', () => {
      const m = relay.received.get(path);
      return m.length >= 2 ? m : null;
    });
    const realWithdrawal = JSON.parse(
      await page.evaluate(decryptPush, { body: withdrawalMessage.body.toString('base64'), record: first }),
    );
    assert.equal(realWithdrawal.withdraws, payload.id);
    assert.equal(realWithdrawal.tag, payload.tag);
    assert.match(realWithdrawal.body, /^Was 9\.00 EUR at \d\d:\d\d, now 15\.00 EUR\.$/);
    await deliver(plaintext);
    const corrected = await eventually('the corrected notification', async () => {
      const n = await shown();
      return n.length === 1 && n[0].title !== payload.title ? n : null;
    });
    assert.equal(corrected[0].title, 'SKU-BROWSER has changed');
    assert.match(corrected[0].body, /^Was 9\.00 EUR at \d\d:\d\d, now 15\.00 EUR\.$/);
    await shownAs('corrected');
    report.corrected = corrected[0];

    // The api out of reach: the payload, "as of" the time its value was observed.
    const [sw] = context.serviceWorkers();
    const swap = (from, to) =>
      sw.evaluate(
        async ({ from, to }) => {
          const [d] = (await devices()).filter((x) => x.api === from);
          await stored('readwrite', (store) => store.delete(from));
          await remember({ ...d, api: to });
        },
        { from, to },
      );
    await swap(API, 'http://127.0.0.1:9');
    await deliver(plaintext);
    const asOf = await eventually('the notification as of its time', async () => {
      const n = await shown();
      return n.length === 1 && / \(as of /.test(n[0].body) ? n : null;
    });
    await swap('http://127.0.0.1:9', API);
    assert.equal(asOf[0].title, payload.title);
    assert.ok(asOf[0].body.startsWith(payload.body), asOf[0].body);
    assert.match(asOf[0].body, /\(as of \d\d:\d\d( [AP]M)?\)$/);
    report.as_of = asOf[0];

    // Another notification of the same watch and trigger replaces the one shown.
    await setItem('SKU-BROWSER', { price: 900 });
    await deliver(JSON.stringify({ ...payload, id: randomUUID() }));
    await sleep(500);
    const replaced = await shown();
    assert.equal(replaced.length, 1, `two notifications of one watch: ${JSON.stringify(replaced)}`);

    // A withdrawal (the notification stopped holding) takes the shown one's place, as sent: the
    // worker does not ask about it (asking here would fail and add "as of").
    const withdrawal = {
      ...payload,
      id: randomUUID(),
      withdraws: payload.id,
      title: 'SKU-BROWSER has changed',
      body: 'Was 9.00 EUR at 10:02, now 15.00 EUR.',
    };
    await deliver(JSON.stringify(withdrawal));
    const withdrawn = await eventually('the withdrawal in place of the notification', async () => {
      const n = await shown();
      return n.length === 1 && n[0].title === withdrawal.title ? n : null;
    });
    assert.equal(withdrawn[0].body, withdrawal.body);
    assert.equal(withdrawn[0].tag, payload.tag);
    report.withdrawn = withdrawn[0];

    // A push in the declarative shape alone is shown from its `notification`.
    const declarative = { web_push: 8030, notification: { ...payload.notification, tag: 'declarative', title: 'Declared' }, mutable: true };
    await deliver(JSON.stringify(declarative));
    const both = await eventually('the declarative notification', async () => {
      const n = await shown();
      return n.find((x) => x.tag === 'declarative') ? n : null;
    });
    const declared = both.find((x) => x.tag === 'declarative');
    assert.equal(declared.title, 'Declared');
    assert.equal(declared.body, payload.body);
    assert.equal(declared.url, payload.url);
    // The worker told the page, which shows the row as sent.
    await page.waitForSelector(`#history-list li[data-id="${payload.id}"][data-state="sent"]`, { timeout: 15000 });
    report.sent_text = await page.textContent(`#history-list li[data-id="${payload.id}"] .state`);
    assert.equal(report.sent_text, 'Sent at 9.00 EUR.');

    // A drop the re-check no longer sees (the price is back up when the dispatcher asks):
    // the page explains why nothing came.
    await setItem('SKU-FLICKER', { price: 1200 });
    await watchBelow(page, 'SKU-FLICKER', '10.00');
    await setItem('SKU-FLICKER', { price: 1200, script: [900] });
    await page.click('#refresh');
    const withheld = await eventually('the withheld notification on the page', async () => {
      await page.click('#refresh');
      return page.$('#history-list li[data-state="withheld"]');
    });
    report.withheld_text = await withheld.textContent();
    assert.match(report.withheld_text, /Withheld: the price went back up to 12\.00 EUR before we sent/);
    assert.match(report.withheld_text, /SKU-FLICKER/);

    // The browser rotates the subscription and hands over none: the worker subscribes again
    // and gives the api the new one with the stored token.
    const [worker] = context.serviceWorkers();
    assert.ok(worker, 'the service worker is running');
    await worker.evaluate(installFakePush, { relay: relay.origin, where: 'worker' });
    const rotated = await worker.evaluate(async () => {
      const before = (await devices())[0].endpoint;
      self.dispatchEvent(new PushSubscriptionChangeEvent('pushsubscriptionchange', {}));
      for (let i = 0; i < 200; i += 1) {
        const [d] = await devices();
        if (d.endpoint !== before) return { device: d, record: self.__fakePushRecord };
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error('the worker did not store a new subscription');
    });
    assert.notEqual(rotated.device.endpoint, first.endpoint);
    assert.equal(rotated.device.endpoint, rotated.record.endpoint);
    assert.equal(rotated.device.token, device.token, 'the same device, by its stored token');
    report.new_endpoint = rotated.device.endpoint;

    // The next notification goes to the new subscription, and decrypts with its keys.
    await setItem('SKU-AFTER', { price: 1200 });
    await watchBelow(page, 'SKU-AFTER', '10.00');
    await setItem('SKU-AFTER', { price: 800 });
    const newPath = new URL(rotated.device.endpoint).pathname;
    const [after] = await eventually('a push at the new subscription', () => relay.received.get(newPath));
    const afterPayload = JSON.parse(
      await page.evaluate(decryptPush, { body: after.body.toString('base64'), record: rotated.record }),
    );
    assert.equal(afterPayload.data.item, 'SKU-AFTER');
    assert.match(afterPayload.body, /8\.00 EUR/);
    assert.equal(relay.received.get(path).length, 2, 'nothing more went to the old subscription');

    // CORS: a page on a listed origin calls the api and reads its answer and exposed headers;
    // a page on any other origin is refused at the preflight.
    // Both pages are on loopback, as the api is: Chromium refuses a page on a public address
    // that calls a local one (Local Network Access) whatever CORS says.
    const shopPage = (req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>shop</title>');
    };
    const shopServer = await listen(http.createServer(shopPage), Number(new URL(ALLOWED).port));
    const otherServer = await listen(http.createServer(shopPage), 0);
    const shop = `http://127.0.0.1:${shopServer.address().port}`;
    const other = `http://127.0.0.1:${otherServer.address().port}`;
    assert.equal(shop, new URL(ALLOWED).origin);
    const fromOrigin = async (origin) => {
      const p = await context.newPage();
      await p.goto(`${origin}/`);
      const result = await p.evaluate(
        async ({ api, token }) => {
          const create = () =>
            fetch(`${api}/v1/watches`, {
              method: 'POST',
              headers: {
                authorization: `Bearer ${token}`,
                'content-type': 'application/json',
                'idempotency-key': 'cors-check',
              },
              body: JSON.stringify({ item_code: 'SKU-CORS', triggers: [{ kind: 'back_in_stock' }] }),
            });
          try {
            const a = await create();
            const b = await create();
            return {
              ok: true,
              status: [a.status, b.status],
              replayed: b.headers.get('idempotent-replayed'),
              location: a.headers.get('location'),
            };
          } catch (e) {
            return { ok: false, error: String(e) };
          }
        },
        { api: API, token: device.token },
      );
      await p.close();
      return result;
    };
    const allowed = await fromOrigin(shop);
    assert.deepEqual(allowed.status, [201, 201], JSON.stringify(allowed));
    assert.equal(allowed.replayed, 'true', 'Idempotent-Replayed is readable cross-origin');
    assert.match(allowed.location || '', /^\/v1\/watches\/[0-9a-f-]{36}$/, 'Location is readable cross-origin');
    const refused = await fromOrigin(other);
    assert.equal(refused.ok, false, `a page on ${other} read the api: ${JSON.stringify(refused)}`);
    assert.match(refused.error, /TypeError/);
    report.cors = { allowed, refused };

    // Without a push service (this machine is offline, and no stand-in this time) the page says
    // why it cannot turn notifications on.
    const offline = await browser.newContext();
    await offline.grantPermissions(['notifications'], { origin: API });
    const lone = await offline.newPage();
    await lone.goto(`${API}/web/`);
    await lone.click('#enable');
    await lone.waitForSelector('#error:not([hidden])', { timeout: 60000 });
    report.offline_error = await lone.textContent('#error');
    assert.match(report.offline_error, /could not subscribe with its push service/);
    assert.match(await lone.textContent('#status'), /Notifications are off/);
    await offline.close();
    shopServer.close();
    otherServer.close();
  } finally {
    await browser.close();
    relay.server.close();
  }
  console.log(JSON.stringify(report));
}

main().catch((e) => {
  console.error('browser-test: FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
