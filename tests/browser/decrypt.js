// RFC 8291 (Web Push message encryption, aes128gcm of RFC 8188) decryption in the browser with
// WebCrypto: an implementation independent of the pusher's Rust one. Self-contained, run in
// the page by Playwright: `body` is the relay's request body (base64), `record` the fake
// subscription's keys (fake-push.js).
async function decryptPush({ body, record }) {
  const fromB64 = (t) => {
    const b64 = t.replace(/-/g, '+').replace(/_/g, '/');
    return Uint8Array.from(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4)), (c) => c.charCodeAt(0));
  };
  const concat = (...parts) => {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  };
  const enc = new TextEncoder();
  const hkdf = async (salt, ikm, info, bits) => {
    const key = await crypto.subtle.importKey('raw', ikm, 'HKDF', false, ['deriveBits']);
    return new Uint8Array(await crypto.subtle.deriveBits({ name: 'HKDF', hash: 'SHA-256', salt, info }, key, bits));
  };
  const message = fromB64(body);
  // The aes128gcm header: salt (16), record size (4), key id length (1), key id: the
  // application server's ephemeral public key (65, uncompressed P-256).
  const salt = message.slice(0, 16);
  const recordSize = new DataView(message.buffer).getUint32(16);
  const idLength = message[20];
  if (idLength !== 65) throw new Error(`key id is ${idLength} bytes, not a P-256 public key`);
  const serverPublic = message.slice(21, 21 + idLength);
  const ciphertext = message.slice(21 + idLength);
  if (ciphertext.length > recordSize) throw new Error('more than one record');
  const uaPublic = fromB64(record.p256dh);
  const auth = fromB64(record.auth);
  const ecdhCurve = { name: 'ECDH', namedCurve: 'P-256' };
  const uaPrivate = await crypto.subtle.importKey('jwk', record.privateJwk, ecdhCurve, false, ['deriveBits']);
  const serverKey = await crypto.subtle.importKey('raw', serverPublic, ecdhCurve, false, []);
  const shared = new Uint8Array(await crypto.subtle.deriveBits({ name: 'ECDH', public: serverKey }, uaPrivate, 256));
  const ikm = await hkdf(auth, shared, concat(enc.encode('WebPush: info\0'), uaPublic, serverPublic), 256);
  const cek = await hkdf(salt, ikm, enc.encode('Content-Encoding: aes128gcm\0'), 128);
  const nonce = await hkdf(salt, ikm, enc.encode('Content-Encoding: nonce\0'), 96);
  const key = await crypto.subtle.importKey('raw', cek, 'AES-GCM', false, ['decrypt']);
  const padded = new Uint8Array(await crypto.subtle.decrypt({ name: 'AES-GCM', iv: nonce }, key, ciphertext));
  // The last record ends with the delimiter 0x02, then zero padding.
  let end = padded.length - 1;
  while (end >= 0 && padded[end] === 0) end -= 1;
  if (padded[end] !== 2) throw new Error('no last-record delimiter');
  return new TextDecoder().decode(padded.slice(0, end));
}

module.exports = { decryptPush };
