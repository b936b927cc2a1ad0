// The demo page: one browser, its watches and what happened to each notification, using
// tidings.js against the api that serves this page.
import { Tidings, TidingsError, explain, describeTrigger } from './tidings.js';

const tidings = new Tidings({ serviceWorker: 'sw.js' });
const $ = (id) => document.getElementById(id);

function showError(e) {
  const box = $('error');
  box.hidden = !e;
  box.textContent = e ? (e instanceof TidingsError ? e.message : String(e)) : '';
}

function item(cls, parts) {
  const li = document.createElement('li');
  if (cls) li.className = cls;
  for (const p of parts) li.append(p);
  return li;
}

function span(cls, text) {
  const s = document.createElement('span');
  s.className = cls;
  s.textContent = text;
  return s;
}

function button(text, onClick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = text;
  b.addEventListener('click', () => onClick().catch(showError));
  return b;
}

async function render() {
  const device = Tidings.supported() ? await tidings.device() : null;
  const registered = Boolean(device);
  $('status').textContent = !Tidings.supported()
    ? 'This browser cannot receive Web Push.'
    : registered
      ? `Notifications are on for this browser (device ${device.deviceId}).`
      : 'Notifications are off for this browser.';
  $('enable').hidden = registered || !Tidings.supported();
  $('forget').hidden = !registered;
  for (const id of ['watch', 'watches', 'history']) $(id).hidden = !registered;
  if (!registered) return;
  const [watches, history] = await Promise.all([tidings.watches(), tidings.history()]);
  $('watch-list').replaceChildren(
    ...watches.map((w) =>
      item(w.paused ? 'paused' : '', [
        span('item', w.item_code),
        ` — ${w.triggers.map((t) => describeTrigger(t)).join(', ')}${w.paused ? ' (paused)' : ''}`,
        button('Remove', async () => {
          await tidings.unwatch(w.id);
          await render();
        }),
      ]),
    ),
  );
  $('history-list').replaceChildren(
    ...history.items.map((n) => {
      const { state, text } = explain(n);
      const li = item(state, [
        span('state', text),
        ` ${n.item_code || 'a removed watch'}${n.trigger ? ` (${describeTrigger(n.trigger, n.detected.currency)})` : ''} `,
        span('when', new Date(n.detected.at).toLocaleString()),
      ]);
      li.dataset.id = n.id;
      li.dataset.state = state;
      return li;
    }),
  );
}

$('enable').addEventListener('click', async () => {
  showError(null);
  try {
    await tidings.enable();
  } catch (e) {
    showError(e);
  }
  await render().catch(showError);
});

$('forget').addEventListener('click', async () => {
  showError(null);
  await tidings.forget().catch(showError);
  await render().catch(showError);
});

$('refresh').addEventListener('click', () => render().catch(showError));

const form = $('watch-form');
form.kind.addEventListener('change', () => {
  $('amount-label').hidden = form.kind.value === 'back_in_stock';
  form.amount.step = form.kind.value === 'price_drop' ? '1' : '0.01';
  form.amount.value = form.kind.value === 'price_drop' ? '10' : '10.00';
});
form.addEventListener('submit', async (event) => {
  event.preventDefault();
  showError(null);
  const kind = form.kind.value;
  const amount = Number(form.amount.value);
  const trigger =
    kind === 'price_below'
      ? { kind, threshold: Math.round(amount * 100) }
      : kind === 'price_drop'
        ? { kind, percent: Math.round(amount) }
        : { kind };
  try {
    await tidings.watch(form.code.value.trim(), [trigger]);
    form.code.value = '';
  } catch (e) {
    showError(e);
  }
  await render().catch(showError);
});

// A push arrived (the service worker says so): its row is in the history now.
navigator.serviceWorker?.addEventListener('message', (event) => {
  if (event.data && event.data.type === 'tidings:push') render().catch(showError);
});
setInterval(() => {
  if (document.visibilityState === 'visible') render().catch(showError);
}, 5000);
render().catch(showError);
