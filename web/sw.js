// Tidings service worker: shows each push, opens its item on click, and keeps the api's copy
// of this browser's push subscription current when the browser rotates it. A classic script
// (not a module) so every browser with Web Push can run it; the page registers it with
// tidings.js, which stores the device's token where this worker reads it (IndexedDB).
//
// On a push it asks the api whether the notification still holds (within CHECK_BUDGET_MS) and
// shows what is true now: as sent, with the current value, or what changed since; without an
// answer it shows the payload "as of" its time. Then it reports what it showed. A withdrawal
// (`withdraws` set: a notification that stopped holding, "was …, now …") is shown as sent, in
// the place of the one it withdraws (same tag), without a sound of its own.
//
// The push payload is what the pusher encrypts: { id, title, body, tag, observed_at,
// valid_until, withdraws?, url?, icon?, data }. `id` is the notification's outbox row; `tag` names its watch
// and trigger, so a newer notification of the same watch, or a push delivered twice, replaces
// the one shown instead of showing a second.

/* global clients */

const ICON = new URL('icon.svg', self.registration.scope).href;

// The store tidings.js writes: one record per api, keyed by its origin.
function openStore() {
  return new Promise((resolve, reject) => {
    const open = indexedDB.open('tidings', 1);
    open.onupgradeneeded = () => open.result.createObjectStore('devices', { keyPath: 'api' });
    open.onsuccess = () => resolve(open.result);
    open.onerror = () => reject(open.error);
  });
}

// Runs `op` on the devices store in one transaction; resolves with its request's result.
async function stored(mode, op) {
  const db = await openStore();
  try {
    return await new Promise((resolve, reject) => {
      const tx = db.transaction('devices', mode);
      const request = op(tx.objectStore('devices'));
      tx.oncomplete = () => resolve(request.result);
      tx.onerror = () => reject(tx.error);
    });
  } finally {
    db.close();
  }
}

const devices = () => stored('readonly', (store) => store.getAll());
const remember = (device) => stored('readwrite', (store) => store.put(device));

// A push in the Declarative Web Push shape (`web_push: 8030`, what Safari shows without a worker)
// carries its notification under `notification`. Tidings sends both shapes; this reads either.
function normalize(p) {
  const n = p && p.web_push === 8030 && p.notification;
  if (!n) return p;
  return { ...p, title: p.title || n.title, body: p.body || n.body, tag: p.tag || n.tag, url: p.url || n.navigate };
}

function readPayload(data) {
  if (!data) return { title: 'Tidings', body: '' };
  try {
    return normalize(data.json());
  } catch {
    // Not ours (or not JSON): show it rather than drop it, as userVisibleOnly promises.
    return { title: 'Tidings', body: data.text() };
  }
}

// How long a push waits for the api's word on whether it still holds before it shows the
// notification "as of" its time: browsers want a notification shown promptly.
const CHECK_BUDGET_MS = 2500;

// Asks the api whether notification `id` still holds and what to show: the answer of the first
// registered api that knows it, or null if none answers within the budget.
async function checkNow(id) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), CHECK_BUDGET_MS);
  try {
    for (const device of await devices()) {
      try {
        const r = await fetch(`${device.api}/v1/notifications/${encodeURIComponent(id)}/now`, {
          credentials: 'omit',
          headers: { authorization: `Bearer ${device.token}` },
          signal: abort.signal,
        });
        if (r.ok) return { device, now: await r.json() };
      } catch {
        if (abort.signal.aborted) return null;
      }
    }
    return null;
  } finally {
    clearTimeout(timer);
  }
}

// `HH:MM` of an instant, as this browser writes times.
function clock(at) {
  return new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit' }).format(new Date(at));
}

function asOf(body, at) {
  const t = clock(at);
  return (navigator.language || '').startsWith('ja') ? `${body}（${t}時点）` : `${body} (as of ${t})`;
}

// What to show for payload `p`: as sent, updated or corrected by the api, or the payload "as of"
// its time when the api cannot say; and to whom to report it.
async function decide(p) {
  if (p.id && p.withdraws) return { title: p.title, body: p.body || '', shown: 'as_sent' };
  // A digest speaks for several rows; the api's check speaks for one. Shown "as of" its time.
  if (p.id && p.data && p.data.digest && p.observed_at) {
    return { title: p.title, body: asOf(p.body || '', p.observed_at), shown: 'as_of' };
  }
  const checked = p.id ? await checkNow(p.id) : null;
  if (checked) {
    const { now, device } = checked;
    return { title: now.title, body: now.body, shown: now.shown, device };
  }
  if (p.id && p.observed_at) return { title: p.title, body: asOf(p.body || '', p.observed_at), shown: 'as_of' };
  return { title: p.title, body: p.body || '', shown: null };
}

// Tells the api what was shown (best effort: the history records it when it arrives).
async function report(p, seen) {
  const targets = seen.device ? [seen.device] : await devices();
  for (const device of targets) {
    try {
      const r = await fetch(`${device.api}/v1/notifications/${encodeURIComponent(p.id)}/shown`, {
        method: 'POST',
        credentials: 'omit',
        headers: { authorization: `Bearer ${device.token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ shown: seen.shown }),
      });
      if (r.ok) return;
    } catch {
      // Unreachable: the history keeps what the push service confirmed.
    }
  }
}

async function onPush(p) {
  const seen = await decide(p);
  await self.registration.showNotification(seen.title || 'Tidings', {
    body: seen.body,
    tag: p.tag || undefined,
    icon: p.icon || ICON,
    data: { url: p.url || null, id: p.id || p.tag || null, item: p.data && p.data.item, shown: seen.shown },
  });
  // Open pages refresh their history.
  const pages = await clients.matchAll({ type: 'window', includeUncontrolled: true });
  pages.forEach((c) => c.postMessage({ type: 'tidings:push', payload: p, shown: seen.shown }));
  if (p.id && seen.shown) await report(p, seen);
}

self.addEventListener('push', (event) => {
  event.waitUntil(onPush(readPayload(event.data)));
});

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const data = event.notification.data || {};
  // The page is told which notification brought the reader, so it can say what changed since.
  const target = new URL(data.url || self.registration.scope);
  if (data.id) target.searchParams.set('tidings_notification', data.id);
  event.waitUntil(
    clients.matchAll({ type: 'window', includeUncontrolled: true }).then((pages) => {
      const open = pages.find((c) => c.url === target.href);
      return open ? open.focus() : clients.openWindow(target.href);
    }),
  );
});

// The browser replaced (or lost) this subscription: subscribe again if it did not hand us the
// new one, and tell every api this browser is registered with, with the stored token.
self.addEventListener('pushsubscriptionchange', (event) => {
  event.waitUntil(resubscribe(event.newSubscription));
});

async function resubscribe(given) {
  for (const device of await devices()) {
    let key = device.vapidKey;
    try {
      const r = await fetch(`${device.api}/v1/vapid-public-key`, { credentials: 'omit' });
      if (r.ok) key = (await r.json()).public_key;
    } catch {
      // Offline: the stored key is the one the browser subscribed with.
    }
    const subscription =
      given ||
      (await self.registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: bytes(key) }));
    const sub = subscription.toJSON();
    const r = await fetch(`${device.api}/v1/devices/me/subscription`, {
      method: 'PUT',
      credentials: 'omit',
      headers: { authorization: `Bearer ${device.token}`, 'content-type': 'application/json' },
      body: JSON.stringify(sub),
    });
    if (!r.ok) throw new Error(`${device.api} refused the new subscription: HTTP ${r.status}`);
    await remember({ ...device, endpoint: sub.endpoint, vapidKey: key });
  }
}

function bytes(base64url) {
  const b64 = base64url.replace(/-/g, '+').replace(/_/g, '/');
  const raw = atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4));
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}
