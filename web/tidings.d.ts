// Types for tidings.js, the Tidings browser client.

export type Trigger =
  | { kind: 'price_below'; threshold: number }
  | { kind: 'price_drop'; percent: number }
  | { kind: 'back_in_stock' };

export interface Device {
  /** The api's origin: the record's key in IndexedDB (`tidings` / `devices`). */
  api: string;
  /** The device's bearer token; shown once by the api, kept only here. */
  token: string;
  deviceId: string;
  /** The push subscription the api has for this browser. */
  endpoint: string;
  /** The VAPID public key it was made with (base64url). */
  vapidKey: string;
}

export interface Watch {
  id: string;
  item_code: string;
  triggers: Trigger[];
  channel: 'web_push';
  paused: boolean;
  /** Its notifications go at once, whatever the preferences. */
  urgent: boolean;
  /** Its own, in place of the device's; null: the device's. */
  preferences: Preferences | null;
  reference_price: number | null;
  created_at: string;
  updated_at: string;
  /** Only on `watch()`: the api answered with an earlier create's watch (same idempotency key). */
  replayed?: boolean;
}

/** When notifications wait for their reader, on the device's clock; each absent: none. */
export interface Preferences {
  /** `HH:MM` or `HH:MM:SS`; an end before the start is the next morning's. `days`: every day if absent. */
  quiet_hours?: { start: string; end: string; days?: ('mon' | 'tue' | 'wed' | 'thu' | 'fri' | 'sat' | 'sun')[] } | null;
  /** At most `max` notifications in any `window_seconds`. */
  cap?: { max: number; window_seconds: number } | null;
  /** What holds goes out together then, as one notification, each re-checked. */
  digest?: 'none' | 'hourly' | `daily at ${string}` | `weekly on ${string} at ${string}` | null;
}

export interface Observation {
  price: number;
  currency: string;
  in_stock: boolean;
  paused?: boolean;
  observed_at: string;
}

export type Delivery = 'in_progress' | 'delivered' | 'may_have_been_delivered' | 'withheld' | 'not_delivered';

export interface Notification {
  id: string;
  watch_id: string;
  item_code: string | null;
  trigger: Trigger;
  channel: 'web_push';
  status: 'pending' | 'retry' | 'sending' | 'sent' | 'dropped' | 'failed';
  reason: string | null;
  /** Why it waited for its reader, if it did; `release_at` while it waits. */
  held?: 'quiet_hours' | 'cap' | null;
  release_at?: string | null;
  delivery: Delivery;
  detected: { price: number; currency: string; in_stock: boolean; at: string };
  /** The value the last check saw when it withheld the notification. */
  checked: Observation | null;
  /** The value that was sent. */
  sent: Observation | null;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
  replay_of: string | null;
  /** Set on a withdrawal: the sent notification it replaced because that one stopped holding. */
  withdraws?: string | null;
  dedup_day: string;
  attempts: { attempt: number; at: string; outcome: string }[];
}

export interface NotificationPage {
  items: Notification[];
  next_cursor: string | null;
  kept_from: string | null;
}

/** What the service worker receives in a push (and shows). */
export interface PushPayload {
  /** The notification's outbox row. */
  id?: string;
  title: string;
  body: string;
  /** Its watch and trigger: a newer notification of them (or the same one twice) replaces it. */
  tag?: string;
  /** When the value it states was observed (its re-check). */
  observed_at?: string;
  /** Until when it may be shown as current. */
  valid_until?: string;
  url?: string;
  icon?: string;
  data: { item: string; trigger: string; price: number; currency: string; in_stock: boolean };
}

export type ErrorCode = 'http' | 'network' | 'unregistered' | 'unsupported' | 'permission' | 'subscribe' | 'worker';

export class TidingsError extends Error {
  status: number;
  /** The api's RFC 9457 problem document, when it sent one. */
  problem: { type: string; title: string; status: number; detail: string; errors?: { pointer: string; detail: string }[] } | null;
  /** Seconds to wait before trying again (429, 503). */
  retryAfter: number | null;
  code: ErrorCode;
}

export interface Explained {
  state: 'sent' | 'withheld' | 'not_delivered' | 'maybe_sent' | 'in_progress';
  text: string;
}

export function explain(n: Notification): Explained;
export function describeTrigger(t: Trigger, currency?: string): string;
export function money(minor: number, currency?: string, locale?: string): string;
export function minorUnits(currency: string): number;
export function fromBase64Url(text: string): Uint8Array;
export function openStore(): Promise<IDBDatabase>;

export class Tidings {
  constructor(options?: { api?: string; serviceWorker?: string; scope?: string });
  readonly api: string;
  static supported(): boolean;
  device(): Promise<Device | null>;
  /** `locale` (default `navigator.language`) is the language and number format of its notifications. */
  enable(options?: { timeZone?: string; locale?: string }): Promise<Device>;
  watch(itemCode: string, triggers: Trigger[], options?: { idempotencyKey?: string }): Promise<Watch>;
  watches(): Promise<Watch[]>;
  unwatch(id: string): Promise<void>;
  pause(id: string, paused?: boolean): Promise<Watch>;
  preferences(): Promise<Preferences>;
  /** Held notifications are judged again by the new preferences at once. */
  setPreferences(preferences: Preferences): Promise<Preferences>;
  history(options?: { status?: Notification['status']; cursor?: string; limit?: number }): Promise<NotificationPage>;
  forget(): Promise<void>;
}
