//! Names as Postgres text: the outbox stores states, channels, outcomes, a trigger's key and a
//! reason's name as text, and each reads back as its enum. A value this build does not know is a
//! decode error ([`UnknownName`], which sqlx reports with the column), never a fallback.

use crate::names::UnknownName;
use crate::outbox::Reason;
use crate::trigger::Trigger;
use crate::withdrawal::{Announces, TriggerColumn};

/// Makes `$t` a Postgres `text` value: written by `$to_text`, read by `$from_text` (which fails
/// on a name it does not know).
macro_rules! as_text {
    ($t:ty, $to_text:expr, $from_text:expr) => {
        impl ::sqlx::Type<::sqlx::Postgres> for $t {
            fn type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &::sqlx::postgres::PgTypeInfo) -> bool {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::compatible(ty)
            }
        }

        impl<'r> ::sqlx::Decode<'r, ::sqlx::Postgres> for $t {
            fn decode(
                value: ::sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, ::sqlx::error::BoxDynError> {
                let text = <&str as ::sqlx::Decode<::sqlx::Postgres>>::decode(value)?;
                let parse: fn(&str) -> Result<$t, $crate::names::UnknownName> = $from_text;
                Ok(parse(text)?)
            }
        }

        impl ::sqlx::postgres::PgHasArrayType for $t {
            fn array_type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl ::sqlx::Encode<'_, ::sqlx::Postgres> for $t {
            fn encode_by_ref(
                &self,
                buf: &mut ::sqlx::postgres::PgArgumentBuffer,
            ) -> Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                let to_text: fn(&$t) -> String = $to_text;
                <String as ::sqlx::Encode<::sqlx::Postgres>>::encode(to_text(self), buf)
            }
        }
    };
}

pub(crate) use as_text;

fn unknown(set: &'static str, value: &str) -> UnknownName {
    UnknownName {
        set,
        value: value.to_owned(),
    }
}

as_text!(Trigger, Trigger::key, |s| Trigger::from_key(s)
    .ok_or_else(|| unknown("trigger key", s)));
as_text!(Reason, |r| r.as_str().to_owned(), |s| Reason::parse(s)
    .ok_or_else(|| unknown("reason", s)));
as_text!(Announces, Announces::key, |s| Announces::from_key(s)
    .ok_or_else(|| unknown("trigger key", s)));

/// An outbox row's `trigger` column, split as it is read (`trigger AS "trigger: TriggerColumn"`);
/// never an error: a key this build does not know fails its own row where it is used.
impl ::sqlx::Type<::sqlx::Postgres> for TriggerColumn {
    fn type_info() -> ::sqlx::postgres::PgTypeInfo {
        <&str as ::sqlx::Type<::sqlx::Postgres>>::type_info()
    }
    fn compatible(ty: &::sqlx::postgres::PgTypeInfo) -> bool {
        <&str as ::sqlx::Type<::sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> ::sqlx::Decode<'r, ::sqlx::Postgres> for TriggerColumn {
    fn decode(value: ::sqlx::postgres::PgValueRef<'r>) -> Result<Self, ::sqlx::error::BoxDynError> {
        let text = <&str as ::sqlx::Decode<::sqlx::Postgres>>::decode(value)?;
        Ok(TriggerColumn::parse(text))
    }
}

/// A count the schema keeps `>= 0` (attempts, retries, failures), read as the `u32` the domain
/// counts in: `attempt AS "attempt: Count"` in a checked statement. A value outside `u32` fails
/// the row's decoding (a column decode error) rather than being bent to fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Count(pub u32);

impl From<Count> for u32 {
    fn from(c: Count) -> u32 {
        c.0
    }
}

impl ::sqlx::Type<::sqlx::Postgres> for Count {
    fn type_info() -> ::sqlx::postgres::PgTypeInfo {
        <i32 as ::sqlx::Type<::sqlx::Postgres>>::type_info()
    }
}

impl<'r> ::sqlx::Decode<'r, ::sqlx::Postgres> for Count {
    fn decode(value: ::sqlx::postgres::PgValueRef<'r>) -> Result<Self, ::sqlx::error::BoxDynError> {
        let n = <i32 as ::sqlx::Decode<::sqlx::Postgres>>::decode(value)?;
        Ok(Count(u32::try_from(n)?))
    }
}
