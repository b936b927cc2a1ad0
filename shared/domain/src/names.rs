//! Closed sets of names: the enums whose values are stored, sent and counted as text (states,
//! channels, reasons, outcomes). Each is declared once with [`names!`], which gives it the same
//! text in serde, `as_str`, `Display`, `FromStr` and (with the `sqlx` feature) Postgres, so the
//! spellings cannot drift apart; a name this build does not know is an [`UnknownName`] error.

/// A name that is not one of its set's: the set (e.g. `outbox status`) and the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {set} {value:?}")]
pub struct UnknownName {
    pub set: &'static str,
    pub value: String,
}

/// Declares an enum of names: `enum Status("outbox status") { Pending = "pending", … }`.
// Each text is taken as a `tt`, not a `literal`: a `literal` fragment reaches the derives
// wrapped in an invisible group, which serde reads but utoipa skips, so the OpenAPI schema showed
// the variants' Rust names (a test on the api's document checks it).
macro_rules! names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($set:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:tt ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        $vis enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The name it is stored, sent and counted by.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text ),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::names::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| $crate::names::UnknownName {
                        set: $set,
                        value: s.to_owned(),
                    })
            }
        }

        #[cfg(feature = "sqlx")]
        $crate::sql::as_text!($name, |v| v.as_str().to_owned(), |s| s.parse());
    };
}

pub(crate) use names;

#[cfg(test)]
mod tests {
    use crate::messages::{AttemptOutcome, Outcome, Urgency};
    use crate::outbox::{Delivery, DropReason, FailReason, Status};
    use crate::subjects::StreamKind;
    use crate::{Channel, SourceErrorKind};

    /// Every value's name reads back as the value, in serde and in `FromStr`.
    fn round_trips<T>(all: &[T])
    where
        T: Copy + PartialEq + std::fmt::Debug + std::fmt::Display,
        T: std::str::FromStr + serde::Serialize + serde::de::DeserializeOwned,
        T::Err: std::fmt::Debug,
    {
        for &v in all {
            let name = v.to_string();
            assert_eq!(name.parse::<T>().unwrap(), v);
            assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{name}\""));
            assert_eq!(
                serde_json::from_str::<T>(&format!("\"{name}\"")).unwrap(),
                v
            );
        }
    }

    #[test]
    fn every_set_round_trips_through_its_names() {
        round_trips(&Channel::ALL);
        round_trips(&Status::ALL);
        round_trips(&DropReason::ALL);
        round_trips(&FailReason::ALL);
        round_trips(&Delivery::ALL);
        round_trips(&Outcome::ALL);
        round_trips(&AttemptOutcome::ALL);
        round_trips(&Urgency::ALL);
        round_trips(&StreamKind::ALL);
        round_trips(&SourceErrorKind::ALL);
    }

    #[test]
    fn an_unknown_name_is_an_error_that_says_which_set() {
        let err = "shipped".parse::<Status>().unwrap_err();
        assert_eq!(err.set, "outbox status");
        assert_eq!(err.to_string(), "unknown outbox status \"shipped\"");
        assert!(
            "WebPush".parse::<Channel>().is_err(),
            "names are case-sensitive"
        );
    }
}
