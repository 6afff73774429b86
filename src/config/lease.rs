//! Validation of `skippr.lease`: how the pipeline leases of S3 mode (storage/lease.rs) are
//! renewed and when they expire.

use std::time::Duration;

use super::{keys, parse_duration, SkipprFile, Validator};
use crate::storage::lease::{LeaseSettings, DEFAULT_EXPIRE_AFTER, DEFAULT_RENEW_EVERY};

impl Validator<'_> {
    /// Both durations at least 1s, and the expiry at least twice the renewal period (one
    /// renewal may fail without the lease being lost).
    pub(super) fn lease(&mut self, file: &SkipprFile) -> LeaseSettings {
        let l = file.skippr.lease.clone().unwrap_or_default();
        let mut duration = |key: &str, value: Option<&str>, default: &str| {
            let text = value.unwrap_or(default);
            match parse_duration(text) {
                Some(d) if d >= Duration::from_secs(1) => Some(d),
                _ => {
                    self.report(
                        keys(&["skippr", "lease", key]),
                        format!(
                            "`{text}` is not a duration of at least 1s: write e.g. `30s` or `2m`"
                        ),
                    );
                    None
                }
            }
        };
        let renew = duration("renew_every", l.renew_every.as_deref(), DEFAULT_RENEW_EVERY);
        let expire = duration(
            "expire_after",
            l.expire_after.as_deref(),
            DEFAULT_EXPIRE_AFTER,
        );
        let (Some(renew_every), Some(expire_after)) = (renew, expire) else {
            return LeaseSettings::default();
        };
        if expire_after < renew_every * 2 {
            self.report(
                keys(&["skippr", "lease", "expire_after"]),
                format!(
                    "must be at least twice renew_every ({}s), so that one failed renewal does not lose the lease",
                    renew_every.as_secs()
                ),
            );
        }
        LeaseSettings {
            renew_every,
            expire_after,
        }
    }
}
