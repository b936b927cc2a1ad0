// Stands in for the browser's push service, which headless Chromium cannot reach offline:
// `pushManager.subscribe` gets a subscription whose P-256 key pair and auth secret are made
// here with WebCrypto and whose endpoint is the test's HTTPS relay. The real pusher encrypts
// to these keys and POSTs to the relay; the page decrypts with the private key (decrypt.js).
// Runs in a page (as an init script, the subscription kept in localStorage across loads) or in
// the service worker (kept on `self`). Self-contained: Playwright sends it as source.
function installFakePush({ relay, where }) {
  const KEY = 'tidings-test-subscription';
  const b64u = (bytes) => btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  const bytes = (text) => {
    const b64 = text.replace(/-/g, '+').replace(/_/g, '/');
    return Uint8Array.from(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4)), (c) => c.charCodeAt(0));
  };
  const save = (record) => {
    if (where === 'page') localStorage.setItem(KEY, JSON.stringify(record));
    else self.__fakePushRecord = record;
  };
  const load = () => (where === 'page' ? JSON.parse(localStorage.getItem(KEY) || 'null') : self.__fakePushRecord || null);
  const subscription = (r) => ({
    endpoint: r.endpoint,
    expirationTime: null,
    options: { userVisibleOnly: true, applicationServerKey: bytes(r.serverKey).buffer },
    getKey: (name) => bytes(name === 'p256dh' ? r.p256dh : r.auth).buffer,
    toJSON: () => ({ endpoint: r.endpoint, expirationTime: null, keys: { p256dh: r.p256dh, auth: r.auth } }),
    unsubscribe: async () => {
      save(null);
      return true;
    },
  });
  PushManager.prototype.subscribe = async function subscribe(options) {
    const pair = await crypto.subtle.generateKey({ name: 'ECDH', namedCurve: 'P-256' }, true, ['deriveBits']);
    const record = {
      endpoint: `${relay}/push/${crypto.randomUUID()}`,
      p256dh: b64u(new Uint8Array(await crypto.subtle.exportKey('raw', pair.publicKey))),
      auth: b64u(crypto.getRandomValues(new Uint8Array(16))),
      privateJwk: await crypto.subtle.exportKey('jwk', pair.privateKey),
      serverKey: b64u(new Uint8Array(options.applicationServerKey)),
    };
    save(record);
    return subscription(record);
  };
  PushManager.prototype.getSubscription = async function getSubscription() {
    const r = load();
    return r ? subscription(r) : null;
  };
}

module.exports = { installFakePush };
