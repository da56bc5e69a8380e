//! The control-plane gateway URLs a node knows, and the order it tries them in.
//!
//! # Background
//! Several `bcctl serve` replicas may share one database and one CA, each with its own gateway
//! URL. A node may hold its session with any of them, so it is configured with a list and, when
//! the replica it talks to goes away, moves to another one.
//!
//! # Design
//! - [`check_url`] and [`split_list`]: the shape of one URL (`https://host:port`) and a
//!   comma-separated list, the same for every mode's configuration.
//! - [`Endpoints`]: the list, shuffled once (a fleet configured with the same list spreads over
//!   the replicas instead of all starting at the first), then tried round-robin: an attempt that
//!   failed moves on to the next URL, a session that opened starts a new round at its URL.
//!   [`Endpoints::failed`] says when a round is complete — every URL failed once since the last
//!   session — which is when the caller's backoff ceiling doubles: with one URL that is every
//!   failure, as before there were lists.
//!
//! # Limitations
//! No memory of a URL's health beyond the round: a replica that failed is tried again in the
//! next one.

use std::time::Duration;

use rand::seq::SliceRandom;

use crate::backoff::Backoff;

/// A URL or list that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// A URL is not `https://host[:port]` (no path, query or user info).
    #[error("control plane URL {0:?} must look like https://host:port")]
    BadUrl(String),
    /// A URL is listed twice: it would be tried twice per round.
    #[error("control plane URL {0:?} is listed twice")]
    Duplicate(String),
}

/// Checks that `url` is `https://host[:port]` (a trailing `/` allowed): the session is mutual
/// TLS to that host, and a path would be ignored.
pub fn check_url(url: &str) -> Result<(), EndpointError> {
    let bad = || EndpointError::BadUrl(url.to_owned());
    let rest = url.strip_prefix("https://").ok_or_else(bad)?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(bad());
    }
    // The port after the host (an IPv6 host is in brackets), when there is one, is a number.
    let after_host = authority
        .rfind(']')
        .map_or(authority, |i| &authority[i + 1..]);
    if let Some((_, port)) = after_host.rsplit_once(':')
        && port.parse::<u16>().is_err()
    {
        return Err(bad());
    }
    crate::tls::host_port(url).map(|_| ()).map_err(|_| bad())
}

/// The URLs of a comma-separated list (`BCD_CONTROL_PLANE`, `--control-plane`, `bcd.url`),
/// trimmed, empty items dropped. Not checked: see [`check_list`].
pub fn split_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Every problem of `urls`: each malformed URL and each one listed twice, in list order.
pub fn check_list(urls: &[String]) -> Vec<EndpointError> {
    let mut problems = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        if let Err(e) = check_url(url) {
            problems.push(e);
        } else if urls[..i].contains(url) {
            problems.push(EndpointError::Duplicate(url.clone()));
        }
    }
    problems
}

/// The gateway URLs of a node in the order it tries them: never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    order: Vec<String>,
    /// Index in `order` of the URL the next attempt goes to.
    current: usize,
    /// Attempts that failed since the round began (the last session, or the last full round).
    failures: usize,
}

impl Endpoints {
    /// `urls` in a random order (duplicates dropped); `None` when there is none.
    pub fn shuffled(urls: &[String]) -> Option<Self> {
        let mut e = Self::in_order(urls)?;
        e.order.shuffle(&mut rand::rng());
        Some(e)
    }

    /// `urls` in the order given (duplicates dropped), for a single URL and for tests.
    pub fn in_order(urls: &[String]) -> Option<Self> {
        let mut order: Vec<String> = Vec::with_capacity(urls.len());
        for u in urls {
            if !order.contains(u) {
                order.push(u.clone());
            }
        }
        (!order.is_empty()).then_some(Self {
            order,
            current: 0,
            failures: 0,
        })
    }

    /// Every URL, in the order they are tried from the first.
    pub fn urls(&self) -> &[String] {
        &self.order
    }

    /// How many URLs there are (at least one).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Always false: an `Endpoints` holds at least one URL.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The URL the next attempt goes to.
    pub fn current(&self) -> &str {
        // `current` stays below `order.len()`, which is at least one.
        self.order.get(self.current).map_or("", String::as_str)
    }

    /// The attempt at [`Endpoints::current`] failed: the next attempt goes to the next URL.
    /// `true` when this completed a round (every URL failed once since the round began); the
    /// next round begins.
    pub fn failed(&mut self) -> bool {
        self.current = (self.current + 1) % self.order.len();
        self.failures += 1;
        if self.failures >= self.order.len() {
            self.failures = 0;
            return true;
        }
        false
    }

    /// The attempt at [`Endpoints::current`] failed: moves on ([`Endpoints::failed`]) and returns
    /// the wait before the next attempt, drawn under `backoff`'s ceiling (full jitter), which
    /// doubles only when this completed a round. Every attempt waits, so a fleet whose replica
    /// died does not land on the others all at once; a dead URL in the list costs one jittered
    /// wait, not a doubled ceiling.
    pub fn wait_after_failure(&mut self, backoff: &mut Backoff) -> Duration {
        if self.failed() {
            backoff.next_delay()
        } else {
            backoff.delay()
        }
    }

    /// The attempt at [`Endpoints::current`] opened a session (or a join answered there): a new
    /// round begins at it, so the next failure moves on to the next URL.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("https://cp{i}:7443")).collect()
    }

    #[test]
    fn urls_must_be_https_host_port() {
        for ok in [
            "https://cp.example:7443",
            "https://cp.example:7443/",
            "https://127.0.0.1:7443",
            "https://[::1]:7443",
            "https://cp.example",
        ] {
            assert_eq!(check_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "cp.example:7443",
            "http://cp.example:7443",
            "https://",
            "https://cp.example:7443/v1",
            "https://user@cp.example:7443",
            "https://cp.example:notaport",
            "https://cp.example:",
            "https://[::1]:x",
        ] {
            assert_eq!(
                check_url(bad),
                Err(EndpointError::BadUrl(bad.to_owned())),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_comma_list_splits_and_trims() {
        assert_eq!(
            split_list(" https://a:1, https://b:2 ,,"),
            ["https://a:1", "https://b:2"]
        );
        assert_eq!(split_list("https://a:1"), ["https://a:1"]);
        assert!(split_list(" , ").is_empty());
    }

    #[test]
    fn check_list_names_each_bad_and_repeated_url() {
        let list = [
            "https://a:1".to_owned(),
            "a:2".to_owned(),
            "https://a:1".to_owned(),
        ];
        assert_eq!(
            check_list(&list),
            [
                EndpointError::BadUrl("a:2".to_owned()),
                EndpointError::Duplicate("https://a:1".to_owned())
            ]
        );
        let msg = check_list(&list)[0].to_string();
        assert!(msg.contains("\"a:2\""), "{msg}");
        assert!(check_list(&urls(3)).is_empty());
    }

    #[test]
    fn no_url_no_endpoints() {
        assert_eq!(Endpoints::shuffled(&[]), None);
        assert_eq!(Endpoints::in_order(&[]), None);
    }

    #[test]
    fn each_round_tries_every_url_once_in_the_shuffled_order() {
        let list = urls(5);
        let mut e = Endpoints::shuffled(&list).unwrap_or_else(|| panic!("five URLs"));
        let order = e.urls().to_vec();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, list, "the shuffle keeps every URL once");
        for _round in 0..3 {
            let mut seen = Vec::new();
            for i in 0..5 {
                seen.push(e.current().to_owned());
                assert_eq!(e.failed(), i == 4, "the round ends after the fifth failure");
            }
            assert_eq!(seen, order, "every round follows the same shuffled order");
        }
    }

    #[test]
    fn shuffles_differ_between_nodes() {
        // 8 URLs: 40320 orders; 20 draws that all agree would mean no shuffle at all.
        let list = urls(8);
        let first = Endpoints::shuffled(&list).map(|e| e.urls().to_vec());
        let differs =
            (0..20).any(|_| Endpoints::shuffled(&list).map(|e| e.urls().to_vec()) != first);
        assert!(differs, "the order is never shuffled");
    }

    #[test]
    fn a_session_starts_a_new_round_at_its_url() {
        let mut e = Endpoints::in_order(&urls(3)).unwrap_or_else(|| panic!("three URLs"));
        assert!(!e.failed());
        assert_eq!(e.current(), "https://cp1:7443");
        e.succeeded();
        // The session at cp1 broke: cp2, cp0, then cp1 again ends the round.
        assert!(!e.failed());
        assert_eq!(e.current(), "https://cp2:7443");
        assert!(!e.failed());
        assert_eq!(e.current(), "https://cp0:7443");
        assert!(e.failed());
        assert_eq!(e.current(), "https://cp1:7443");
    }

    #[test]
    fn one_url_ends_a_round_at_every_failure() {
        let mut e =
            Endpoints::in_order(&["https://cp:1".to_owned()]).unwrap_or_else(|| panic!("one URL"));
        assert!(e.failed());
        assert!(e.failed());
        assert_eq!(e.current(), "https://cp:1");
        assert_eq!(e.len(), 1);
    }

    #[test]
    fn the_backoff_ceiling_doubles_once_per_round() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(350));
        let mut e = Endpoints::in_order(&urls(3)).unwrap_or_else(|| panic!("three URLs"));
        let mut ceilings = Vec::new();
        for _ in 0..9 {
            let ceiling = b.ceiling();
            assert!(e.wait_after_failure(&mut b) <= ceiling);
            ceilings.push(b.ceiling());
        }
        // Three failures a round: the ceiling moves after each third one, up to the cap.
        let want = [100, 100, 200, 200, 200, 350, 350, 350, 350].map(ms);
        assert_eq!(ceilings, want);
        // A session resets the backoff (its heartbeats are acknowledged) and starts a round.
        b.reset();
        e.succeeded();
        e.wait_after_failure(&mut b);
        assert_eq!(b.ceiling(), ms(100));
    }

    #[test]
    fn duplicates_count_once() {
        let list = ["https://a:1".to_owned(), "https://a:1".to_owned()];
        assert_eq!(Endpoints::in_order(&list).map(|e| e.len()), Some(1));
    }
}
