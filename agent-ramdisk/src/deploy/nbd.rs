//! A read-only NBD server (the Network Block Device protocol's "fixed newstyle" handshake and
//! simple replies) for one client on one socket: how `qemu-img`, whose NBD client is built into
//! it, reads the qcow2 file from [`super::qcow2`]'s source. Only what a read-only export needs is
//! answered: `NBD_OPT_GO`/`NBD_OPT_INFO`/`NBD_OPT_EXPORT_NAME`, `NBD_CMD_READ` and
//! `NBD_CMD_DISC`; every other option is refused with `NBD_REP_ERR_UNSUP` (so the client falls
//! back to simple replies) and every other command with `EINVAL`/`EPERM`. The protocol's
//! numbers are those of the NBD project's `doc/proto.md`.

use std::io::{self, Read, Write};

/// "NBDMAGIC", then "IHAVEOPT": the server's greeting and each option's magic.
const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The magic of an option reply.
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The magic of a (simple) request and of a simple reply.
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags: fixed newstyle, no 124 bytes of zeros after `NBD_OPT_EXPORT_NAME`.
const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
/// Transmission flags: the flags field is valid; the export is read-only.
const FLAG_HAS_FLAGS: u16 = 1;
const FLAG_READ_ONLY: u16 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
const REP_ERR_INVALID: u32 = (1 << 31) | 3;
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const EPERM: u32 = 1;
const EIO: u32 = 5;
const EINVAL: u32 = 22;

/// Largest option payload accepted, bytes (an export name and info requests are far smaller).
const MAX_OPTION_BYTES: u32 = 64 * 1024;

/// What the export serves: `size` bytes, read at any offset.
pub trait Export {
    /// The export's size, bytes.
    fn size(&self) -> u64;
    /// Fills `buf` with the bytes at `offset` (`offset + buf.len() <= size()`).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

/// Why serving ended before the client said goodbye.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// The socket failed or the client sent something that is not NBD.
    #[error("NBD: {0}")]
    Protocol(String),
    /// The export could not read what the client asked for (it was answered `EIO`).
    #[error("reading {len} bytes at {offset}: {source}")]
    Export {
        offset: u64,
        len: u32,
        source: io::Error,
    },
}

fn proto(what: &str, e: &io::Error) -> NbdError {
    NbdError::Protocol(format!("{what}: {e}"))
}

/// Serves `export` to the client on `sock` until it sends `NBD_CMD_DISC` or closes the socket
/// (both are `Ok`). Reads are at most `max_read` bytes (announced as the maximum block size; a
/// larger request is refused with `EINVAL`), so one buffer of that size is all it holds. A
/// failing read is answered `EIO` and ends serving with [`NbdError::Export`].
pub fn serve<S: Read + Write>(
    sock: &mut S,
    export: &mut dyn Export,
    max_read: u32,
) -> Result<(), NbdError> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    sock.write_all(&hello).map_err(|e| proto("greeting", &e))?;
    let client_flags = read_u32(sock).map_err(|e| proto("client flags", &e))?;
    if !negotiate(sock, export.size(), max_read, client_flags)? {
        return Ok(());
    }
    transmit(sock, export, max_read)
}

/// The option phase; `false` when the client aborted.
fn negotiate<S: Read + Write>(
    sock: &mut S,
    size: u64,
    max_read: u32,
    client_flags: u32,
) -> Result<bool, NbdError> {
    let flags = FLAG_HAS_FLAGS | FLAG_READ_ONLY;
    loop {
        let mut head = [0u8; 16];
        sock.read_exact(&mut head)
            .map_err(|e| proto("option header", &e))?;
        let magic = u64::from_be_bytes(be(&head[..8]));
        let opt = u32::from_be_bytes(be(&head[8..12]));
        let len = u32::from_be_bytes(be(&head[12..16]));
        if magic != IHAVEOPT {
            return Err(NbdError::Protocol(format!("bad option magic {magic:#x}")));
        }
        if len > MAX_OPTION_BYTES {
            return Err(NbdError::Protocol(format!("option {opt} of {len} bytes")));
        }
        let mut data = vec![0u8; len as usize];
        sock.read_exact(&mut data)
            .map_err(|e| proto("option data", &e))?;
        match opt {
            OPT_EXPORT_NAME => {
                let mut out = Vec::with_capacity(10 + 124);
                out.extend_from_slice(&size.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                if client_flags & u32::from(FLAG_NO_ZEROES) == 0 {
                    out.extend_from_slice(&[0u8; 124]);
                }
                sock.write_all(&out).map_err(|e| proto("export", &e))?;
                return Ok(true);
            }
            OPT_ABORT => {
                // The reply is optional; the client may already have gone.
                let _ = reply(sock, opt, REP_ACK, &[]);
                return Ok(false);
            }
            OPT_INFO | OPT_GO => {
                if !go_data_valid(&data) {
                    reply(sock, opt, REP_ERR_INVALID, &[])?;
                    continue;
                }
                let mut export = Vec::with_capacity(12);
                export.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                export.extend_from_slice(&size.to_be_bytes());
                export.extend_from_slice(&flags.to_be_bytes());
                reply(sock, opt, REP_INFO, &export)?;
                let mut block = Vec::with_capacity(14);
                block.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                block.extend_from_slice(&1u32.to_be_bytes());
                block.extend_from_slice(&4096u32.min(max_read).to_be_bytes());
                block.extend_from_slice(&max_read.to_be_bytes());
                reply(sock, opt, REP_INFO, &block)?;
                reply(sock, opt, REP_ACK, &[])?;
                if opt == OPT_GO {
                    return Ok(true);
                }
            }
            _ => reply(sock, opt, REP_ERR_UNSUP, &[])?,
        }
    }
}

/// `NBD_OPT_GO`'s data: a name length, the name, a count of info requests and those requests.
fn go_data_valid(data: &[u8]) -> bool {
    let Some(name_len) = data.get(..4).map(|b| u32::from_be_bytes(be(b)) as usize) else {
        return false;
    };
    let Some(rest) = data.get(4usize.saturating_add(name_len)..) else {
        return false;
    };
    let Some(count) = rest
        .get(..2)
        .map(|b| usize::from(u16::from_be_bytes(be(b))))
    else {
        return false;
    };
    rest.len() == 2 + 2 * count
}

fn reply<S: Write>(sock: &mut S, opt: u32, kind: u32, data: &[u8]) -> Result<(), NbdError> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&opt.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
    sock.write_all(&out).map_err(|e| proto("option reply", &e))
}

/// The transmission phase: one request at a time, each answered before the next is read.
fn transmit<S: Read + Write>(
    sock: &mut S,
    export: &mut dyn Export,
    max_read: u32,
) -> Result<(), NbdError> {
    let mut buf = Vec::new();
    loop {
        let mut req = [0u8; 28];
        match sock.read_exact(&mut req) {
            Ok(()) => {}
            // A client that closes without NBD_CMD_DISC (qemu-img on its way out) is done.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(proto("request", &e)),
        }
        let magic = u32::from_be_bytes(be(&req[..4]));
        let kind = u16::from_be_bytes(be(&req[6..8]));
        let cookie: [u8; 8] = be(&req[8..16]);
        let offset = u64::from_be_bytes(be(&req[16..24]));
        let len = u32::from_be_bytes(be(&req[24..28]));
        if magic != REQUEST_MAGIC {
            return Err(NbdError::Protocol(format!("bad request magic {magic:#x}")));
        }
        match kind {
            CMD_DISC => return Ok(()),
            CMD_READ => {
                let in_bounds = offset
                    .checked_add(u64::from(len))
                    .is_some_and(|end| end <= export.size());
                if !in_bounds || len > max_read {
                    simple_reply(sock, EINVAL, cookie, &[])?;
                    continue;
                }
                buf.resize(len as usize, 0);
                if let Err(source) = export.read_at(offset, &mut buf) {
                    // Told, so the client fails at once instead of waiting; then serving ends.
                    let _ = simple_reply(sock, EIO, cookie, &[]);
                    return Err(NbdError::Export {
                        offset,
                        len,
                        source,
                    });
                }
                simple_reply(sock, 0, cookie, &buf)?;
            }
            CMD_WRITE => {
                // A write carries its data: read past it to stay in step, then refuse it.
                io::copy(&mut (&mut *sock).take(u64::from(len)), &mut io::sink())
                    .map_err(|e| proto("write data", &e))?;
                simple_reply(sock, EPERM, cookie, &[])?;
            }
            _ => simple_reply(sock, EINVAL, cookie, &[])?,
        }
    }
}

fn simple_reply<S: Write>(
    sock: &mut S,
    error: u32,
    cookie: [u8; 8],
    data: &[u8],
) -> Result<(), NbdError> {
    let mut head = [0u8; 16];
    head[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    head[4..8].copy_from_slice(&error.to_be_bytes());
    head[8..].copy_from_slice(&cookie);
    sock.write_all(&head).map_err(|e| proto("reply", &e))?;
    sock.write_all(data).map_err(|e| proto("reply data", &e))
}

fn read_u32<S: Read>(sock: &mut S) -> io::Result<u32> {
    let mut b = [0u8; 4];
    sock.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// The first `N` bytes of `b` (callers slice exactly `N`).
fn be<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[..N]);
    out
}
