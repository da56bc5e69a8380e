//! Metric families that `/metrics` lists before they have a series.
//!
//! prometheus-client's registry leaves a family with no series out of the exposition entirely:
//! `bcd_gpu_health` before the first diag, `bcd_xid_events_total` before the first XID,
//! `bcctl_nodes_failed` while no node has failed. A scraper (and the test that checks every
//! metric the shipped dashboards and alert rules name, tests/e2e/tests/dashboards.rs) then
//! cannot tell a metric that does not exist from one with nothing to report yet. OpenMetrics
//! allows a family with no samples: these are registered as collectors that always write their
//! `# HELP` and `# TYPE` lines.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::registry::{Registry, Unit};

/// A family written with its descriptor even when it has no series.
#[derive(Debug)]
struct Described<M> {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    metric: M,
}

impl<M> Collector for Described<M>
where
    M: EncodeMetric + std::fmt::Debug + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = encoder.encode_descriptor(
            self.name,
            self.help,
            self.unit.as_ref(),
            self.metric.metric_type(),
        )?;
        self.metric.encode(family)
    }
}

/// Registers `metric` (a clone of the handle the code updates, e.g. a `Family`) as `name` with
/// `help` and `unit` (appended to the name, `_seconds`), listed in every scrape whether or not
/// it has series yet.
pub fn register_described<M>(
    registry: &mut Registry,
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    metric: M,
) where
    M: EncodeMetric + std::fmt::Debug + Send + Sync + 'static,
{
    registry.register_collector(Box::new(Described {
        name,
        help,
        unit,
        metric,
    }));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;

    #[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
    struct L {
        kind: &'static str,
    }

    fn text(r: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, r).unwrap();
        out
    }

    #[test]
    fn an_empty_family_is_listed_and_its_series_follow() {
        let mut r = Registry::default();
        let plain = Family::<L, Counter>::default();
        r.register("plain", "left out while empty", plain.clone());
        let f = Family::<L, Counter>::default();
        register_described(&mut r, "described", "listed while empty", None, f.clone());
        let t = text(&r);
        assert!(!t.contains("plain"), "{t}");
        assert!(t.contains("# HELP described listed while empty\n"), "{t}");
        assert!(t.contains("# TYPE described counter\n"), "{t}");
        f.get_or_create(&L { kind: "a" }).inc();
        let t = text(&r);
        assert!(t.contains("described_total{kind=\"a\"} 1\n"), "{t}");
        assert!(t.ends_with("# EOF\n"), "{t}");
    }
}
