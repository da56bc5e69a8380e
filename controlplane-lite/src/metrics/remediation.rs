//! Health remediation's series of `bcctl serve`'s `/metrics`, read from the store at scrape time
//! ([`cpl_store::RemediationCounts`]): remediations by mode and state (started: every one;
//! succeeded, gave up, open), the steps they took by outcome, and the circuit breaker's trips.
//! The store keeps every remediation, so each series only grows (except `active`) and survives a
//! restart or a change of leader.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use cpl_store::RemediationCounts;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabel {
    mode: String,
    state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StepLabel {
    step: String,
    outcome: String,
}

/// `bcctl_remediations`, `bcctl_remediation_steps`, `bcctl_remediation_breaker_trips`.
#[derive(Debug)]
pub(super) struct Gauges {
    by_state: Family<StateLabel, Gauge>,
    steps: Family<StepLabel, Gauge>,
    breaker_trips: Gauge,
}

impl Gauges {
    /// Registers the three families in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let by_state = Family::<StateLabel, Gauge>::default();
        bc_net::metrics::register_described(
            registry,
            "bcctl_remediations",
            "Health remediations recorded, by mode (observe, auto) and state (active, succeeded, gaveUp, cleared, cancelled)",
            None,
            by_state.clone(),
        );
        let steps = Family::<StepLabel, Gauge>::default();
        bc_net::metrics::register_described(
            registry,
            "bcctl_remediation_steps",
            "Remediation steps taken, by step (resetGpu, rebootNode, bmcPowerCycle, reinspect) and outcome (succeeded, failed, skipped)",
            None,
            steps.clone(),
        );
        let breaker_trips = Gauge::default();
        registry.register(
            "bcctl_remediation_breaker_trips",
            "How often a pool's remediation circuit breaker opened (RemediationPaused), summed over pools",
            breaker_trips.clone(),
        );
        Self {
            by_state,
            steps,
            breaker_trips,
        }
    }

    /// Sets every series from `c`.
    pub(super) fn set(&self, c: &RemediationCounts) {
        self.by_state.clear();
        for (mode, state, n) in &c.by_state {
            self.by_state
                .get_or_create(&StateLabel {
                    mode: mode.clone(),
                    state: state.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.steps.clear();
        for (step, outcome, n) in &c.steps {
            self.steps
                .get_or_create(&StepLabel {
                    step: step.clone(),
                    outcome: outcome.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.breaker_trips
            .set(i64::try_from(c.breaker_trips).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry)?;
        Ok(out)
    }

    #[test]
    fn every_count_is_a_series_and_one_that_emptied_goes() -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let g = Gauges::register(&mut registry);
        g.set(&RemediationCounts {
            by_state: vec![
                ("auto".into(), "gaveUp".into(), 1),
                ("auto".into(), "succeeded".into(), 2),
            ],
            steps: vec![("resetGpu".into(), "failed".into(), 1)],
            breaker_trips: 3,
        });
        let text = encoded(&registry)?;
        for line in [
            r#"bcctl_remediations{mode="auto",state="succeeded"} 2"#,
            r#"bcctl_remediations{mode="auto",state="gaveUp"} 1"#,
            r#"bcctl_remediation_steps{step="resetGpu",outcome="failed"} 1"#,
            "bcctl_remediation_breaker_trips 3",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        g.set(&RemediationCounts::default());
        let text = encoded(&registry)?;
        assert!(!text.contains("state=\"succeeded\""), "{text}");
        assert!(
            text.contains("# HELP bcctl_remediations "),
            "still listed: {text}"
        );
        Ok(())
    }
}
