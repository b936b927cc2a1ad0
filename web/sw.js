// Tidings service worker: shows each push, opens its item on click, and keeps the api's copy
// of this browser's push subscription current when the browser rotates it. A classic script
// (not a module) so every browser with Web Push can run it; the page registers it with
// tidings.js, which stores the device's token where this worker reads it (IndexedDB).
//
// The push payload is what the pusher encrypts: { id, title, body, tag, observed_at,
// valid_until, url?, icon?, data }. `id` is the notification's outbox row; `tag` names its watch
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

function readPayload(data) {
  if (!data) return { title: 'Tidings', body: '' };
  try {
    return data.json();
  } catch {
    // Not ours (or not JSON): show it rather than drop it, as userVisibleOnly promises.
    return { title: 'Tidings', body: data.text() };
  }
}

self.addEventListener('push', (event) => {
  const p = readPayload(event.data);
  const shown = self.registration.showNotification(p.title || 'Tidings', {
    body: p.body || '',
    tag: p.tag || undefined,
    icon: p.icon || ICON,
    data: { url: p.url || null, id: p.id || p.tag || null, item: p.data && p.data.item },
  });
  // Open pages refresh their history.
  const told = clients
    .matchAll({ type: 'window', includeUncontrolled: true })
    .then((pages) => pages.forEach((c) => c.postMessage({ type: 'tidings:push', payload: p })));
  event.waitUntil(Promise.all([shown, told]));
});

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const target = (event.notification.data && event.notification.data.url) || self.registration.scope;
  event.waitUntil(
    clients.matchAll({ type: 'window', includeUncontrolled: true }).then((pages) => {
      const open = pages.find((c) => c.url === target);
      return open ? open.focus() : clients.openWindow(target);
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
