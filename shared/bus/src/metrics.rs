//! The families the bus feeds: dead-lettered messages and delivery-log failures (exported by
//! the services that consume: the dispatcher and the pusher).

use tidings_runtime::metrics::{Counter, Family, KindLabels, OperationLabels};

tidings_runtime::families! {
    pub struct BusMetrics {
        dead_lettered: Family<KindLabels, Counter> = Family::default()
            => "tidings_dead_lettered", "Messages sent to the dead-letter stream, by stream kind";
        delivery_log_errors: Family<OperationLabels, Counter> = Family::default()
            => "tidings_delivery_log_errors",
            "Delivery-log operations (record, lookup) that failed even after recreating the \
             bucket: while this moves, a redelivered push may be sent twice";
    }
}
