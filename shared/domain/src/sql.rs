//! Triggers and reasons as Postgres text: the outbox stores a trigger's key and a reason's name,
//! and both read back as the enum. A value this build does not know is a decode error (sqlx names
//! the column), never a fallback.

use crate::outbox::Reason;
use crate::trigger::Trigger;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, Postgres, Type};

/// A stored trigger key or reason name that this build does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnknownValue {
    #[error("unknown trigger key {0:?}")]
    Trigger(String),
    #[error("unknown reason {0:?}")]
    Reason(String),
}

macro_rules! as_text {
    ($t:ty, $to_text:expr, $from_text:expr) => {
        impl Type<Postgres> for $t {
            fn type_info() -> PgTypeInfo {
                <&str as Type<Postgres>>::type_info()
            }
            fn compatible(ty: &PgTypeInfo) -> bool {
                <&str as Type<Postgres>>::compatible(ty)
            }
        }

        impl<'r> Decode<'r, Postgres> for $t {
            fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
                let text = <&str as Decode<Postgres>>::decode(value)?;
                let parse: fn(&str) -> Result<$t, UnknownValue> = $from_text;
                Ok(parse(text)?)
            }
        }

        impl Encode<'_, Postgres> for $t {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                let to_text: fn(&$t) -> String = $to_text;
                <String as Encode<Postgres>>::encode(to_text(self), buf)
            }
        }
    };
}

as_text!(Trigger, Trigger::key, |s| Trigger::from_key(s)
    .ok_or_else(|| UnknownValue::Trigger(s.to_owned())));
as_text!(Reason, |r| r.as_str().to_owned(), |s| Reason::parse(s)
    .ok_or_else(|| UnknownValue::Reason(s.to_owned())));
