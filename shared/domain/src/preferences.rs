//! A reader's preferences as the api takes and shows them and the store keeps them (JSON), and
//! their checked form, [`holding::Preferences`]. A device has them; a watch may have its own,
//! which replace the device's whole.

use chrono::{Duration, NaiveTime, Weekday};
use serde::{Deserialize, Serialize};

use crate::holding::{Cap, Days, Digest, Preferences, QuietHours};

/// Most notifications a cap can allow per window.
pub const MAX_CAP: u32 = 1000;
/// Longest cap window, in seconds: a week.
pub const MAX_CAP_WINDOW_SECONDS: u32 = 7 * 24 * 3600;

/// When notifications wait: quiet hours, a cap, a digest. Each left out (or null): none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PreferencesSpec {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::strict::object_or_null"
    )]
    pub quiet_hours: Option<QuietHoursSpec>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::strict::object_or_null"
    )]
    pub cap: Option<CapSpec>,
    /// `none`, `hourly`, `daily at HH:MM` or `weekly on mon at HH:MM` (`mon` … `sun`), on the
    /// reader's clock: what holds goes out then, together as one message, each re-checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            pattern = r"^(none|hourly|daily at ([01][0-9]|2[0-3]):[0-5][0-9]|weekly on (mon|tue|wed|thu|fri|sat|sun) at ([01][0-9]|2[0-3]):[0-5][0-9])$"
        )
    )]
    pub digest: Option<String>,
}

/// Quiet hours on the reader's clock: a notification due inside them waits for their end. An
/// end before the start is the next morning's (22:00–07:30).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QuietHoursSpec {
    /// `HH:MM` or `HH:MM:SS`, 24-hour.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$")
    )]
    pub start: String,
    /// `HH:MM` or `HH:MM:SS`, not the start.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$")
    )]
    pub end: String,
    /// The days whose evening (or whole window) is quiet, each once; left out: every day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 7))]
    pub days: Option<Vec<Day>>,
}

/// A day of the week.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Day {
    /// The day its lowercase three-letter name names (`mon`).
    pub fn named(name: &str) -> Option<Day> {
        Some(match name {
            "mon" => Day::Mon,
            "tue" => Day::Tue,
            "wed" => Day::Wed,
            "thu" => Day::Thu,
            "fri" => Day::Fri,
            "sat" => Day::Sat,
            "sun" => Day::Sun,
            _ => return None,
        })
    }

    pub fn weekday(self) -> Weekday {
        match self {
            Day::Mon => Weekday::Mon,
            Day::Tue => Weekday::Tue,
            Day::Wed => Weekday::Wed,
            Day::Thu => Weekday::Thu,
            Day::Fri => Weekday::Fri,
            Day::Sat => Weekday::Sat,
            Day::Sun => Weekday::Sun,
        }
    }
}

/// At most `max` notifications in any `window_seconds` (5 a day: 5 in 86400); the next waits
/// until one leaves the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CapSpec {
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    #[serde(deserialize_with = "crate::strict::whole::one")]
    pub max: u32,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 604800))]
    #[serde(deserialize_with = "crate::strict::whole::one")]
    pub window_seconds: u32,
}

/// Why preferences were refused; `at` is the field's JSON Pointer below the preferences.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{at}: {what}")]
pub struct PreferencesError {
    pub at: &'static str,
    pub what: &'static str,
}

fn refuse(at: &'static str, what: &'static str) -> PreferencesError {
    PreferencesError { at, what }
}

/// `HH:MM` or `HH:MM:SS` exactly, as the schema's pattern says (no `7:30`, no `24:00`).
pub fn parse_clock(s: &str) -> Option<NaiveTime> {
    let b = s.as_bytes();
    let two = |i: usize| -> Option<u32> {
        let (h, l) = (b.get(i)?, b.get(i + 1)?);
        (h.is_ascii_digit() && l.is_ascii_digit()).then(|| u32::from((h - b'0') * 10 + (l - b'0')))
    };
    let seconds = match b.len() {
        5 => 0,
        8 if b[5] == b':' => two(6)?,
        _ => return None,
    };
    if b[2] != b':' {
        return None;
    }
    NaiveTime::from_hms_opt(two(0)?, two(3)?, seconds)
}

fn clock(s: &str, at: &'static str) -> Result<NaiveTime, PreferencesError> {
    parse_clock(s)
        .ok_or_else(|| refuse(at, "a time of day is HH:MM or HH:MM:SS, 00:00 to 23:59:59"))
}

impl PreferencesSpec {
    /// The rules these preferences say, or the first field that is wrong.
    pub fn rules(&self) -> Result<Preferences, PreferencesError> {
        let quiet = self
            .quiet_hours
            .as_ref()
            .map(QuietHoursSpec::rules)
            .transpose()?;
        let cap = self.cap.map(|c| c.rules()).transpose()?;
        let digest = match self.digest.as_deref() {
            None => None,
            Some(d) => parse_digest(d).ok_or_else(|| {
                refuse(
                    "/digest",
                    "a digest is none, hourly, daily at HH:MM or weekly on mon…sun at HH:MM",
                )
            })?,
        };
        Ok(Preferences { quiet, cap, digest })
    }
}

/// `none` (no digest), `hourly`, `daily at HH:MM` or `weekly on DAY at HH:MM`, exactly as the
/// schema's pattern says.
pub fn parse_digest(s: &str) -> Option<Option<Digest>> {
    let hh_mm = |t: &str| (t.len() == 5).then(|| parse_clock(t)).flatten();
    if let Some(at) = s.strip_prefix("daily at ") {
        return Some(Some(Digest::Daily(hh_mm(at)?)));
    }
    if let Some(rest) = s.strip_prefix("weekly on ") {
        let (day, at) = rest.split_once(" at ")?;
        let day = Day::named(day)?;
        return Some(Some(Digest::Weekly(day.weekday(), hh_mm(at)?)));
    }
    match s {
        "none" => Some(None),
        "hourly" => Some(Some(Digest::Hourly)),
        _ => None,
    }
}

impl QuietHoursSpec {
    fn rules(&self) -> Result<QuietHours, PreferencesError> {
        let start = clock(&self.start, "/quiet_hours/start")?;
        let end = clock(&self.end, "/quiet_hours/end")?;
        if start == end {
            return Err(refuse(
                "/quiet_hours/end",
                "quiet hours end at another time than they start",
            ));
        }
        let days = match &self.days {
            None => Days::EVERY,
            Some(d) if d.is_empty() => {
                return Err(refuse(
                    "/quiet_hours/days",
                    "name at least one day, or leave days out for every day",
                ));
            }
            Some(d) => {
                let weekdays: Vec<Weekday> = d.iter().map(|d| d.weekday()).collect();
                let days = Days::of(&weekdays);
                // Each day once (so at most seven, the schema's `maxItems`): a list the api took
                // with repeats would be shown back longer than its own schema allows.
                if days.len() != weekdays.len() {
                    return Err(refuse("/quiet_hours/days", "name each day once"));
                }
                days
            }
        };
        Ok(QuietHours { start, end, days })
    }
}

impl CapSpec {
    fn rules(self) -> Result<Cap, PreferencesError> {
        if !(1..=MAX_CAP).contains(&self.max) {
            return Err(refuse(
                "/cap/max",
                "a cap allows 1 to 1000 notifications per window",
            ));
        }
        if !(1..=MAX_CAP_WINDOW_SECONDS).contains(&self.window_seconds) {
            return Err(refuse(
                "/cap/window_seconds",
                "a cap's window is 1 second to a week (604800)",
            ));
        }
        Ok(Cap {
            max: self.max,
            window: Duration::seconds(i64::from(self.window_seconds)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(json: &str) -> Result<PreferencesSpec, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn preferences_read_as_their_rules() {
        let p = spec(
            r#"{"quiet_hours": {"start": "22:00", "end": "07:30", "days": ["mon", "fri"]},
                "cap": {"max": 5, "window_seconds": 86400}}"#,
        )
        .unwrap();
        let rules = p.rules().unwrap();
        let quiet = rules.quiet.unwrap();
        assert_eq!(quiet.start, NaiveTime::from_hms_opt(22, 0, 0).unwrap());
        assert_eq!(quiet.end, NaiveTime::from_hms_opt(7, 30, 0).unwrap());
        assert!(quiet.days.contains(Weekday::Fri) && !quiet.days.contains(Weekday::Tue));
        assert_eq!(rules.cap.unwrap().window, Duration::days(1));
        assert_eq!(rules.digest, None);
        let digest = |s: &str| {
            let json = serde_json::json!({ "digest": s });
            serde_json::from_value::<PreferencesSpec>(json)
                .unwrap()
                .rules()
                .map(|r| r.digest)
        };
        let eight = NaiveTime::from_hms_opt(8, 0, 0).unwrap();
        assert_eq!(digest("none"), Ok(None));
        assert_eq!(digest("hourly"), Ok(Some(Digest::Hourly)));
        assert_eq!(digest("daily at 08:00"), Ok(Some(Digest::Daily(eight))));
        assert_eq!(
            digest("weekly on sun at 08:00"),
            Ok(Some(Digest::Weekly(Weekday::Sun, eight)))
        );
        for wrong in [
            "daily",
            "daily at 8:00",
            "daily at 08:00:00",
            "weekly on sunday at 08:00",
            "weekly at 08:00",
            "Hourly",
            " hourly",
        ] {
            assert_eq!(digest(wrong).unwrap_err().at, "/digest", "{wrong}");
        }
        // Shown as given; nothing set is nothing held.
        let shown: PreferencesSpec =
            serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
        assert_eq!(shown, p);
        assert_eq!(spec("{}").unwrap().rules().unwrap(), Preferences::default());
        assert_eq!(
            serde_json::to_string(&PreferencesSpec::default()).unwrap(),
            "{}"
        );
    }

    #[test]
    fn wrong_preferences_name_their_field() {
        let wrong = |json: &str| spec(json).unwrap().rules().unwrap_err().at;
        assert_eq!(
            wrong(r#"{"quiet_hours": {"start": "22:00", "end": "22:00"}}"#),
            "/quiet_hours/end"
        );
        assert_eq!(
            wrong(r#"{"quiet_hours": {"start": "7:30", "end": "22:00"}}"#),
            "/quiet_hours/start"
        );
        assert_eq!(
            wrong(r#"{"quiet_hours": {"start": "01:00", "end": "24:00"}}"#),
            "/quiet_hours/end"
        );
        assert_eq!(
            wrong(r#"{"quiet_hours": {"start": "01:00", "end": "02:00", "days": []}}"#),
            "/quiet_hours/days"
        );
        // Regression (the contract fuzzer): fourteen days with repeats were taken and shown
        // back, against the schema's `maxItems: 7`.
        for repeated in [
            r#"["mon", "mon"]"#,
            r#"["fri", "wed", "thu", "fri", "wed", "tue", "tue", "sun", "fri", "fri", "mon"]"#,
        ] {
            let body = format!(
                r#"{{"quiet_hours": {{"start": "01:00", "end": "02:00", "days": {repeated}}}}}"#
            );
            assert_eq!(wrong(&body), "/quiet_hours/days", "{repeated}");
        }
        assert_eq!(
            wrong(r#"{"cap": {"max": 0, "window_seconds": 60}}"#),
            "/cap/max"
        );
        assert_eq!(
            wrong(r#"{"cap": {"max": 5, "window_seconds": 604801}}"#),
            "/cap/window_seconds"
        );
        // Unknown fields, days and kinds are the parser's to refuse.
        assert!(
            spec(r#"{"digest": {"every": "hourly"}}"#).is_err(),
            "a string, as the schema says"
        );
        assert!(
            spec(r#"{"quiet_hours": {"start": "01:00", "end": "02:00", "days": ["monday"]}}"#)
                .is_err()
        );
        assert!(spec(r#"{"snooze": true}"#).is_err());
        assert!(
            spec(r#"{"cap": [5, 60]}"#).is_err(),
            "an object only, as the schema says"
        );
        let whole = spec(r#"{"cap": {"max": 5.0, "window_seconds": 60}}"#).unwrap();
        assert_eq!(
            whole.cap.unwrap().max,
            5,
            "JSON Schema's integers include 5.0"
        );
    }

    fn pattern(s: &str) -> bool {
        let b = s.as_bytes();
        let d = |i: usize| b[i].is_ascii_digit();
        let hm = b.len() >= 5
            && d(0)
            && d(1)
            && b[2] == b':'
            && d(3)
            && d(4)
            && (b[0] < b'2' || b[1] <= b'3')
            && b[0] <= b'2'
            && b[3] <= b'5';
        hm && (b.len() == 5 || (b.len() == 8 && b[5] == b':' && d(6) && d(7) && b[6] <= b'5'))
    }

    proptest! {
        // The schema's pattern and the parser agree on every short string of these characters.
        #[test]
        fn the_clock_parser_takes_exactly_the_schemas_pattern(s in "[0-9:]{0,9}") {
            prop_assert_eq!(parse_clock(&s).is_some(), pattern(&s), "{}", s);
        }
    }
}
