//! `tidings-api reseal`: every stored webhook secret sealed again under the first of the keys
//! given, so a key can be dropped once nothing is sealed under it (docs/security.md). Secrets
//! stored as they are (before keys were given) are sealed too. A secret rotated meanwhile is
//! left as the rotation stored it (sealed by the api's own keys).

use tidings_sealing::{self as sealed, SecretKeys, Unopened};
use tidings_store::endpoints::{self, StoredSecrets};

/// Subscriptions read per page.
const PAGE: i64 = 500;

/// What a run did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resealed {
    /// Subscriptions whose secrets are now sealed under the first key.
    pub resealed: u64,
    /// Already sealed under it, or rotated meanwhile.
    pub unchanged: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ResealError {
    #[error("reading or writing webhook secrets: {0}")]
    Db(#[source] sqlx::Error),
    #[error(
        "{count} webhook subscriptions' secrets do not open and were left as they are (the \
         first, {subscription}: {source}); the others are sealed under the first key"
    )]
    Unopened {
        count: u64,
        subscription: uuid::Uuid,
        #[source]
        source: Unopened,
    },
    #[error("the system random generator failed")]
    Random,
}

/// Seals every webhook subscription's secrets under the first of `keys`. Secrets none of
/// `keys` opens are left as they are and make it fail at the end (their key must stay until
/// they are sealed again); a run can be repeated.
pub async fn reseal(pool: &sqlx::PgPool, keys: &SecretKeys) -> Result<Resealed, ResealError> {
    let mut done = Resealed::default();
    // How many did not open, and the first of them with why.
    let mut unopened: (u64, Option<(uuid::Uuid, Unopened)>) = (0, None);
    let mut after = None;
    loop {
        let page = endpoints::stored_secrets(pool, after, PAGE)
            .await
            .map_err(ResealError::Db)?;
        let Some(last) = page.last() else {
            return match unopened {
                (count, Some((subscription, source))) => Err(ResealError::Unopened {
                    count,
                    subscription,
                    source,
                }),
                _ => Ok(done),
            };
        };
        after = Some(last.id);
        for stored in &page {
            let new = match sealed_again(stored, keys) {
                Ok(Some(new)) => new,
                Ok(None) => {
                    done.unchanged += 1;
                    continue;
                }
                Err(Again::Random) => return Err(ResealError::Random),
                Err(Again::Unopened(source)) => {
                    unopened.0 += 1;
                    unopened.1.get_or_insert((stored.id.0, source));
                    continue;
                }
            };
            let replaced = endpoints::replace_secrets(pool, stored, &new)
                .await
                .map_err(ResealError::Db)?;
            if replaced {
                done.resealed += 1;
            } else {
                done.unchanged += 1;
            }
        }
    }
}

/// Why one subscription's secrets were not sealed again.
enum Again {
    Unopened(Unopened),
    Random,
}

/// `stored` with each secret sealed under the first key; `None` if they all are already.
fn sealed_again(stored: &StoredSecrets, keys: &SecretKeys) -> Result<Option<StoredSecrets>, Again> {
    let again = |text: &String| -> Result<String, Again> {
        if keys.sealed_by_first(text) {
            return Ok(text.clone());
        }
        let plain =
            sealed::open_for_reseal(text, Some(keys), stored.id.0).map_err(Again::Unopened)?;
        keys.seal(&plain, stored.id.0).map_err(|_| Again::Random)
    };
    let new = StoredSecrets {
        id: stored.id,
        secret: again(&stored.secret)?,
        previous_secret: stored.previous_secret.as_ref().map(again).transpose()?,
    };
    let changed = new.secret != stored.secret || new.previous_secret != stored.previous_secret;
    Ok(changed.then_some(new))
}
