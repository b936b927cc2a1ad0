// Tidings browser client: a dependency-free ES module (types in tidings.d.ts).
//
// A visitor allows notifications; this registers an anonymous device with the api (no login),
// subscribes it to Web Push with the api's VAPID key, and keeps the device's token in
// IndexedDB, where the service worker (sw.js) finds it to re-subscribe when the browser
// rotates the subscription. The token never goes into a URL. Clearing the site's data deletes
// it: the browser then registers as a new device, and the old one's watches stop (its
// subscription is replaced or expires) without anything to clean up by hand.

const DB_NAME = 'tidings';
const STORE = 'devices';

/** An api answer other than 2xx, with its RFC 9457 problem document when there was one. */
export class TidingsError extends Error {
  constructor(message, { status = 0, problem = null, retryAfter = null, code = 'http' } = {}) {
    super(message);
    this.name = 'TidingsError';
    this.status = status;
    this.problem = problem;
    this.retryAfter = retryAfter;
    this.code = code;
  }
}

/** Opens the store shared with the service worker: one record per api, keyed by its origin. */
export function openStore() {
  return new Promise((resolve, reject) => {
    const open = indexedDB.open(DB_NAME, 1);
    open.onupgradeneeded = () => open.result.createObjectStore(STORE, { keyPath: 'api' });
    open.onsuccess = () => resolve(open.result);
    open.onerror = () => reject(open.error);
  });
}

async function stored(op, value) {
  const db = await openStore();
  try {
    return await new Promise((resolve, reject) => {
      const tx = db.transaction(STORE, op === 'get' ? 'readonly' : 'readwrite');
      const request = tx.objectStore(STORE)[op](value);
      tx.oncomplete = () => resolve(request.result);
      tx.onerror = () => reject(tx.error);
    });
  } finally {
    db.close();
  }
}

/** `AAECAw` (base64url) → bytes. */
export function fromBase64Url(text) {
  const b64 = text.replace(/-/g, '+').replace(/_/g, '/');
  const raw = atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4));
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

/** Digits after the decimal point in `currency` (ISO 4217: JPY 0, EUR 2, KWD 3); 2 if unknown. */
export function minorUnits(currency) {
  try {
    return new Intl.NumberFormat('en', { style: 'currency', currency }).resolvedOptions().maximumFractionDigits;
  } catch {
    return 2;
  }
}

/**
 * Minor units → `1,234.56 EUR`, `1,200 JPY`: the currency's own decimals, written as `locale`
 * writes numbers (as the notifications are).
 */
export function money(minor, currency, locale = 'en') {
  const digits = currency ? minorUnits(currency) : 2;
  const amount = new Intl.NumberFormat(locale, { minimumFractionDigits: digits, maximumFractionDigits: digits }).format(
    minor / 10 ** digits,
  );
  return currency ? `${amount} ${currency}` : amount;
}

const WITHHELD = {
  watch_removed: () => 'you removed the watch before we sent it',
  watch_paused: () => 'you paused the watch before we sent it',
  subscription_inactive: () => "this browser's subscription was replaced or removed before we sent it",
  out_of_stock: () => 'it was out of stock when we checked',
  item_paused: () => 'the seller paused the listing before we sent it',
  not_found: () => 'the item is no longer in the catalog',
  subscription_gone: () => "the push service says this browser's subscription has expired",
  device_paused: () => 'notifications for this browser are paused by the operator',
  cancelled: () => 'the operator cancelled it before it was sent',
  superseded: () => 'a newer notification had already taken its place',
  recalled: () => 'the push service deleted the earlier one before this browser fetched it',
  condition_lost: (n) => {
    const c = n.checked;
    if (n.withdraws) return 'what it corrected was true again when we checked';
    if (n.trigger && n.trigger.kind === 'back_in_stock') {
      return 'it was out of stock again before we sent';
    }
    if (c && typeof c.price === 'number') {
      return `the price went back up to ${money(c.price, c.currency)} before we sent`;
    }
    return 'the price changed back before we sent';
  },
};

const NOT_DELIVERED = {
  retries_exhausted: 'the push service did not take it after several tries',
  push_rejected: 'the push service refused it',
  vapid_rejected: "the push service refused the sender's credentials",
  payload_too_large: 'it was too large for the push service',
  endpoint_refused: "this browser's push address is not one we send to",
  subscription_gone: "the push service says this browser's subscription has expired",
  cancelled: 'the operator cancelled it before it was sent',
};

/**
 * A notification from `history()` in plain words:
 * `{ state: 'sent' | 'withheld' | 'not_delivered' | 'maybe_sent' | 'in_progress', text }`.
 */
export function explain(n) {
  const sent = n.sent && typeof n.sent.price === 'number' ? ` at ${money(n.sent.price, n.sent.currency)}` : '';
  switch (n.delivery) {
    case 'delivered':
      return { state: 'sent', text: n.withdraws ? `Sent${sent}: the earlier one no longer held.` : `Sent${sent}.` };
    case 'withheld': {
      const why = WITHHELD[n.reason];
      return { state: 'withheld', text: `Withheld: ${why ? why(n) : n.reason}.` };
    }
    case 'may_have_been_delivered':
      return { state: 'maybe_sent', text: `Maybe sent${sent}: the push service did not confirm it.` };
    case 'not_delivered':
      return {
        state: 'not_delivered',
        text: `Not delivered: ${NOT_DELIVERED[n.reason] || n.reason || 'unknown reason'}.`,
      };
    default:
      if (n.status === 'retry' && n.attempts && n.attempts.length) {
        return { state: 'in_progress', text: 'On its way: the push service has not taken it yet; trying again.' };
      }
      return { state: 'in_progress', text: 'On its way: checking the price once more before sending.' };
  }
}

/** A trigger in words, e.g. `price below 10.00`. */
export function describeTrigger(t, currency = '') {
  switch (t.kind) {
    case 'price_below':
      return `price below ${money(t.threshold, currency)}`;
    case 'price_drop':
      return `price drops ${t.percent}%`;
    case 'back_in_stock':
      return 'back in stock';
    default:
      return t.kind;
  }
}

export class Tidings {
  /**
   * @param {object} [options]
   * @param {string} [options.api] the api's origin (default: this page's)
   * @param {string} [options.serviceWorker] the service worker's URL, same-origin with the page
   * @param {string} [options.scope] its scope (default: its folder)
   */
  constructor({ api = globalThis.location?.origin, serviceWorker = 'sw.js', scope } = {}) {
    if (!api) throw new TypeError('Tidings: options.api is required outside a page');
    this.api = new URL(api).origin;
    this.serviceWorker = serviceWorker;
    this.scope = scope;
  }

  /** Whether this browser can receive Web Push at all. */
  static supported() {
    return 'serviceWorker' in navigator && 'PushManager' in globalThis && 'Notification' in globalThis;
  }

  async request(method, path, { body, token, headers = {} } = {}) {
    const h = { ...headers };
    if (token) h.authorization = `Bearer ${token}`;
    if (body !== undefined) h['content-type'] = 'application/json';
    let response;
    try {
      response = await fetch(this.api + path, {
        method,
        headers: h,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: 'omit',
      });
    } catch (e) {
      throw new TidingsError(`the api at ${this.api} could not be reached (${e.message})`, { code: 'network' });
    }
    const text = await response.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (!response.ok) {
      const retry = response.headers.get('retry-after');
      throw new TidingsError((json && json.detail) || `${method} ${path}: HTTP ${response.status}`, {
        status: response.status,
        problem: json,
        retryAfter: retry === null ? null : Number(retry),
        code: response.status === 401 ? 'unregistered' : 'http',
      });
    }
    return { json, headers: response.headers };
  }

  /** The stored device of this browser for this api, or `null`. */
  device() {
    return stored('get', this.api).then((d) => d || null);
  }

  async token() {
    const d = await this.device();
    if (!d) throw new TidingsError('this browser is not registered; call enable() first', { code: 'unregistered' });
    return d.token;
  }

  /** A call with the device's token; a 401 means the api no longer knows the device. */
  async authed(method, path, options = {}) {
    const token = await this.token();
    try {
      return await this.request(method, path, { ...options, token });
    } catch (e) {
      if (e.code === 'unregistered') await stored('delete', this.api);
      throw e;
    }
  }

  /**
   * Asks for permission, subscribes, and registers this browser with the api, or, when it is
   * registered already, makes sure the api has its current subscription. Returns the device.
   */
  async enable({ timeZone = Intl.DateTimeFormat().resolvedOptions().timeZone, locale = navigator.language } = {}) {
    if (!Tidings.supported()) {
      throw new TidingsError('this browser has no Web Push (service workers, Push API, notifications)', {
        code: 'unsupported',
      });
    }
    const registration = await navigator.serviceWorker.register(this.serviceWorker, this.scope ? { scope: this.scope } : {});
    await activated(registration);
    const permission = await Notification.requestPermission();
    if (permission !== 'granted') {
      throw new TidingsError(`notifications are ${permission === 'denied' ? 'blocked' : 'not allowed'} for this site`, {
        code: 'permission',
      });
    }
    const { json: vapid } = await this.request('GET', '/v1/vapid-public-key');
    const key = fromBase64Url(vapid.public_key);
    let subscription = await registration.pushManager.getSubscription();
    if (subscription && !sameKey(subscription.options && subscription.options.applicationServerKey, key)) {
      await subscription.unsubscribe();
      subscription = null;
    }
    if (!subscription) {
      try {
        subscription = await registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
      } catch (e) {
        throw new TidingsError(
          `the browser could not subscribe with its push service (${e.message}); ` +
            'subscribing needs the browser to reach its push service on the internet',
          { code: 'subscribe' },
        );
      }
    }
    const sub = subscription.toJSON();
    const known = await this.device();
    if (known) {
      try {
        if (known.endpoint !== sub.endpoint) {
          await this.request('PUT', '/v1/devices/me/subscription', { body: sub, token: known.token });
        } else {
          await this.request('GET', '/v1/watches?limit=1', { token: known.token });
        }
        const device = { ...known, endpoint: sub.endpoint, vapidKey: vapid.public_key };
        await stored('put', device);
        return device;
      } catch (e) {
        if (e.code !== 'unregistered') throw e;
        // The api forgot this device (removed, or another environment): register anew.
      }
    }
    const { json: created } = await this.request('POST', '/v1/devices', {
      body: { subscription: sub, time_zone: timeZone, ...(locale ? { locale } : {}) },
    });
    const device = {
      api: this.api,
      token: created.token,
      deviceId: created.device_id,
      endpoint: sub.endpoint,
      vapidKey: vapid.public_key,
    };
    await stored('put', device);
    return device;
  }

  /**
   * Watches `itemCode` with `triggers` (e.g. `[{ kind: 'price_below', threshold: 1000 }]`).
   * `idempotencyKey` makes a retried create return the first one's watch.
   */
  async watch(itemCode, triggers, { idempotencyKey = crypto.randomUUID() } = {}) {
    const { json, headers } = await this.authed('POST', '/v1/watches', {
      body: { item_code: itemCode, triggers },
      headers: { 'idempotency-key': idempotencyKey },
    });
    return { ...json, replayed: headers.get('idempotent-replayed') === 'true' };
  }

  /** Every watch of this device, following the pages. */
  async watches() {
    const all = [];
    let cursor = null;
    do {
      const q = cursor ? `?limit=200&cursor=${encodeURIComponent(cursor)}` : '?limit=200';
      const { json } = await this.authed('GET', `/v1/watches${q}`);
      all.push(...json.items);
      cursor = json.next_cursor;
    } while (cursor);
    return all;
  }

  async unwatch(id) {
    await this.authed('DELETE', `/v1/watches/${encodeURIComponent(id)}`);
  }

  async pause(id, paused = true) {
    return (await this.authed('PATCH', `/v1/watches/${encodeURIComponent(id)}`, { body: { paused } })).json;
  }

  /** When this device's notifications wait: `{ quiet_hours, cap }`, each absent when unset. */
  async preferences() {
    return (await this.authed('GET', '/v1/devices/me')).json.preferences;
  }

  /**
   * Sets when notifications wait, e.g. `{ quiet_hours: { start: '22:00', end: '07:30' },
   * cap: { max: 5, window_seconds: 86400 } }`; `{}` for never. Held ones are judged again now.
   */
  async setPreferences(preferences) {
    return (await this.authed('PATCH', '/v1/devices/me', { body: { preferences } })).json.preferences;
  }

  /** One page of this device's notifications, newest first; `explain(n)` says each in words. */
  async history({ status, cursor, limit = 50 } = {}) {
    const q = new URLSearchParams({ limit: String(limit) });
    if (status) q.set('status', status);
    if (cursor) q.set('cursor', cursor);
    return (await this.authed('GET', `/v1/notifications?${q}`)).json;
  }

  /** Removes the device at the api, unsubscribes, and forgets the token. */
  async forget() {
    const d = await this.device();
    if (d) {
      try {
        await this.request('DELETE', '/v1/devices/me', { token: d.token });
      } catch (e) {
        if (e.code !== 'unregistered') throw e;
      }
      await stored('delete', this.api);
    }
    const registration = await navigator.serviceWorker.getRegistration(this.scope);
    const subscription = registration && (await registration.pushManager.getSubscription());
    if (subscription) await subscription.unsubscribe();
  }
}

function sameKey(a, b) {
  if (!a) return false;
  const x = new Uint8Array(a);
  return x.length === b.length && x.every((v, i) => v === b[i]);
}

/** Resolves once `registration` has an active worker (push needs one). */
function activated(registration) {
  if (registration.active) return Promise.resolve(registration);
  const worker = registration.installing || registration.waiting;
  return new Promise((resolve, reject) => {
    worker.addEventListener('statechange', () => {
      if (worker.state === 'activated') resolve(registration);
      if (worker.state === 'redundant') reject(new TidingsError('the service worker failed to install', { code: 'worker' }));
    });
  });
}
