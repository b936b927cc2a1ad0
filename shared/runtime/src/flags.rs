//! Flags read with nothing set. A service's settings for tests and tools come from here, so each
//! default is written once: in its flag's `#[arg(default_value …)]`.

/// `A` with every flag at its default and the environment ignored; `required` gives the flags
/// that have no default, e.g. `["--database-url", "postgres://unused"]`.
pub fn defaults<A>(required: &[&str]) -> Result<A, clap::Error>
where
    A: clap::Args + clap::FromArgMatches,
{
    let command = A::augment_args(clap::Command::new("defaults"))
        .mut_args(|arg| arg.env(None::<&'static str>));
    let args = std::iter::once("defaults").chain(required.iter().copied());
    A::from_arg_matches(&command.try_get_matches_from(args)?)
}

/// [`defaults`] where a default that does not parse is a bug, not input: settings for tests and
/// tools (each service's tests build them, so such a bug fails them).
pub fn parsed_defaults<A>(required: &[&str]) -> A
where
    A: clap::Args + clap::FromArgMatches,
{
    defaults(required).unwrap_or_else(|e| {
        let flags = std::any::type_name::<A>();
        panic!("the defaults of {flags} do not parse: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Args, Debug)]
    struct Flags {
        #[arg(long, env = "TIDINGS_FLAGS_TEST_COUNT", default_value_t = 7)]
        count: u32,
        /// PATH is set wherever the tests run: were the environment read, `--name` would have a
        /// value without being given.
        #[arg(long, env = "PATH")]
        name: String,
    }

    #[test]
    fn defaults_ignore_the_environment_and_need_what_has_none() {
        assert!(std::env::var_os("PATH").is_some());
        let flags: Flags = defaults(&["--name", "x"]).unwrap();
        assert_eq!((flags.count, flags.name.as_str()), (7, "x"));
        assert!(defaults::<Flags>(&[]).is_err(), "--name has no default");
    }
}
