//! This shard's active watches and the baselines of their triggers, kept in memory between scans.
//!
//! The first scan reads them all; every later scan reads only the rows written since the previous
//! read (migration 0005 marks each row with the transaction that wrote it), so a scan's database
//! work follows what changed, not how many watches there are. And a watch is evaluated again only
//! when its item's observation, the watch or one of its baselines has changed since an evaluation
//! that found nothing to do: `evaluate` is pure, so the answer would be the same. An item whose last
//! evaluation left something to do (a failed publish, a stock state or reference price to record)
//! is evaluated every scan. Triggers that held and were enqueued leave the item settled until
//! their dedup day is over: then a condition that still holds is enqueued again (a new dedup key).

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use sqlx::PgPool;
use std::collections::{BTreeMap, HashMap};
use tidings_domain::dedup::{dedup_day, parse_time_zone};
use tidings_domain::trigger::{LastSent, Observation};
use tidings_domain::{Channel, ItemCode, WatchId};
use tidings_store::baselines::BaselineRow;
use tidings_store::scan::{ScannedWatch, Shard, Snapshot};

use crate::config::Settings;
use crate::evaluate::Watch;

/// A watch and what was last sent for each of its triggers (by trigger key).
#[derive(Clone, Debug)]
pub struct Entry {
    pub watch: Watch,
    pub last_sent: HashMap<String, LastSent>,
    /// The watch or one of its baselines changed since the item was last evaluated.
    changed: bool,
}

/// The parts of an observation `evaluate` reads (not when it was observed).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Value {
    price: i64,
    currency: String,
    in_stock: bool,
    paused: bool,
}

impl From<&Observation> for Value {
    fn from(o: &Observation) -> Self {
        Value {
            price: o.price,
            currency: o.currency.clone(),
            in_stock: o.in_stock,
            paused: o.paused,
        }
    }
}

impl Value {
    /// Compared every scan for every item, so without building a `Value`.
    fn is(&self, o: &Observation) -> bool {
        self.price == o.price
            && self.in_stock == o.in_stock
            && self.paused == o.paused
            && self.currency == o.currency
    }
}

/// Why an item needs no evaluation at its current value.
#[derive(Debug)]
struct Settled {
    value: Value,
    /// The triggers that held at that value were all enqueued, for these (time zone, dedup day)
    /// pairs: the item stays settled until one of those days is over, when a trigger that still
    /// holds is due again (a new dedup key)…
    enqueued_for: Vec<(Tz, NaiveDate)>,
    /// … or until this time, when a trigger that still holds is published again in case
    /// JetStream lost it (none when nothing held).
    republish_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Default)]
pub struct Item {
    pub watches: BTreeMap<WatchId, Entry>,
    /// Set when the last evaluation left nothing to do: then, at the same value and dedup days,
    /// only watches that changed since need evaluating.
    settled: Option<Settled>,
    /// Some watch is marked `changed`.
    changed: bool,
}

#[derive(Debug, Default)]
pub struct Watchlist {
    items: BTreeMap<ItemCode, Item>,
    item_of: HashMap<WatchId, ItemCode>,
    /// `pg_snapshot_xmin` of the last read: every transaction below it had finished then, so
    /// the next read asks only for rows marked with this id or a later one.
    read_below: Option<String>,
}

/// What one refresh read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refreshed {
    pub watches: usize,
    pub baselines: usize,
}

impl Watchlist {
    pub fn new() -> Self {
        Self::default()
    }

    /// Active watches held.
    pub fn len(&self) -> usize {
        self.item_of.len()
    }

    /// Items in code order, each with its number of watches.
    pub fn items(&self) -> impl Iterator<Item = (&ItemCode, usize)> {
        self.items.iter().map(|(c, i)| (c, i.watches.len()))
    }

    #[cfg(test)]
    pub fn item(&self, code: &ItemCode) -> Option<&Item> {
        self.items.get(code)
    }

    /// The watched items a change to `code` touches: `code` itself, and each offer of it that
    /// a watch names (`<code>::sku:…`, the schema.org format's selectors).
    pub fn touched<'a>(&'a self, code: &'a ItemCode) -> impl Iterator<Item = &'a ItemCode> + 'a {
        let offers = format!("{code}{}", tidings_source::schema_org::SELECTOR_MARK);
        let exact = self.items.get_key_value(code).map(|(c, _)| c);
        let under = ItemCode::parse(&offers)
            .ok()
            .into_iter()
            .flat_map(move |from| {
                let offers = offers.clone();
                self.items
                    .range(from..)
                    .map(|(c, _)| c)
                    .take_while(move |c| c.as_str().starts_with(&offers))
            });
        exact.into_iter().chain(under)
    }

    /// Adds or replaces an active watch, to be evaluated at the next scan unless the row is
    /// exactly what this list holds (a read may return a row again: see `refresh`). Returns
    /// whether the watch is new here (its baselines are then still to be read).
    pub fn upsert(&mut self, code: ItemCode, watch: Watch) -> bool {
        let id = watch.id;
        let mut last_sent = HashMap::new();
        let new = match self.item_of.get(&id) {
            None => true,
            Some(old) => {
                if *old == code
                    && self
                        .items
                        .get(&code)
                        .and_then(|i| i.watches.get(&id))
                        .is_some_and(|e| e.watch == watch)
                {
                    return false;
                }
                if let Some(entry) = self.detach(id, &old.clone()) {
                    last_sent = entry.last_sent;
                }
                false
            }
        };
        let item = self.items.entry(code.clone()).or_default();
        item.changed = true;
        item.watches.insert(
            id,
            Entry {
                watch,
                last_sent,
                changed: true,
            },
        );
        self.item_of.insert(id, code);
        new
    }

    /// Forgets a watch that was removed or paused (or whose device was removed).
    pub fn remove(&mut self, id: WatchId) {
        if let Some(code) = self.item_of.remove(&id) {
            self.detach(id, &code);
        }
    }

    fn detach(&mut self, id: WatchId, code: &ItemCode) -> Option<Entry> {
        let item = self.items.get_mut(code)?;
        // A watch leaving an item cannot make its other watches' triggers hold: the item stays
        // as settled as it was.
        let entry = item.watches.remove(&id);
        if item.watches.is_empty() {
            self.items.remove(code);
        }
        entry
    }

    /// Records a baseline row; ignored for a watch this list does not hold, and a change only if
    /// it differs from the one held.
    pub fn set_baseline(&mut self, id: WatchId, trigger: String, last: LastSent) {
        let Some(item) = self.item_of.get(&id).and_then(|c| self.items.get_mut(c)) else {
            return;
        };
        let Some(entry) = item.watches.get_mut(&id) else {
            return;
        };
        if entry.last_sent.get(&trigger) != Some(&last) {
            entry.last_sent.insert(trigger, last);
            entry.changed = true;
            item.changed = true;
        }
    }

    pub fn set_last_in_stock(&mut self, id: WatchId, in_stock: bool) {
        if let Some(entry) = self.entry_mut(id) {
            entry.watch.last_in_stock = Some(in_stock);
        }
    }

    pub fn set_reference_price(&mut self, id: WatchId, price: i64) {
        if let Some(entry) = self.entry_mut(id)
            && entry.watch.reference_price.is_none()
        {
            entry.watch.reference_price = Some(price);
        }
    }

    fn entry_mut(&mut self, id: WatchId) -> Option<&mut Entry> {
        let item = self.items.get_mut(self.item_of.get(&id)?)?;
        item.changed = true;
        let entry = item.watches.get_mut(&id)?;
        entry.changed = true;
        Some(entry)
    }

    /// The watches of `code` a scan must evaluate against `observation` at `now`: all of them,
    /// unless an evaluation against the same value left nothing to do (or only enqueued
    /// triggers whose dedup day is not over); then only those that changed since (usually none).
    pub fn to_evaluate(
        &self,
        code: &ItemCode,
        observation: &Observation,
        now: DateTime<Utc>,
    ) -> Vec<&Entry> {
        let Some(item) = self.items.get(code) else {
            return Vec::new();
        };
        let all = item.settled.as_ref().is_none_or(|s| {
            !s.value.is(observation)
                || s.republish_at.is_some_and(|at| now >= at)
                || s.enqueued_for
                    .iter()
                    .any(|(tz, day)| dedup_day(now, *tz) != *day)
        });
        if !all && !item.changed {
            return Vec::new();
        }
        item.watches.values().filter(|e| all || e.changed).collect()
    }

    /// Records that `to_evaluate(code, observation, …)` was evaluated. `done` is `None` when
    /// something is left to do (a publish that failed, a state to record), else the (time
    /// zone, dedup day) of each holding trigger, all of them enqueued (empty: none held); those
    /// are published again from `republish_at` if they still hold.
    pub fn evaluated(
        &mut self,
        code: &ItemCode,
        observation: &Observation,
        done: Option<Vec<(Tz, NaiveDate)>>,
        republish_at: DateTime<Utc>,
    ) {
        if let Some(item) = self.items.get_mut(code) {
            item.settled = done.map(|mut enqueued_for| {
                enqueued_for.sort_by_key(|(tz, day)| (tz.name(), *day));
                enqueued_for.dedup();
                Settled {
                    value: Value::from(observation),
                    republish_at: (!enqueued_for.is_empty()).then_some(republish_at),
                    enqueued_for,
                }
            });
            if item.changed {
                item.changed = false;
                for e in item.watches.values_mut() {
                    e.changed = false;
                }
            }
        }
    }

    /// Brings the list up to date with the database in one repeatable-read snapshot: every
    /// active watch of this shard on the first call, the rows written since the previous read
    /// afterwards.
    pub async fn refresh(
        &mut self,
        pool: &PgPool,
        settings: &Settings,
    ) -> Result<Refreshed, sqlx::Error> {
        let mut snapshot = Snapshot::begin(pool).await?;
        let shard = Shard {
            // Checked at start: 0 < index < count; a count past `i32` would be refused by no real deployment, and Postgres takes the shard as `int`.
            count: i32::try_from(settings.shard_count).unwrap_or(1),
            index: i32::try_from(settings.shard_index).unwrap_or(0),
        };
        let refreshed = match self.read_below.take() {
            None => {
                *self = Watchlist::new();
                self.read_all(&mut snapshot, shard, settings.page_size)
                    .await?
            }
            Some(since) => match self.read_changes(&mut snapshot, shard, &since).await {
                Ok(r) => r,
                Err(e) => {
                    // Part of the changes may be applied; the next read starts from the same
                    // point, and applying a row twice is harmless.
                    self.read_below = Some(since);
                    return Err(e);
                }
            },
        };
        let read_below = snapshot.read_below.clone();
        snapshot.commit().await?;
        self.read_below = Some(read_below);
        Ok(refreshed)
    }

    async fn read_all(
        &mut self,
        snapshot: &mut Snapshot,
        shard: Shard,
        page_size: i64,
    ) -> Result<Refreshed, sqlx::Error> {
        let mut refreshed = Refreshed::default();
        let mut after = (String::new(), WatchId(sqlx::types::Uuid::nil()));
        loop {
            let page = snapshot
                .active_after(shard, (&after.0, after.1), page_size)
                .await?;
            let Some(last) = page.last() else { break };
            after = (last.item_code.clone(), last.id);
            let full_page = page.len() as i64 >= page_size;
            let ids: Vec<WatchId> = page.iter().map(|w| w.id).collect();
            refreshed.watches += page.len();
            for row in page {
                self.apply(row);
            }
            refreshed.baselines += self.set_baselines(snapshot.baselines_of(&ids).await?);
            if !full_page {
                break;
            }
        }
        Ok(refreshed)
    }

    async fn read_changes(
        &mut self,
        snapshot: &mut Snapshot,
        shard: Shard,
        since: &str,
    ) -> Result<Refreshed, sqlx::Error> {
        let changed = snapshot.watches_changed(shard, since).await?;
        let mut refreshed = Refreshed {
            watches: changed.len(),
            ..Refreshed::default()
        };
        let new: Vec<WatchId> = changed
            .into_iter()
            .filter_map(|row| {
                let id = row.id;
                self.apply(row).then_some(id)
            })
            .collect();
        if !new.is_empty() {
            refreshed.baselines += self.set_baselines(snapshot.baselines_of(&new).await?);
        }
        refreshed.baselines += self.set_baselines(snapshot.baselines_changed(since).await?);
        Ok(refreshed)
    }

    /// Holds `rows` as the baselines they are; returns how many.
    fn set_baselines(&mut self, rows: Vec<BaselineRow>) -> usize {
        let n = rows.len();
        for b in rows {
            let last = b.last_sent();
            self.set_baseline(b.watch_id, b.trigger, last);
        }
        n
    }

    /// Applies one watch row; returns whether it added a watch this list did not hold.
    fn apply(&mut self, row: ScannedWatch) -> bool {
        if !row.active {
            self.remove(row.id);
            return false;
        }
        let code = match ItemCode::parse(&row.item_code) {
            Ok(code) => code,
            Err(e) => {
                tracing::warn!(watch_id = %row.id, error = %e, "watch skipped: its item code cannot be fetched");
                self.remove(row.id);
                return false;
            }
        };
        // A channel this build does not know is not delivered here: never read it as another.
        let channel = match row.channel.parse::<Channel>() {
            Ok(channel) => channel,
            Err(e) => {
                tracing::warn!(watch_id = %row.id, error = %e, "watch skipped: its channel is unknown to this build");
                self.remove(row.id);
                return false;
            }
        };
        let watch = Watch {
            id: row.id,
            device_id: row.device_id,
            time_zone: parse_time_zone(&row.time_zone).unwrap_or_else(|e| {
                tracing::warn!(watch_id = %row.id, error = %e, "device time zone unusable; using UTC");
                chrono_tz::Tz::UTC
            }),
            triggers: row.triggers.0,
            channel,
            reference_price: row.reference_price,
            last_in_stock: row.last_in_stock,
            // A mail cannot be taken back, and a correction mail is noise: the page its link
            // opens says when it has ended (docs/design.md, *True on the screen*).
            withdraw: row.withdraw && channel != Channel::Email,
        };
        self.upsert(code, watch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_to_a_page_touches_the_page_and_each_of_its_offers_watched() {
        let mut list = Watchlist::new();
        for item in [
            "page:tee",
            "page:tee::sku:A",
            "page:tee::sku:B",
            "page:tee2",
            "page:te",
        ] {
            list.upsert(ItemCode::parse(item).unwrap(), watch(WatchId::new()));
        }
        let touched = |code: &str| -> Vec<String> {
            list.touched(&ItemCode::parse(code).unwrap())
                .map(|c| c.to_string())
                .collect()
        };
        assert_eq!(
            touched("page:tee"),
            ["page:tee", "page:tee::sku:A", "page:tee::sku:B"]
        );
        assert_eq!(touched("page:tee2"), ["page:tee2"]);
        assert!(touched("page:other").is_empty());
    }
    use chrono::TimeZone;
    use sqlx::types::Json;
    use tidings_domain::DeviceId;
    use tidings_domain::trigger::Trigger;

    fn at(hour: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, hour, 0, 0).unwrap()
    }

    fn watch(id: WatchId) -> Watch {
        Watch {
            id,
            device_id: DeviceId::new(),
            triggers: vec![Trigger::PriceBelow { threshold: 1000 }],
            channel: Channel::WebPush,
            reference_price: None,
            time_zone: chrono_tz::Tz::UTC,
            last_in_stock: None,
            withdraw: true,
        }
    }

    fn row(id: WatchId, channel: &str) -> ScannedWatch {
        ScannedWatch {
            id,
            device_id: DeviceId::new(),
            item_code: "SKU-1".into(),
            triggers: Json(vec![Trigger::PriceBelow { threshold: 1000 }]),
            channel: channel.into(),
            reference_price: None,
            time_zone: "UTC".into(),
            last_in_stock: None,
            withdraw: true,
            active: true,
        }
    }

    /// Regression: an unknown channel was read as Web Push; now the watch is left out.
    #[test]
    fn a_watch_on_a_channel_this_build_does_not_know_is_skipped_not_sent_as_web_push() {
        let mut l = Watchlist::new();
        assert!(l.apply(row(WatchId::new(), "web_push")));
        assert!(!l.apply(row(WatchId::new(), "carrier_pigeon")));
        assert_eq!(l.len(), 1);
    }

    fn code(s: &str) -> ItemCode {
        ItemCode::parse(s).unwrap()
    }

    fn obs(price: i64) -> Observation {
        let at = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        Observation::on_sale(price, "EUR", at)
    }

    fn sent(price: i64) -> LastSent {
        LastSent {
            price,
            in_stock: true,
            sent_at: Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap(),
            promise: None,
        }
    }

    /// How many of `item`'s watches are due at `price`, `hour`:00 UTC.
    fn due_at(l: &Watchlist, item: &str, price: i64, hour: u32) -> usize {
        l.to_evaluate(&code(item), &obs(price), at(hour)).len()
    }

    fn evaluating(l: &Watchlist, item: &str, price: i64) -> Vec<WatchId> {
        l.to_evaluate(&code(item), &obs(price), at(12))
            .iter()
            .map(|e| e.watch.id)
            .collect()
    }

    #[test]
    fn a_quiet_item_is_evaluated_again_only_where_something_it_reads_changed() {
        let mut l = Watchlist::new();
        let (a, b) = (WatchId::new(), WatchId::new());
        assert!(l.upsert(code("A"), watch(a)));
        assert!(l.upsert(code("A"), watch(b)));
        let mut both = vec![a, b];
        both.sort();
        assert_eq!(evaluating(&l, "A", 1200), both, "never evaluated");
        l.evaluated(&code("A"), &obs(1200), Some(vec![]), at(23));
        assert_eq!(evaluating(&l, "A", 1200), []);

        let mut later = obs(1200);
        later.observed_at += chrono::Duration::seconds(5);
        assert!(
            l.to_evaluate(&code("A"), &later, at(12)).is_empty(),
            "only the time of the observation moved"
        );
        assert_eq!(evaluating(&l, "A", 1199), both, "the price moved");
        let mut out = obs(1200);
        out.in_stock = false;
        assert_eq!(
            l.to_evaluate(&code("A"), &out, at(12)).len(),
            2,
            "the stock moved"
        );

        l.set_baseline(a, "price_below:1000".into(), sent(900));
        assert_eq!(evaluating(&l, "A", 1200), [a], "a's baseline moved");
        l.evaluated(&code("A"), &obs(1200), Some(vec![]), at(23));
        assert!(
            !l.upsert(code("A"), watch(b)),
            "a changed row, not a new watch"
        );
        assert_eq!(evaluating(&l, "A", 1200), [b], "b changed");
        assert_eq!(
            evaluating(&l, "A", 1100),
            both,
            "b changed and the price moved"
        );
        l.evaluated(&code("A"), &obs(1200), Some(vec![]), at(23));
        assert!(!l.upsert(code("A"), watch(a)));
        assert_eq!(
            l.item(&code("A")).unwrap().watches[&a].last_sent["price_below:1000"],
            sent(900),
            "a changed watch row keeps its baselines"
        );
        l.evaluated(&code("A"), &obs(1200), Some(vec![]), at(23));
        let c = WatchId::new();
        assert!(l.upsert(code("A"), watch(c)));
        assert_eq!(evaluating(&l, "A", 1200), [c], "c was added");
        l.evaluated(&code("A"), &obs(1200), Some(vec![]), at(23));
        l.remove(c);
        assert_eq!(
            evaluating(&l, "A", 1200),
            [],
            "a removal needs no evaluation"
        );
    }

    #[test]
    fn a_row_read_again_unchanged_changes_nothing() {
        let mut l = Watchlist::new();
        let a = WatchId::new();
        let w = watch(a);
        l.upsert(code("A"), w.clone());
        l.set_baseline(a, "price_below:1000".into(), sent(900));
        l.evaluated(&code("A"), &obs(1200), Some(vec![]), at(23));
        assert!(!l.upsert(code("A"), w.clone()));
        l.set_baseline(a, "price_below:1000".into(), sent(900));
        assert_eq!(evaluating(&l, "A", 1200), [], "the same rows again");
        let mut paused_then_resumed = w;
        paused_then_resumed.reference_price = Some(1);
        l.upsert(code("A"), paused_then_resumed);
        assert_eq!(evaluating(&l, "A", 1200), [a], "a field changed");
    }

    #[test]
    fn an_item_with_something_left_to_do_is_evaluated_every_scan() {
        let mut l = Watchlist::new();
        l.upsert(code("A"), watch(WatchId::new()));
        l.upsert(code("A"), watch(WatchId::new()));
        l.evaluated(&code("A"), &obs(900), None, at(23));
        assert_eq!(evaluating(&l, "A", 900).len(), 2);
    }

    #[test]
    fn enqueued_triggers_settle_their_item_until_their_dedup_day_is_over() {
        let mut l = Watchlist::new();
        l.upsert(code("A"), watch(WatchId::new()));
        let tokyo = chrono_tz::Tz::Asia__Tokyo;
        let berlin = chrono_tz::Tz::Europe__Berlin;
        // Enqueued at 12:00 UTC: 21:00 in Tokyo, 13:00 in Berlin, both on Nov 30.
        let day = NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
        l.evaluated(
            &code("A"),
            &obs(900),
            Some(vec![(tokyo, day), (berlin, day), (tokyo, day)]),
            at(20),
        );
        let due = |hour| l.to_evaluate(&code("A"), &obs(900), at(hour)).len();
        assert_eq!(due(12), 0, "enqueued today: nothing to do");
        assert_eq!(due(14), 0, "23:00 in Tokyo");
        assert_eq!(due(15), 1, "midnight in Tokyo: a new dedup day there");
        assert_eq!(due_at(&l, "A", 950, 12), 1, "the value moved");
    }

    #[test]
    fn enqueued_triggers_are_due_again_at_the_republish_time() {
        let mut l = Watchlist::new();
        l.upsert(code("A"), watch(WatchId::new()));
        let day = NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
        l.evaluated(
            &code("A"),
            &obs(900),
            Some(vec![(chrono_tz::Tz::UTC, day)]),
            at(13),
        );
        assert_eq!(evaluating(&l, "A", 900).len(), 0, "12:00: trusted");
        assert_eq!(
            due_at(&l, "A", 900, 13),
            1,
            "13:00: published again if it still holds, in case JetStream lost it"
        );
        l.evaluated(&code("A"), &obs(1200), Some(vec![]), at(13));
        assert_eq!(
            due_at(&l, "A", 1200, 14),
            0,
            "nothing held: nothing to publish again"
        );
    }

    #[test]
    fn items_follow_their_watches() {
        let mut l = Watchlist::new();
        let (a, b) = (WatchId::new(), WatchId::new());
        l.upsert(code("A"), watch(a));
        l.upsert(code("A"), watch(b));
        l.upsert(code("B"), watch(b));
        let items: Vec<(String, usize)> = l.items().map(|(c, n)| (c.to_string(), n)).collect();
        assert_eq!(items, [("A".to_string(), 1), ("B".to_string(), 1)]);
        l.remove(a);
        l.remove(a);
        assert_eq!(l.len(), 1);
        assert!(
            l.item(&code("A")).is_none(),
            "an item without watches is dropped"
        );
        assert_eq!(
            evaluating(&l, "A", 900),
            [],
            "nothing to evaluate for an item no watch names"
        );
        l.set_baseline(a, "price_below:1000".into(), sent(900));
        assert_eq!(l.len(), 1, "a baseline of a watch not held is ignored");
    }
}
