//! The pre-send decision for one claimed row: pre-guards, then the re-fetched value against the
//! trigger. Pure: the dispatch loop gathers the inputs and writes the outcome.

use chrono::{DateTime, Utc};
use tidings_domain::outbox::DropReason;
use tidings_domain::trigger::{
    Baseline, LastSent, LostReason, Observation, SourceErrorKind, Verdict,
};
use tidings_domain::{OutboxId, SubscriptionId, Trigger, evaluate};
use tidings_source::Fetched;

use tidings_store::claim::{Destination, WatchState};

/// Checks that need no source call. `None` means the watch no longer exists at all.
pub fn pre_guard(watch: Option<&WatchState>) -> Result<(SubscriptionId, &Destination), DropReason> {
    let w = watch.ok_or(DropReason::WatchRemoved)?;
    if w.removed {
        return Err(DropReason::WatchRemoved);
    }
    if w.paused {
        return Err(DropReason::WatchPaused);
    }
    if w.device_paused {
        return Err(DropReason::DevicePaused);
    }
    w.subscription
        .as_ref()
        .map(|(id, s)| (*id, s))
        .ok_or(DropReason::SubscriptionInactive)
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Correctly withheld; `checked` is the value that made us withhold, when there was one.
    Withhold {
        reason: DropReason,
        checked: Option<Observation>,
    },
    /// The source could not answer now; try later.
    Transient { error: String },
    /// Still true: send, built from `observation`, compared against `baseline`.
    Send {
        observation: Observation,
        baseline: Baseline,
    },
}

/// Re-checks a withdrawal of the sent row `withdraws` on the value fetched right now: it goes
/// out while that row's `trigger` still does not hold against the baseline the row was decided
/// on (`decided_on`, which the withdrawal carries as its own), and only while that row is the
/// last one sent for its watch and trigger (`last_sent`).
pub fn recheck_withdrawal(
    trigger: &Trigger,
    decided_on: &Baseline,
    withdraws: Option<OutboxId>,
    last_sent: Option<&LastSent>,
    fetched: &Fetched,
) -> Decision {
    let still_shown = last_sent
        .and_then(|s| s.promise)
        .is_some_and(|p| Some(p.outbox_id) == withdraws);
    if !still_shown {
        return Decision::Withhold {
            reason: DropReason::Superseded,
            checked: None,
        };
    }
    let observation = match observed(fetched) {
        Ok(o) => o,
        Err(decision) => return decision,
    };
    match evaluate(trigger, observation, decided_on) {
        // Back where the notification said: it is true again, nothing to withdraw.
        Verdict::Holds => Decision::Withhold {
            reason: DropReason::ConditionLost,
            checked: Some(observation.clone()),
        },
        Verdict::Lost(_) => Decision::Send {
            observation: observation.clone(),
            baseline: *decided_on,
        },
    }
}

/// The observation fetched, or what a source error means for the row.
fn observed(fetched: &Fetched) -> Result<&Observation, Decision> {
    fetched.as_ref().map_err(|e| match e.kind {
        SourceErrorKind::NotFound => Decision::Withhold {
            reason: DropReason::NotFound,
            checked: None,
        },
        SourceErrorKind::Empty => Decision::Withhold {
            reason: DropReason::OutOfStock,
            checked: None,
        },
        _ => Decision::Transient {
            error: format!("re-fetch failed: {e}"),
        },
    })
}

/// Re-checks the trigger on the value fetched right now.
pub fn recheck(
    trigger: &Trigger,
    detected_baseline: &Baseline,
    detected_at: DateTime<Utc>,
    last_sent: Option<&LastSent>,
    fetched: &Fetched,
) -> Decision {
    let observation = match observed(fetched) {
        Ok(o) => o,
        Err(decision) => return decision,
    };
    let baseline = Baseline::for_recheck(detected_baseline, last_sent, detected_at);
    match evaluate(trigger, observation, &baseline) {
        Verdict::Holds => Decision::Send {
            observation: observation.clone(),
            baseline,
        },
        Verdict::Lost(lost) => Decision::Withhold {
            reason: match lost {
                LostReason::OutOfStock => DropReason::OutOfStock,
                LostReason::ItemPaused => DropReason::ItemPaused,
                LostReason::ConditionLost => DropReason::ConditionLost,
            },
            checked: Some(observation.clone()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_source::SourceError;

    fn obs(price: i64) -> Observation {
        Observation::on_sale(price, "EUR", Utc::now())
    }

    fn err(kind: SourceErrorKind) -> Fetched {
        Err(SourceError {
            kind,
            detail: "test".into(),
        })
    }

    const T: Trigger = Trigger::PriceBelow { threshold: 1200 };

    #[test]
    fn guards_in_order() {
        let sub = Destination::WebPush(tidings_domain::messages::Subscription {
            endpoint: "https://push.example/1".into(),
            p256dh: "k".into(),
            auth: "a".into(),
        });
        let mut w = WatchState {
            item_code: "A".into(),
            paused: true,
            device_paused: true,
            removed: true,
            subscription: None,
            locale: None,
            time_zone: "UTC".into(),
            urgent: false,
            preferences: Default::default(),
        };
        assert_eq!(pre_guard(None).unwrap_err(), DropReason::WatchRemoved);
        assert_eq!(pre_guard(Some(&w)).unwrap_err(), DropReason::WatchRemoved);
        w.removed = false;
        assert_eq!(pre_guard(Some(&w)).unwrap_err(), DropReason::WatchPaused);
        w.paused = false;
        assert_eq!(pre_guard(Some(&w)).unwrap_err(), DropReason::DevicePaused);
        w.device_paused = false;
        assert_eq!(
            pre_guard(Some(&w)).unwrap_err(),
            DropReason::SubscriptionInactive
        );
        let id = SubscriptionId::new();
        w.subscription = Some((id, sub.clone()));
        assert_eq!(pre_guard(Some(&w)).unwrap(), (id, &sub));
    }

    #[test]
    fn source_errors_classify() {
        let b = Baseline::default();
        let now = Utc::now();
        assert!(matches!(
            recheck(&T, &b, now, None, &err(SourceErrorKind::NotFound)),
            Decision::Withhold {
                reason: DropReason::NotFound,
                ..
            }
        ));
        assert!(matches!(
            recheck(&T, &b, now, None, &err(SourceErrorKind::Empty)),
            Decision::Withhold {
                reason: DropReason::OutOfStock,
                ..
            }
        ));
        for k in [
            SourceErrorKind::RateLimited,
            SourceErrorKind::Unavailable,
            SourceErrorKind::BadData,
        ] {
            assert!(matches!(
                recheck(&T, &b, now, None, &err(k)),
                Decision::Transient { .. }
            ));
        }
    }

    #[test]
    fn a_reverted_price_is_withheld_with_the_value_seen() {
        match recheck(&T, &Baseline::default(), Utc::now(), None, &Ok(obs(1300))) {
            Decision::Withhold {
                reason: DropReason::ConditionLost,
                checked: Some(o),
            } => assert_eq!(o.price, 1300),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_send_after_detection_becomes_the_baseline() {
        let detected_at = Utc::now() - chrono::Duration::minutes(5);
        let sent = LastSent {
            price: 1000,
            in_stock: true,
            sent_at: Utc::now(),
            promise: None,
        };
        // 1100 was news at detection, but 1000 has been announced since.
        assert!(matches!(
            recheck(
                &T,
                &Baseline::default(),
                detected_at,
                Some(&sent),
                &Ok(obs(1100))
            ),
            Decision::Withhold {
                reason: DropReason::ConditionLost,
                ..
            }
        ));
        assert!(matches!(
            recheck(&T, &Baseline::default(), detected_at, None, &Ok(obs(1100))),
            Decision::Send { .. }
        ));
    }

    /// A withdrawal goes out while the sent notification's trigger does not hold against the
    /// baseline it was decided on, and only while that notification is the last one sent.
    #[test]
    fn a_withdrawal_goes_out_only_while_its_notification_is_shown_and_untrue() {
        let id = OutboxId::new();
        let shown = |outbox_id| LastSent {
            price: 999,
            in_stock: true,
            sent_at: Utc::now(),
            promise: Some(tidings_domain::withdrawal::Promise {
                outbox_id,
                dedup_day: Utc::now().date_naive(),
                observed_at: Utc::now(),
                valid_until: Utc::now() + chrono::Duration::minutes(20),
                decided_on: Baseline::default(),
            }),
        };
        let b = Baseline::default();
        let withdraw = |last: &LastSent, price| {
            recheck_withdrawal(&T, &b, Some(id), Some(last), &Ok(obs(price)))
        };
        assert!(matches!(
            withdraw(&shown(id), 1500),
            Decision::Send { observation, .. } if observation.price == 1500
        ));
        // Back below the limit: the notification is true again.
        assert!(matches!(
            withdraw(&shown(id), 999),
            Decision::Withhold {
                reason: DropReason::ConditionLost,
                ..
            }
        ));
        // Another notification replaced it, or a withdrawal was already sent (no promise left).
        let superseded = Decision::Withhold {
            reason: DropReason::Superseded,
            checked: None,
        };
        assert_eq!(withdraw(&shown(OutboxId::new()), 1500), superseded);
        let withdrawn = LastSent {
            promise: None,
            ..shown(id)
        };
        assert_eq!(withdraw(&withdrawn, 1500), superseded);
        assert_eq!(
            recheck_withdrawal(&T, &b, Some(id), None, &Ok(obs(1500))),
            superseded
        );
    }
}
