//! NVLink checks of `diag.nvml`: which links should be up, by product, and the links' error
//! counters.
//!
//! Not every product wires every link NVML reports: two H100 NVL cards joined by their three
//! bridges use 12 of the 18 links by design (Azure/azurehpc-health-checks#162), an H800 has 8.
//! So the number of active links a GPU should have comes from [`EXPECTED_LINKS`] (by the NVML
//! product name), or from the pool's hardware profile (`expectedNvlinksPerGpu`, which wins,
//! 0 meaning "no NVLink expected"). Fewer active links than expected fails, calling for
//! peer-to-peer traffic to be drained; links beyond the expected count that are down are not a
//! fault. A product the table does not know keeps the older rule: every link NVML reports
//! should be up once any is.

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError as WrapperError;

use super::diag::Check;
use super::xid::RecommendedAction;

/// Links NVML can report per GPU (`NVML_NVLINK_MAX_LINKS`).
pub const NVLINK_MAX_LINKS: u32 = 18;

/// Active NVLink links per GPU as each product is built, by a part of its NVML name
/// (`nvmlDeviceGetName`); the first entry the name contains wins, so the more specific names
/// come first. From NVIDIA's product specifications: NVLink 3 has 12 links per A100 (SXM4 to
/// NVSwitches, PCIe through three bridges), the export parts A800/H800 8; NVLink 4 has 18 per
/// H100/H200 SXM, of which an H100 NVL or H100 PCIe pair wires 12 through its three bridges;
/// NVLink 5 has 18 per Blackwell GPU; V100 SXM has 6.
pub const EXPECTED_LINKS: &[(&str, u32)] = &[
    ("H100 NVL", 12),
    ("H100 PCIe", 12),
    ("H800", 8),
    ("A800", 8),
    ("H100", 18),
    ("H200", 18),
    ("A100", 12),
    ("GB300", 18),
    ("GB200", 18),
    ("B300", 18),
    ("B200", 18),
    ("B100", 18),
    ("V100-SXM", 6),
];

/// The active links a GPU named `name` should have, by [`EXPECTED_LINKS`].
pub fn expected_links(name: &str) -> Option<u32> {
    EXPECTED_LINKS
        .iter()
        .find(|(part, _)| name.contains(part))
        .map(|(_, n)| *n)
}

/// Where the expectation came from, for the check's detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Profile,
    Product,
}

/// The state of each link NVML answers for: `Ok(None)` for a GPU without NVLink.
fn link_states(dev: &Device<'_>) -> Result<Option<Vec<bool>>, WrapperError> {
    let mut states = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        match dev.link_wrapper_for(link).is_active() {
            Ok(up) => states.push(up),
            Err(WrapperError::NotSupported) if link == 0 => return Ok(None),
            Err(WrapperError::NotSupported | WrapperError::InvalidArg) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(Some(states))
}

/// `nvlink` (`nvmlDeviceGetNvLinkState` per link) against the expected active links (see the
/// module docs). `profile` is the hardware profile's `expectedNvlinksPerGpu`.
pub(crate) fn check(dev: &Device<'_>, name: &str, profile: Option<u32>) -> Check {
    const NAME: &str = "nvlink";
    let states = match link_states(dev) {
        Ok(Some(s)) => s,
        Ok(None) => return Check::pass(NAME, "notSupported").detail("no NVLink"),
        Err(e) => return super::checks::query_failed(NAME, &e),
    };
    let active = u32::try_from(states.iter().filter(|up| **up).count()).unwrap_or(u32::MAX);
    let inactive: Vec<usize> = (0..states.len()).filter(|i| !states[*i]).collect();
    let total = states.len();
    let value = format!("{active}/{total} active");
    let expected = match (profile, expected_links(name)) {
        (Some(n), _) => Some((n, Source::Profile)),
        (None, Some(n)) => Some((n, Source::Product)),
        (None, None) => None,
    };
    let Some((want, source)) = expected else {
        // A product bcd does not know: every link it reports should be up once any is.
        return if inactive.is_empty() {
            Check::pass(NAME, value)
        } else if active == 0 {
            // Also what a board without NVLink bridges or switches reports; whether NVLink is
            // expected is the hardware profile's business.
            Check::warn(NAME, value).detail("no active NVLink links")
        } else {
            Check::fail(NAME, value, RecommendedAction::DrainP2p)
                .threshold(format!("{total}/{total} active"))
                .detail(format!("inactive links: {inactive:?}"))
        };
    };
    let why = match source {
        Source::Profile => "the hardware profile's expectedNvlinksPerGpu".to_owned(),
        Source::Product => format!("{name} is built with {want} active"),
    };
    let threshold = format!("{want} active");
    if active >= want {
        let c = Check::pass(NAME, value).threshold(threshold);
        return if inactive.is_empty() || want == 0 {
            c
        } else {
            c.detail(format!(
                "links {inactive:?} are not wired ({why}); not a fault"
            ))
        };
    }
    if active == 0 && source == Source::Product {
        // PCIe products run without their bridges too; the profile says whether they must not.
        return Check::warn(NAME, value)
            .threshold(threshold)
            .detail(format!("no active NVLink links ({why} when bridged)"));
    }
    Check::fail(NAME, value, RecommendedAction::DrainP2p)
        .threshold(threshold)
        .detail(format!(
            "{} link(s) that should be up are down ({why}); inactive links: {inactive:?}",
            want - active
        ))
}

/// `nvlinkErrors` (`nvmlDeviceGetNvLinkErrorCounter` per active link: data link replays and
/// recoveries, flow-control and data CRC errors, counted since the driver loaded): any warns,
/// naming each link's counts. A link that keeps replaying or recovering is degrading before it
/// goes down.
pub(crate) fn errors(dev: &Device<'_>) -> Check {
    const NAME: &str = "nvlinkErrors";
    let states = match link_states(dev) {
        Ok(Some(s)) => s,
        Ok(None) => return Check::pass(NAME, "notSupported").detail("no NVLink"),
        Err(e) => return super::checks::query_failed(NAME, &e),
    };
    let counters = [
        (ErrorCounter::DlReplay, "replay"),
        (ErrorCounter::DlRecovery, "recovery"),
        (ErrorCounter::DlCrcFlit, "crcFlit"),
        (ErrorCounter::DlCrcData, "crcData"),
    ];
    let mut total = 0u64;
    let mut per_link = Vec::new();
    for (link, _) in states.iter().enumerate().filter(|(_, up)| **up) {
        let l = dev.link_wrapper_for(u32::try_from(link).unwrap_or(u32::MAX));
        let mut counts = Vec::new();
        for (counter, label) in counters {
            match l.error_counter(counter) {
                Ok(0) => {}
                Ok(n) => {
                    total = total.saturating_add(n);
                    counts.push(format!("{label} {n}"));
                }
                Err(WrapperError::NotSupported) => {}
                Err(e) => return super::checks::query_failed(NAME, &e),
            }
        }
        if !counts.is_empty() {
            per_link.push(format!("link {link}: {}", counts.join(", ")));
        }
    }
    let c = if total == 0 {
        Check::pass(NAME, 0)
    } else {
        Check::warn(NAME, total).detail(per_link.join("; "))
    };
    c.threshold(0).unit("count")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_finds_the_most_specific_product_first() {
        assert_eq!(expected_links("NVIDIA H100 NVL"), Some(12));
        assert_eq!(expected_links("NVIDIA H100 PCIe"), Some(12));
        assert_eq!(expected_links("NVIDIA H100 80GB HBM3"), Some(18));
        assert_eq!(expected_links("NVIDIA H800"), Some(8));
        assert_eq!(expected_links("NVIDIA A100-SXM4-80GB"), Some(12));
        assert_eq!(expected_links("NVIDIA A800-SXM4-80GB"), Some(8));
        assert_eq!(expected_links("NVIDIA GB200"), Some(18));
        assert_eq!(expected_links("NVIDIA B200"), Some(18));
        assert_eq!(expected_links("Tesla V100-SXM2-32GB"), Some(6));
        assert_eq!(expected_links("NVIDIA L40S"), None);
        assert_eq!(expected_links("NVIDIA T4"), None);
    }
}
