//! Plain facts from SMBIOS types 0 (BIOS), 1 (System), 2 (Baseboard), 3 (Chassis) and
//! 17 (Memory Device), DSP0134 §7. Of several type 2 structures, the hosting board is read.

use bc_protocol::inventory::Dimm;
use smbioslib::{
    MemorySize, MemorySizeExtended, MemorySpeed, SMBiosBaseboardInformation, SMBiosData,
    SMBiosInformation, SMBiosMemoryDevice, SMBiosString, SMBiosStruct,
    SMBiosSystemChassisInformation, SMBiosSystemInformation,
};

/// What the table says, strings trimmed; `None` for an absent string or a bad string index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SmbiosFacts {
    /// `(major, minor)` the table was read as.
    pub version: (u8, u8),
    pub bios_vendor: Option<String>,
    pub bios_version: Option<String>,
    pub bios_date: Option<String>,
    pub system_vendor: Option<String>,
    pub system_product: Option<String>,
    pub system_serial: Option<String>,
    /// The 16 UUID bytes as stored (type 1, offset 08h).
    pub system_uuid_raw: Option<[u8; 16]>,
    pub board_vendor: Option<String>,
    pub board_product: Option<String>,
    pub board_serial: Option<String>,
    pub chassis_vendor: Option<String>,
    /// Chassis type byte without the lock bit (type 3, offset 05h).
    pub chassis_type: Option<u8>,
    pub chassis_serial: Option<String>,
    /// Populated memory devices (type 17 with a non-zero size).
    pub dimms: Vec<Dimm>,
}

impl SmbiosFacts {
    /// The system UUID rendered for this table's version (see [`render_uuid`]).
    pub fn system_uuid(&self) -> Option<String> {
        self.system_uuid_raw.map(|r| render_uuid(&r, self.version))
    }
}

/// Renders a UUID by the SMBIOS rule (DSP0134 §7.2.1): from 2.6 on, the first three fields are
/// stored little-endian; earlier tables are taken as stored (big-endian, RFC 4122 order).
/// Lowercase hex, `8-4-4-4-12`.
pub fn render_uuid(raw: &[u8; 16], version: (u8, u8)) -> String {
    let mut b = *raw;
    if version >= (2, 6) {
        b[0..4].reverse();
        b[4..6].reverse();
        b[6..8].reverse();
    }
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

/// A string of the table through the one identifier normalisation
/// ([`crate::hostroot::clean_identifier`]); `None` when absent, unreadable or blank.
fn text(s: SMBiosString) -> Option<String> {
    crate::hostroot::clean_identifier(&s.ok()?)
}

/// Feature flags (type 2, offset 09h) bit 0: "the board is a hosting board (for example, a
/// motherboard)" (DSP0134 §7.3.1, table 14).
const HOSTING_BOARD: u8 = 0x01;

/// The machine's own board among the type 2 structures: the first whose feature flags say
/// "hosting board", else the first. Blades and modular systems also list interconnect,
/// I/O and management boards, in no fixed order; taking the first made the baseboard serial
/// (and so the hardware key) depend on that order.
fn hosting_board<'a>(data: &'a SMBiosData) -> Option<SMBiosBaseboardInformation<'a>> {
    data.defined_struct_iter::<SMBiosBaseboardInformation<'_>>()
        .find(|b| {
            b.parts()
                .get_field_byte(0x09)
                .is_some_and(|f| f & HOSTING_BOARD != 0)
        })
        .or_else(|| data.first::<SMBiosBaseboardInformation<'_>>())
}

pub(super) fn extract(data: &SMBiosData, version: (u8, u8)) -> SmbiosFacts {
    let mut f = SmbiosFacts {
        version,
        ..SmbiosFacts::default()
    };
    if let Some(b) = data.first::<SMBiosInformation<'_>>() {
        f.bios_vendor = text(b.vendor());
        f.bios_version = text(b.version());
        f.bios_date = text(b.release_date());
    }
    if let Some(s) = data.first::<SMBiosSystemInformation<'_>>() {
        f.system_vendor = text(s.manufacturer());
        f.system_product = text(s.product_name());
        f.system_serial = text(s.serial_number());
        f.system_uuid_raw = s
            .parts()
            .get_field_data(0x08, 0x18)
            .and_then(|r| <[u8; 16]>::try_from(r).ok());
    }
    if let Some(b) = hosting_board(data) {
        f.board_vendor = text(b.manufacturer());
        f.board_product = text(b.product());
        f.board_serial = text(b.serial_number());
    }
    if let Some(c) = data.first::<SMBiosSystemChassisInformation<'_>>() {
        f.chassis_vendor = text(c.manufacturer());
        f.chassis_type = c.parts().get_field_byte(0x05).map(|t| t & 0x7F);
        f.chassis_serial = text(c.serial_number());
    }
    f.dimms = data
        .defined_struct_iter::<SMBiosMemoryDevice<'_>>()
        .filter_map(|m| dimm(&m))
        .collect();
    f
}

const MIB: u64 = 1024 * 1024;

fn dimm(m: &SMBiosMemoryDevice<'_>) -> Option<Dimm> {
    let size_bytes = match m.size()? {
        MemorySize::NotInstalled => return None,
        MemorySize::Unknown => None,
        MemorySize::Kilobytes(k) => Some(u64::from(k) * 1024),
        MemorySize::Megabytes(mb) => Some(u64::from(mb) * MIB),
        MemorySize::SeeExtendedSize => match m.extended_size() {
            Some(MemorySizeExtended::Megabytes(mb)) => Some(u64::from(mb) * MIB),
            _ => None,
        },
    };
    let memory_type = m.memory_type().and_then(|t| {
        let name = format!("{:?}", t.value).to_uppercase();
        (!matches!(name.as_str(), "OTHER" | "UNKNOWN" | "NONE")).then_some(name)
    });
    let speed_mts = match m.speed() {
        Some(MemorySpeed::MTs(s)) => Some(u32::from(s)),
        Some(MemorySpeed::SeeExtendedSpeed) => m.extended_speed().and_then(|e| match e {
            smbioslib::MemorySpeedExtended::MTs(s) => Some(s),
            _ => None,
        }),
        _ => None,
    };
    Some(Dimm {
        locator: text(m.device_locator()),
        size_bytes,
        memory_type,
        speed_mts,
        serial: text(m.serial_number()),
    })
}
