//! What one watch's triggers say about one observation. Pure: the scan gathers the inputs.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use std::collections::HashMap;
use tidings_domain::dedup::dedup_day;
use tidings_domain::messages::{EnqueueRequest, VERSION};
use tidings_domain::trigger::{Baseline, LastSent, Observation, Trigger, Verdict, evaluate};
use tidings_domain::withdrawal;
use tidings_domain::{Channel, DeviceId, WatchId};

/// A watch as the scan reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Watch {
    pub id: WatchId,
    pub device_id: DeviceId,
    pub triggers: Vec<Trigger>,
    pub channel: Channel,
    pub reference_price: Option<i64>,
    pub time_zone: Tz,
    /// The item's stock state at this watch's previous scan.
    pub last_in_stock: Option<bool>,
    /// Whether its sent notifications are withdrawn when they stop holding.
    pub withdraw: bool,
}

/// The EnqueueRequests for every trigger of `watch` that holds for `observation` at `now`, and
/// a withdrawal for each sent notification of the watch that stopped holding while current
/// (when the watch has them on). `last_sent` maps trigger keys to the value last sent for this
/// watch.
pub fn detect(
    watch: &Watch,
    observation: &Observation,
    last_sent: &HashMap<String, LastSent>,
    now: DateTime<Utc>,
) -> Vec<EnqueueRequest> {
    let request = |trigger: &Trigger, baseline, dedup_day, withdraws| EnqueueRequest {
        v: VERSION,
        watch_id: watch.id,
        device_id: watch.device_id,
        trigger: trigger.clone(),
        channel: watch.channel,
        detected_at: now,
        detected: observation.clone(),
        baseline,
        dedup_day,
        withdraws,
        traceparent: None,
    };
    let mut found = Vec::new();
    for trigger in &watch.triggers {
        let sent = last_sent.get(&trigger.key());
        let baseline = Baseline::for_detection(sent, watch.reference_price, watch.last_in_stock);
        if evaluate(trigger, observation, &baseline) == Verdict::Holds {
            found.push(request(
                trigger,
                baseline,
                dedup_day(now, watch.time_zone),
                None,
            ));
        }
        let promise = sent.and_then(|s| s.promise).filter(|_| watch.withdraw);
        if let Some(p) = promise
            && withdrawal::ended(trigger, &p, observation, now).is_some()
        {
            found.push(request(
                trigger,
                p.decided_on,
                p.dedup_day,
                Some(p.outbox_id),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use tidings_domain::OutboxId;
    use tidings_domain::withdrawal::Promise;

    fn watch(triggers: Vec<Trigger>, last_in_stock: Option<bool>) -> Watch {
        Watch {
            id: WatchId::new(),
            device_id: DeviceId::new(),
            triggers,
            channel: Channel::WebPush,
            reference_price: Some(1000),
            time_zone: Tz::Europe__Berlin,
            last_in_stock,
            withdraw: true,
        }
    }

    fn obs(price: i64, in_stock: bool) -> Observation {
        Observation {
            in_stock,
            ..Observation::on_sale(price, "EUR", Utc::now())
        }
    }

    #[test]
    fn each_holding_trigger_is_one_request_in_the_devices_day() {
        let w = watch(
            vec![
                Trigger::PriceBelow { threshold: 950 },
                Trigger::PriceDrop { percent: 10 },
                Trigger::BackInStock,
            ],
            Some(true),
        );
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 23, 30, 0).unwrap();
        let got = detect(&w, &obs(900, true), &HashMap::new(), now);
        let keys: Vec<String> = got.iter().map(|r| r.trigger.key()).collect();
        assert_eq!(
            keys,
            ["price_below:950", "price_drop:10"],
            "back_in_stock needs an out→in change"
        );
        assert_eq!(
            got[0].dedup_day.to_string(),
            "2026-12-01",
            "Berlin is already on the 1st"
        );
        assert_eq!(
            got[1].baseline.reference,
            Some(1000),
            "price_drop compares with the reference"
        );
        assert_eq!(got[1].baseline.price, None, "nothing was sent yet");
    }

    #[test]
    fn a_sent_value_becomes_the_baseline() {
        let w = watch(vec![Trigger::PriceDrop { percent: 10 }], None);
        let sent = HashMap::from([(
            "price_drop:10".to_owned(),
            LastSent {
                price: 900,
                in_stock: true,
                sent_at: Utc::now(),
                promise: None,
            },
        )]);
        assert!(detect(&w, &obs(850, true), &sent, Utc::now()).is_empty());
        assert_eq!(detect(&w, &obs(810, true), &sent, Utc::now()).len(), 1);
    }

    #[test]
    fn back_in_stock_fires_on_the_transition_only() {
        // (last stock the watch saw, stock now, fires)
        let cases = [
            (Some(false), true, true),
            (Some(true), true, false),
            (None, true, false),
            (Some(false), false, false),
        ];
        for (last, now, fires) in cases {
            let w = watch(vec![Trigger::BackInStock], last);
            let found = detect(&w, &obs(1, now), &HashMap::new(), Utc::now());
            assert_eq!(found.len(), usize::from(fires), "{last:?} -> {now}");
        }
    }

    /// A sent notification is withdrawn once, while current, when its trigger stops holding
    /// against the baseline it was decided on; not when the watch turned withdrawals off.
    #[test]
    fn a_sent_notification_that_stopped_holding_is_withdrawn_on_its_day() {
        let detected = Utc.with_ymd_and_hms(2026, 12, 3, 9, 0, 0).unwrap();
        let mut w = watch(vec![Trigger::PriceBelow { threshold: 1200 }], Some(true));
        let promise = Promise {
            outbox_id: OutboxId::new(),
            dedup_day: detected.date_naive(),
            observed_at: detected,
            valid_until: detected + chrono::Duration::minutes(20),
            decided_on: Baseline::default(),
        };
        let sent = HashMap::from([(
            "price_below:1200".to_owned(),
            LastSent {
                price: 999,
                in_stock: true,
                sent_at: detected,
                promise: Some(promise),
            },
        )]);
        let soon = detected + chrono::Duration::minutes(5);
        let got = detect(&w, &obs(1500, true), &sent, soon);
        assert_eq!(got.len(), 1);
        let r = &got[0];
        assert_eq!(r.withdraws, Some(promise.outbox_id));
        assert_eq!(r.dedup_day, promise.dedup_day, "the withdrawn row's day");
        assert_eq!(r.baseline, promise.decided_on);
        assert_eq!(r.dedup_key().trigger, "withdraw:price_below:1200");
        // Still below the limit: nothing to withdraw (and 9.99 is not news: it was sent).
        assert!(detect(&w, &obs(999, true), &sent, soon).is_empty());
        // Past valid_until, or with withdrawals off: nothing.
        let late = promise.valid_until;
        assert!(detect(&w, &obs(1500, true), &sent, late).is_empty());
        w.withdraw = false;
        assert!(detect(&w, &obs(1500, true), &sent, soon).is_empty());
    }
}
