//! Hardware identifiers (DESIGN.md "Hardware key"): normalization, the junk rules, the
//! `kind:value` lines the hardware key is made of, and their per-identifier digests.
//!
//! # Background
//! Firmware is full of placeholders (`To Be Filled By O.E.M.`, `Default string`), copied serials
//! (`1234567890` on every board of a product line), placeholder UUIDs and shared MACs. Each rule
//! here names what it caught, so `bcd hardware-key` can say why a candidate was dropped.
//!
//! # Design
//! Two sides must spell an identifier the same way: the machine (`bcd-probes`' hardware key,
//! computed from SMBIOS and sysfs) and the control plane, which stores what a BMC reported at
//! enrollment (`bmc.verify`) so the ramdisk's hardware key can later be matched against it.
//! Both build their lines with [`line`] and hash them with [`digest`], so the digest of a BMC's
//! `UUID` is the digest of the same machine's SMBIOS system UUID.
use std::fmt;

/// Why a candidate did not become an identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Nothing left after trimming.
    Empty,
    /// A vendor placeholder string.
    Placeholder(String),
    /// One character repeated (`000000`, `XXXXXXXX`, `ffffffff-ffff-...`).
    OneCharacterRun,
    /// Consecutive digits (`0123456789`, `1234567890`).
    SequentialDigits,
    /// Fewer than [`MIN_ALNUM`] letters and digits.
    TooShort,
    /// Not 32 hex digits.
    MalformedUuid,
    /// A UUID known to be shipped on many machines.
    PlaceholderUuid,
    /// A UUID that many machines share, and why bcd knows it: a public deny list, a pattern
    /// (`*-ffff-ffff-ffff-ffffffffffff`, one byte repeated) or Dell's blank-tag form.
    SharedUuid(String),
    /// Not six `:`-separated hex bytes.
    MalformedMac,
    /// `00:00:00:00:00:00`.
    ZeroMac,
    /// Group bit set: not a station address.
    MulticastMac,
    /// Locally administered bit set: made up by software, not burned in.
    LocallyAdministeredMac,
    /// A MAC that many machines share (BMC USB network functions).
    SharedMac,
    /// An interface without a `device` link (bridge, bond, veth, tunnel).
    VirtualInterface,
    /// A BMC's USB network function (`cdc_ether`, `rndis_host`): same MAC on every host.
    BmcUsbNic(String),
    /// Only the current `address` is known and `addr_assign_type` is not 0.
    NotPermanent(String),
    /// The value was not readable (permission, missing file).
    Unreadable(String),
    /// Equal, after normalization, to an identifier already counted.
    DuplicateOf(String),
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "empty"),
            Self::Placeholder(p) => write!(f, "placeholder {p:?}"),
            Self::OneCharacterRun => write!(f, "one character repeated"),
            Self::SequentialDigits => write!(f, "sequential digits"),
            Self::TooShort => write!(f, "fewer than {MIN_ALNUM} letters and digits"),
            Self::MalformedUuid => write!(f, "not a UUID"),
            Self::PlaceholderUuid => write!(f, "well-known placeholder UUID"),
            Self::SharedUuid(why) => write!(f, "UUID shared by many machines: {why}"),
            Self::MalformedMac => write!(f, "not a 48-bit MAC"),
            Self::ZeroMac => write!(f, "zero MAC"),
            Self::MulticastMac => write!(f, "multicast MAC"),
            Self::LocallyAdministeredMac => write!(f, "locally administered MAC"),
            Self::SharedMac => write!(f, "MAC shared by many machines"),
            Self::VirtualInterface => write!(f, "virtual interface (no device link)"),
            Self::BmcUsbNic(d) => write!(f, "BMC USB network function (driver {d})"),
            Self::NotPermanent(why) => write!(f, "no permanent MAC ({why})"),
            Self::Unreadable(why) => write!(f, "unreadable: {why}"),
            Self::DuplicateOf(other) => write!(f, "same value as {other}"),
        }
    }
}

/// What kind of identifier a candidate is; the prefix of its `kind:value` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    SystemUuid,
    SystemSerial,
    BaseboardSerial,
    ChassisSerial,
    Mac,
}

impl Kind {
    /// The line prefix: `system-uuid`, `system-serial`, `baseboard-serial`, `chassis-serial`,
    /// `mac`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SystemUuid => "system-uuid",
            Self::SystemSerial => "system-serial",
            Self::BaseboardSerial => "baseboard-serial",
            Self::ChassisSerial => "chassis-serial",
            Self::Mac => "mac",
        }
    }
}

/// The `kind:value` line an identifier counts as (the value already normalized and checked).
pub fn line(kind: Kind, value: &str) -> String {
    format!("{}:{value}", kind.as_str())
}

/// The per-identifier digest: lowercase hex SHA-256 of its line (what `HardwareIdentity`
/// carries in `identifier_digests`).
pub fn digest(line: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(line.as_bytes()))
}

/// The line of a system UUID as any source reports it (SMBIOS, a BMC's `ComputerSystem.UUID`):
/// `system-uuid:<canonical>`, or `mac:<mac>` for a UUID made of ten zero bytes and a MAC.
pub fn uuid_line(raw: &str) -> Result<String, Rejection> {
    match check_uuid(raw)? {
        UuidVerdict::Uuid(u) => Ok(line(Kind::SystemUuid, &u)),
        UuidVerdict::EmbeddedMac(m) => check_mac(&m).map(|m| line(Kind::Mac, &m)),
    }
}

/// The line of a serial of `kind` as any source reports it.
pub fn serial_line(kind: Kind, raw: &str) -> Result<String, Rejection> {
    let n = normalize(raw);
    check_serial(&n).map(|()| line(kind, &n))
}

/// The line of a NIC's (permanent) MAC.
pub fn mac_line(raw: &str) -> Result<String, Rejection> {
    check_mac(raw).map(|m| line(Kind::Mac, &m))
}

/// Firmware strings come padded: fixed-width fields filled with spaces, tabs or NULs, some
/// BIOSes with `0xFF`. So: NUL bytes are dropped wherever they are (a C string field never holds
/// one on purpose); other control characters (tab, CR, LF, ...) become a space; whitespace and
/// the replacement character (from bytes that are not UTF-8, such as `0xFF` padding) are trimmed
/// from both ends. Inner spaces stay (the hardware key and the inventory report values as
/// written). `None` when nothing is left.
pub fn clean_identifier(raw: &str) -> Option<String> {
    let s: String = raw
        .chars()
        .filter(|c| *c != '\0')
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let t = s.trim_matches(|c: char| c.is_whitespace() || c == char::REPLACEMENT_CHARACTER);
    (!t.is_empty()).then(|| t.to_owned())
}

/// Shortest serial that can name one machine.
pub const MIN_ALNUM: usize = 4;

/// Placeholder strings seen in real tables (compared after [`normalize`], so lowercase and
/// without edge punctuation).
const PLACEHOLDERS: &[&str] = &[
    "to be filled by o.e.m",
    "to be filled by oem",
    "to be filled",
    "default string",
    "default",
    "system serial number",
    "chassis serial number",
    "base board serial number",
    "baseboard serial number",
    "serial number",
    "serial",
    "none",
    "null",
    "n/a",
    "na",
    "not specified",
    "not applicable",
    "not available",
    "not present",
    "not settable",
    "unknown",
    "invalid",
    "empty",
    "oem",
    "o.e.m",
    "system product name",
    "type1productconfigid",
];

/// UUIDs (rendered) that firmware ships on many machines.
const PLACEHOLDER_UUIDS: &[&str] = &[
    // AMI Aptio "Default string" builds (Beelink, many mini PCs), in both byte orders.
    "03000200-0400-0500-0006-000700080009",
    "00020003-0004-0005-0006-000700080009",
    "12345678-1234-5678-90ab-cddeefaabbcc",
    "01234567-89ab-cdef-0123-456789abcdef",
    "00112233-4455-6677-8899-aabbccddeeff",
];

/// FreeBSD's deny list of SMBIOS system UUIDs (`libexec/rc/rc.d/hostid`, `valid_hostid`): values
/// firmware ships on many boards, which FreeBSD refuses as a host UUID. The all-zero and
/// one-repeated-byte entries are caught by the repeated-byte rule, `*-ffff-ffff-ffff-ffffffffffff`
/// by [`TRAILING_FF`].
const FREEBSD_DENY_LIST: &[&str] = &[
    "00020003-0004-0005-0006-000700080009",
    "03000200-0400-0500-0006-000700080009",
    "07090201-0103-0301-0807-060504030201",
    "11111111-2222-3333-4444-555555555555",
    "4c4c4544-0000-2010-8020-80c04f202020",
    "890e2d14-cacd-45d1-ae66-bc80e8bfeb0f",
    "8e275844-178f-44a8-aceb-a7d7e5178c63",
    "dc698397-fa54-4cf2-82c8-b1b5307a6a7f",
    // Bytes 00 to 0f in order: an unprogrammed board's test pattern (fleet tools' lists).
    "00010203-0405-0607-0809-0a0b0c0d0e0f",
];

/// FreeBSD's `*-ffff-ffff-ffff-ffffffffffff` pattern: everything but the first field erased.
const TRAILING_FF: &str = "-ffff-ffff-ffff-ffffffffffff";

/// Dell's system UUID is "DELL" (`4c4c4544`), the 7-character service tag spread over bytes 5,
/// 6, 9, 10 (with its high bit set), 13, 14 and 15, and the fixed bytes `c0 4f` at 11-12:
/// `4c4c4544-00t2-t310-80t4-t1c04ft5t6t7` (the R630 fixture's `4c4c4544-0039-3010-8048-
/// b7c04f384432` is tag `790H8D2`). A board whose tag was never programmed (a replacement
/// motherboard) carries blanks (0x20) or zeros there, and every such Dell shares the UUID.
const DELL_PREFIX: [u8; 4] = [0x4c, 0x4c, 0x45, 0x44];
/// Byte positions of the service tag's characters, in tag order.
const DELL_TAG_BYTES: [usize; 7] = [10, 5, 6, 9, 13, 14, 15];

/// The service tag a Dell-layout UUID (rendered byte order) carries, as written (blanks and NULs
/// included); `None` when `b` is not in Dell's layout.
fn dell_tag(b: &[u8; 16]) -> Option<String> {
    // "DELL" is 44 45 4c 4c; stored little-endian as the first field it renders as 4c4c4544.
    if b[..4] != DELL_PREFIX || b[11..13] != [0xc0, 0x4f] {
        return None;
    }
    Some(
        DELL_TAG_BYTES
            .iter()
            .map(|&i| char::from(b[i] & 0x7f))
            .collect(),
    )
}

/// The first three fields byte-swapped: the other reading of a UUID (SMBIOS before 2.6 stored
/// them big-endian, from 2.6 little-endian; firmware that claims one and writes the other is
/// common), so a deny-listed value is caught in either order.
fn swap_fields(b: &[u8; 16]) -> [u8; 16] {
    let mut s = *b;
    s[0..4].reverse();
    s[4..6].reverse();
    s[6..8].reverse();
    s
}

fn render(b: &[u8; 16]) -> String {
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The rules for UUIDs many machines share, on the 16 bytes in rendered order.
fn shared_uuid(b: &[u8; 16]) -> Option<String> {
    if b.iter().all(|x| *x == b[0]) {
        return Some(format!("one byte repeated (0x{:02x})", b[0]));
    }
    for (form, order) in [(*b, ""), (swap_fields(b), " (in the other byte order)")] {
        if let Some(tag) = dell_tag(&form) {
            let n = normalize(&tag);
            match check_serial(&n) {
                Ok(()) => {}
                Err(Rejection::Empty) => {
                    return Some(format!(
                        "Dell UUID with a blank service tag (never programmed){order}"
                    ));
                }
                Err(why) => {
                    return Some(format!(
                        "Dell UUID whose service tag {n:?} is junk ({why}){order}"
                    ));
                }
            }
        }
        let r = render(&form);
        if FREEBSD_DENY_LIST.contains(&r.as_str()) {
            return Some(format!(
                "on FreeBSD's hostid deny list (libexec/rc/rc.d/hostid){order}"
            ));
        }
    }
    render(b)
        .ends_with(TRAILING_FF)
        .then(|| "ends in ffff-ffff-ffff-ffffffffffff (FreeBSD's hostid deny list)".to_owned())
}

/// MACs that BMC USB network functions present on every host (OpenBMC's `usb0` host side).
const SHARED_MACS: &[&str] = &["02:00:00:00:00:02", "02:00:00:00:00:01"];

/// Drivers of BMC USB network functions: their MAC belongs to a whole product line.
pub const BMC_USB_DRIVERS: &[&str] = &["cdc_ether", "rndis_host", "cdc_eem", "cdc_ncm"];

/// Cleans (NULs and control characters out, [`clean_identifier`]), trims
/// whitespace and punctuation at both ends and lowercases (`.790H8D2.CN74.` becomes
/// `790h8d2.cn74`).
pub fn normalize(raw: &str) -> String {
    clean_identifier(raw)
        .unwrap_or_default()
        .trim_matches(|c: char| !c.is_alphanumeric())
        .to_lowercase()
}

/// Letters and digits only: the form two values are compared in for independence.
pub fn compact(normalized: &str) -> String {
    normalized.chars().filter(|c| c.is_alphanumeric()).collect()
}

/// Checks a normalized serial.
pub fn check_serial(v: &str) -> Result<(), Rejection> {
    if v.is_empty() {
        return Err(Rejection::Empty);
    }
    if let Some(p) = PLACEHOLDERS.iter().find(|p| **p == v) {
        return Err(Rejection::Placeholder((*p).to_owned()));
    }
    check_compact(&compact(v))
}

fn check_compact(c: &str) -> Result<(), Rejection> {
    let mut chars = c.chars();
    if let Some(first) = chars.next()
        && chars.all(|x| x == first)
    {
        return Err(if c.chars().count() >= MIN_ALNUM {
            Rejection::OneCharacterRun
        } else {
            Rejection::TooShort
        });
    }
    if c.chars().count() < MIN_ALNUM {
        return Err(Rejection::TooShort);
    }
    if c.len() >= 5 && "01234567890123456789".contains(c) {
        return Err(Rejection::SequentialDigits);
    }
    Ok(())
}

/// What a UUID turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UuidVerdict {
    /// A real UUID, canonical lowercase `8-4-4-4-12`.
    Uuid(String),
    /// Ten zero bytes and a MAC (Supermicro, ASRock Rack): it counts as that MAC.
    EmbeddedMac(String),
}

/// Checks a rendered UUID (`8-4-4-4-12`, any case).
pub fn check_uuid(rendered: &str) -> Result<UuidVerdict, Rejection> {
    let hex: String = rendered
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '-' && *c != '{' && *c != '}')
        .collect::<String>()
        .to_lowercase();
    if hex.is_empty() {
        return Err(Rejection::Empty);
    }
    if let Some(p) = PLACEHOLDERS.iter().find(|p| **p == normalize(rendered)) {
        return Err(Rejection::Placeholder((*p).to_owned()));
    }
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Rejection::MalformedUuid);
    }
    let canon = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    if hex.chars().all(|c| c == '0') || hex.chars().all(|c| c == 'f') {
        return Err(Rejection::OneCharacterRun);
    }
    if PLACEHOLDER_UUIDS.contains(&canon.as_str()) {
        return Err(Rejection::PlaceholderUuid);
    }
    let mut bytes = [0u8; 16];
    for (b, i) in bytes.iter_mut().zip((0..32).step_by(2)) {
        *b = u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| Rejection::MalformedUuid)?;
    }
    if let Some(why) = shared_uuid(&bytes) {
        return Err(Rejection::SharedUuid(why));
    }
    if hex[..20].chars().all(|c| c == '0') {
        let m = &hex[20..];
        let mac = (0..6)
            .map(|i| &m[i * 2..i * 2 + 2])
            .collect::<Vec<_>>()
            .join(":");
        return Ok(UuidVerdict::EmbeddedMac(mac));
    }
    check_compact(&hex).map_err(|_| Rejection::PlaceholderUuid)?;
    Ok(UuidVerdict::Uuid(canon))
}

/// Checks a MAC (`aa:bb:cc:dd:ee:ff`, any case, `-` or `:`); returns it lowercase with `:`.
pub fn check_mac(raw: &str) -> Result<String, Rejection> {
    let parts: Vec<&str> = raw.trim().split([':', '-']).collect();
    if parts.len() != 6 || parts.iter().any(|p| p.len() != 2) {
        return Err(Rejection::MalformedMac);
    }
    let mut bytes = [0u8; 6];
    for (b, p) in bytes.iter_mut().zip(&parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| Rejection::MalformedMac)?;
    }
    let mac = parts.join(":").to_lowercase();
    if bytes.iter().all(|b| *b == 0) {
        return Err(Rejection::ZeroMac);
    }
    if SHARED_MACS.contains(&mac.as_str()) {
        return Err(Rejection::SharedMac);
    }
    if bytes[0] & 0x01 != 0 {
        return Err(Rejection::MulticastMac);
    }
    if bytes[0] & 0x02 != 0 {
        return Err(Rejection::LocallyAdministeredMac);
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_trims_edges_and_case() {
        assert_eq!(
            normalize("  .790H8D2.CN7475162M0382. "),
            "790h8d2.cn7475162m0382"
        );
        assert_eq!(normalize("1234567890."), "1234567890");
        assert_eq!(
            normalize("\tTo Be Filled By O.E.M. "),
            "to be filled by o.e.m"
        );
    }

    #[test]
    fn junk_serials_are_rejected() {
        for (raw, want) in [
            ("", Rejection::Empty),
            (
                "To Be Filled By O.E.M.",
                Rejection::Placeholder("to be filled by o.e.m".into()),
            ),
            (
                "Default string",
                Rejection::Placeholder("default string".into()),
            ),
            (
                "System Serial Number",
                Rejection::Placeholder("system serial number".into()),
            ),
            ("0123456789", Rejection::SequentialDigits),
            ("1234567890", Rejection::SequentialDigits),
            ("1234567890.", Rejection::SequentialDigits),
            ("00000000", Rejection::OneCharacterRun),
            ("XXXXXXXXXX", Rejection::OneCharacterRun),
            ("ab", Rejection::TooShort),
        ] {
            assert_eq!(check_serial(&normalize(raw)), Err(want), "{raw:?}");
        }
        assert_eq!(check_serial(&normalize("E09626824801435")), Ok(()));
        assert_eq!(check_serial(&normalize("790H8D2")), Ok(()));
    }

    #[test]
    fn uuids() {
        assert_eq!(
            check_uuid("03000200-0400-0500-0006-000700080009"),
            Err(Rejection::PlaceholderUuid)
        );
        assert_eq!(
            check_uuid("00000000-0000-0000-0000-000000000000"),
            Err(Rejection::OneCharacterRun)
        );
        assert_eq!(
            check_uuid("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"),
            Err(Rejection::OneCharacterRun)
        );
        assert_eq!(
            check_uuid("00000000-0000-0000-0000-D05099FAA835"),
            Ok(UuidVerdict::EmbeddedMac("d0:50:99:fa:a8:35".into()))
        );
        assert_eq!(
            check_uuid("B26849EF-4FB0-4E03-A9D1-1A165A40C8D7"),
            Ok(UuidVerdict::Uuid(
                "b26849ef-4fb0-4e03-a9d1-1a165a40c8d7".into()
            ))
        );
        assert_eq!(check_uuid("not-a-uuid"), Err(Rejection::MalformedUuid));
        assert_eq!(
            check_uuid("Not Settable"),
            Err(Rejection::Placeholder("not settable".into()))
        );
    }

    #[test]
    fn macs() {
        assert_eq!(
            check_mac("00:25:90:EB:96:28"),
            Ok("00:25:90:eb:96:28".into())
        );
        assert_eq!(check_mac("00:00:00:00:00:00"), Err(Rejection::ZeroMac));
        assert_eq!(check_mac("01:01:01:01:01:01"), Err(Rejection::MulticastMac));
        assert_eq!(check_mac("ff:ff:ff:ff:ff:ff"), Err(Rejection::MulticastMac));
        assert_eq!(
            check_mac("02:42:ac:11:00:02"),
            Err(Rejection::LocallyAdministeredMac)
        );
        assert_eq!(check_mac("02:00:00:00:00:02"), Err(Rejection::SharedMac));
        assert_eq!(check_mac("00:25:90"), Err(Rejection::MalformedMac));
        assert_eq!(
            check_mac("80:00:02:08:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0f:ab:cd"),
            Err(Rejection::MalformedMac)
        );
        assert_eq!(check_mac("zz:25:90:eb:96:28"), Err(Rejection::MalformedMac));
    }

    #[test]
    fn lines_and_digests_are_the_hardware_keys() {
        assert_eq!(
            uuid_line("B26849EF-4FB0-4E03-A9D1-1A165A40C8D7").as_deref(),
            Ok("system-uuid:b26849ef-4fb0-4e03-a9d1-1a165a40c8d7")
        );
        assert_eq!(
            uuid_line("00000000-0000-0000-0000-D05099FAA835").as_deref(),
            Ok("mac:d0:50:99:fa:a8:35")
        );
        assert_eq!(
            serial_line(Kind::SystemSerial, " .790H8D2. ").as_deref(),
            Ok("system-serial:790h8d2")
        );
        assert_eq!(
            mac_line("00-25-90-EB-96-28").as_deref(),
            Ok("mac:00:25:90:eb:96:28")
        );
        assert_eq!(
            digest("x"),
            "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
        );
    }
}
