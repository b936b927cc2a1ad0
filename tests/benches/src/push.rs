//! PushRequests made by a benchmark itself, without a dispatcher.

use chrono::{DateTime, Utc};
use tidings_domain::OutboxId;
use tidings_domain::messages::{Payload, PushRequest, Subscription, Target, Urgency, VERSION};

/// The first attempt of row `id` to the browser `sub`, named (its topic) by its row, so no two
/// replace each other at the push service.
pub fn first_attempt(
    id: OutboxId,
    sub: &Subscription,
    payload: Payload,
    deadline: DateTime<Utc>,
) -> PushRequest {
    PushRequest {
        v: VERSION,
        outbox_id: id,
        attempt: 1,
        deadline,
        target: Target::WebPush(sub.clone()),
        payload,
        ttl: 3600,
        urgency: Urgency::Normal,
        topic: id.0.simple().to_string(),
        dedup_day: None,
        recall: None,
        traceparent: None,
        members: Vec::new(),
    }
}
