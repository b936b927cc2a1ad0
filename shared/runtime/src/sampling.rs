//! Which traces are kept: `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`, read here rather
//! than by the SDK so a misspelt value is logged where operators look (the SDK warns through its
//! own channel, which these services do not print), and so the api knows the ratio it applies to
//! a stranger's trace.
//!
//! A span whose parent came with a message of another Tidings service follows that parent's
//! decision (the `parentbased_*` samplers), so a notification is kept whole or not at all. A
//! `traceparent` from outside, on the api's public routes, is continued ([`untrusted_parent`])
//! but its sampled flag is not obeyed: the api draws the decision itself at the root's ratio, so
//! a client cannot make every one of its requests exported.

use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags};
use opentelemetry_sdk::trace::Sampler;
use std::sync::atomic::{AtomicU64, Ordering};

/// The sampler the settings name, and the share of new traces it keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Whether a span with a parent follows the parent's decision.
    pub parent_based: bool,
    /// The share of traces started here that are kept, 0 to 1.
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error(
        "OTEL_TRACES_SAMPLER={0:?} is none of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
    )]
    Sampler(String),
    #[error("OTEL_TRACES_SAMPLER_ARG={0:?} is not a ratio from 0 to 1")]
    Ratio(String),
}

impl Default for Sampling {
    /// The OpenTelemetry default, `parentbased_always_on`.
    fn default() -> Self {
        Sampling {
            parent_based: true,
            ratio: 1.0,
        }
    }
}

impl Sampling {
    /// The sampling `env` asks for; unset is the default. An error names the bad value (the
    /// caller logs it and keeps the default).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Sampling, SamplingError> {
        let Some(name) = env("OTEL_TRACES_SAMPLER") else {
            return Ok(Sampling::default());
        };
        let name = name.trim();
        let (parent_based, root) = match name.strip_prefix("parentbased_") {
            Some(root) => (true, root),
            None => (false, name),
        };
        let ratio = match root {
            "always_on" => 1.0,
            "always_off" => 0.0,
            "traceidratio" => match env("OTEL_TRACES_SAMPLER_ARG") {
                // The specification's default for a ratio sampler without its argument.
                None => 1.0,
                Some(arg) => match arg.trim().parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => r,
                    _ => return Err(SamplingError::Ratio(arg)),
                },
            },
            _ => return Err(SamplingError::Sampler(name.to_owned())),
        };
        Ok(Sampling {
            parent_based,
            ratio,
        })
    }

    pub fn sampler(&self) -> Sampler {
        let root = if self.ratio >= 1.0 {
            Sampler::AlwaysOn
        } else if self.ratio <= 0.0 {
            Sampler::AlwaysOff
        } else {
            Sampler::TraceIdRatioBased(self.ratio)
        };
        if self.parent_based {
            Sampler::ParentBased(Box::new(root))
        } else {
            root
        }
    }
}

/// The ratio [`untrusted_parent`] draws at, as f64 bits: all until the process's sampling is
/// set.
static RATIO: AtomicU64 = AtomicU64::new(0x3FF0_0000_0000_0000);

/// Makes `sampling` the one [`untrusted_parent`] applies.
pub fn install(sampling: Sampling) {
    RATIO.store(sampling.ratio.to_bits(), Ordering::Relaxed);
}

/// The span context a `traceparent` from outside names, its sampled flag replaced by a draw at
/// the installed ratio; `None` when there is none or it does not parse.
pub fn untrusted_parent(traceparent: Option<&str>) -> Option<Context> {
    let ratio = f64::from_bits(RATIO.load(Ordering::Relaxed));
    untrusted_parent_at(traceparent, ratio, rand::random::<f64>())
}

/// [`untrusted_parent`] with the draw given: kept when `draw < ratio`.
fn untrusted_parent_at(traceparent: Option<&str>, ratio: f64, draw: f64) -> Option<Context> {
    let cx = crate::telemetry::remote(traceparent)?;
    let theirs = cx.span().span_context().clone();
    let flags = if draw < ratio {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let ours = SpanContext::new(
        theirs.trace_id(),
        theirs.span_id(),
        flags,
        true,
        theirs.trace_state().clone(),
    );
    Some(Context::new().with_remote_span_context(ours))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_settings_name_the_sampler_and_a_bad_one_is_an_error() {
        let sampling = |pairs: &[(&str, &str)]| Sampling::from_env(env_of(pairs));
        assert_eq!(sampling(&[]), Ok(Sampling::default()));
        let prod = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.05"),
        ];
        assert_eq!(
            sampling(&prod),
            Ok(Sampling {
                parent_based: true,
                ratio: 0.05
            })
        );
        assert_eq!(
            sampling(&[("OTEL_TRACES_SAMPLER", "always_off")]),
            Ok(Sampling {
                parent_based: false,
                ratio: 0.0
            })
        );
        assert_eq!(
            sampling(&[("OTEL_TRACES_SAMPLER", "traceidratio")]).map(|s| s.ratio),
            Ok(1.0)
        );
        assert_eq!(
            sampling(&[("OTEL_TRACES_SAMPLER", "parentbased_sometimes")]),
            Err(SamplingError::Sampler("parentbased_sometimes".into()))
        );
        for bad in ["1.5", "-0.1", "ten percent", "NaN"] {
            assert_eq!(
                sampling(&[
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", bad)
                ]),
                Err(SamplingError::Ratio(bad.into()))
            );
        }
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    fn decided(traceparent: &str, ratio: f64, draw: f64) -> (String, bool) {
        let cx = untrusted_parent_at(Some(traceparent), ratio, draw).unwrap();
        let sc = cx.span().span_context().clone();
        (sc.trace_id().to_string(), sc.is_sampled())
    }

    #[test]
    fn a_strangers_traceparent_is_continued_but_its_sampled_flag_is_not_obeyed() {
        let forced = format!("00-{TRACE}-00f067aa0ba902b7-01");
        // The trace goes on under its id, whatever is decided.
        assert_eq!(decided(&forced, 0.0, 0.0), (TRACE.to_owned(), false));
        assert_eq!(decided(&forced, 0.1, 0.5), (TRACE.to_owned(), false));
        assert_eq!(decided(&forced, 0.1, 0.05), (TRACE.to_owned(), true));
        // Nor can the flag keep a trace out that the api's own draw keeps.
        let declined = format!("00-{TRACE}-00f067aa0ba902b7-00");
        assert_eq!(decided(&declined, 1.0, 0.99), (TRACE.to_owned(), true));
        assert!(untrusted_parent_at(Some("00-zz-00f067aa0ba902b7-01"), 1.0, 0.0).is_none());
        assert!(untrusted_parent_at(None, 1.0, 0.0).is_none());
    }
}
