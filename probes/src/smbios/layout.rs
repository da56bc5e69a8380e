//! Where the structures of a table begin and end (DSP0134 §6.1.2: a formatted area of the length
//! in its header, then strings, the set ending with two NULs), to say what smbios-lib does not:
//! a structure that runs past the length the entry point announced. dmidecode prints
//! `<TRUNCATED>` for such a structure, does not decode it, and reports "Wrong DMI structures
//! length"; bcd leaves it out as well (the table is cut at the announced length) and adds a note.

/// Type 127: end of table.
const END_OF_TABLE: u8 = 127;

/// Notes about the layout of `table`, of which the entry point announced `announced` bytes
/// (`None` for a raw table with no entry point): the first structure that runs past the
/// announced length, has no string-set terminator, or announces a formatted length below the
/// 4-byte header. The walk stops there, or at the end-of-table structure.
pub fn notes(table: &[u8], announced: Option<usize>) -> Vec<String> {
    let limit = announced.unwrap_or(table.len());
    let mut at = 0usize;
    let mut out = Vec::new();
    while let Some(head) = table.get(at..at + 4) {
        if at >= limit {
            break;
        }
        let (kind, len) = (head[0], usize::from(head[1]));
        let handle = u16::from_le_bytes([head[2], head[3]]);
        let what = format!("structure type {kind} (handle {handle:#06x}) at offset {at}");
        if len < 4 {
            out.push(format!(
                "{what} announces a length of {len} bytes, less than its header: the table is broken from there"
            ));
            break;
        }
        // The string set ends with two NULs; a structure without strings is followed by two.
        let end = table
            .get(at + len..)
            .and_then(|rest| rest.windows(2).position(|w| w == [0, 0]))
            .map(|p| at + len + p + 2);
        match end {
            Some(end) if end <= limit => {}
            Some(end) => {
                out.push(format!(
                    "{what} ends at byte {end}, past the table's announced length of {limit} bytes: truncated, not decoded"
                ));
                break;
            }
            None => {
                out.push(format!(
                    "{what} runs past the end of the table ({limit} bytes): no end of its strings, not decoded"
                ));
                break;
            }
        }
        if kind == END_OF_TABLE {
            break;
        }
        at = end.unwrap_or(limit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Type 1 (27 bytes of formatted area, no strings), then type 127.
    fn table() -> Vec<u8> {
        let mut t = vec![1u8, 27, 0x01, 0x00];
        t.resize(27, 0);
        t.extend_from_slice(&[0, 0]);
        t.extend_from_slice(&[127, 4, 0xff, 0xfe, 0, 0]);
        t
    }

    #[test]
    fn a_table_that_fits_has_no_notes() {
        let t = table();
        assert!(notes(&t, Some(t.len())).is_empty());
        assert!(notes(&t, None).is_empty());
        // A maximum larger than the structures (SMBIOS 3 entry points) is fine.
        assert!(notes(&t, Some(4096)).is_empty());
    }

    #[test]
    fn a_structure_past_the_announced_length_is_noted() {
        let t = table();
        let n = notes(&t, Some(20));
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(
            n[0].contains("type 1 (handle 0x0001) at offset 0 ends at byte 29")
                && n[0].contains("announced length of 20 bytes"),
            "{}",
            n[0]
        );
        // The end-of-table structure past the length counts too.
        let n = notes(&t, Some(30));
        assert!(n[0].contains("type 127"), "{n:?}");
    }

    #[test]
    fn unterminated_and_short_structures_are_noted() {
        let mut t = table();
        t.truncate(28);
        let n = notes(&t, None);
        assert!(n[0].contains("no end of its strings"), "{n:?}");
        let n = notes(&[1, 2, 0, 0, 0, 0], None);
        assert!(n[0].contains("less than its header"), "{n:?}");
        assert!(notes(&[], Some(10)).is_empty());
    }
}
