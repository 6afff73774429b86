//! Gateway, frame check: between a client's socket and the protocol library's decoder.
//! Every message a client sends is read whole and checked against the protocol's layout
//! (its length, its counts, its strings ending inside it) before the decoder sees it. The
//! decoder reads fields without bounds checks and assumes a message is exactly as long as
//! its fields: a damaged message would panic it or shift every message after it. A message
//! that fails the check ends the connection with 08P01 (protocol_violation), as Postgres
//! does; the messages before it are delivered as usual.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest start-up message, and largest message of any kind before authentication or of
/// the kinds that carry no SQL or data (as the decoder's own limit).
const SMALL_LIMIT: usize = 10_000;
/// Largest Query, Parse, Bind or CopyData message (1 GiB, as Postgres and the decoder).
const LARGE_LIMIT: usize = 0x3fff_fffe;
/// CancelRequest: length, code, process id, and a secret key of 4 to 256 bytes.
const CANCEL_MIN: usize = 16;
const CANCEL_MAX: usize = 12 + 256;
const CANCEL_CODE: u32 = 80_877_102;
/// A read from the socket takes at most this much at once.
const READ_CHUNK: usize = 16 * 1024;

/// A message that breaks the protocol: what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

fn bad(message: impl Into<String>) -> Violation {
    Violation(message.into())
}

/// Reads a message body field by field; every read is bounded by the body.
struct Fields<'a> {
    body: &'a [u8],
    what: &'static str,
}

impl<'a> Fields<'a> {
    fn new(body: &'a [u8], what: &'static str) -> Self {
        Self { body, what }
    }

    fn short(&self) -> Violation {
        bad(format!("invalid {} message: it ends early", self.what))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Violation> {
        if self.body.len() < n {
            return Err(self.short());
        }
        let (head, rest) = self.body.split_at(n);
        self.body = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Violation> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Violation> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, Violation> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A string ended by a zero byte inside the body; returns it without the zero.
    fn cstring(&mut self) -> Result<&'a [u8], Violation> {
        match self.body.iter().position(|b| *b == 0) {
            Some(at) => {
                let s = &self.body[..at];
                self.body = &self.body[at + 1..];
                Ok(s)
            }
            None => Err(bad(format!(
                "invalid {} message: a string is not terminated",
                self.what
            ))),
        }
    }

    /// The body must be used up exactly: extra bytes would be read as the next message.
    fn end(&self) -> Result<(), Violation> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(bad(format!(
                "invalid {} message: {} bytes after its last field",
                self.what,
                self.body.len()
            )))
        }
    }
}

/// The name of a message kind, for errors.
fn kind_name(kind: u8) -> &'static str {
    match kind {
        b'Q' => "Query",
        b'P' => "Parse",
        b'B' => "Bind",
        b'E' => "Execute",
        b'D' => "Describe",
        b'C' => "Close",
        b'S' => "Sync",
        b'H' => "Flush",
        b'X' => "Terminate",
        b'd' => "CopyData",
        b'c' => "CopyDone",
        b'f' => "CopyFail",
        b'p' => "authentication",
        _ => "unknown",
    }
}

/// The largest message of `kind` accepted, whole (length field included).
fn limit(kind: u8, authenticated: bool) -> usize {
    match kind {
        b'Q' | b'P' | b'B' | b'd' if authenticated => LARGE_LIMIT,
        _ => SMALL_LIMIT,
    }
}

/// Checks the start-up message (or CancelRequest) `body`, the bytes after its length.
pub fn check_startup(body: &[u8]) -> Result<(), Violation> {
    let mut f = Fields::new(body, "startup");
    let code = f.i32()? as u32;
    if code == CANCEL_CODE {
        let len = body.len() + 4;
        if !(CANCEL_MIN..=CANCEL_MAX).contains(&len) {
            return Err(bad(format!("invalid cancel request: length {len}")));
        }
        return Ok(());
    }
    // Parameters: name, value, ..., then an empty name.
    loop {
        let name = f.cstring()?;
        if name.is_empty() {
            return f.end();
        }
        f.cstring()?;
    }
}

/// Checks the body of a typed message. `first_password`: whether this is the first
/// authentication message of the connection (a SASLInitialResponse: mechanism, then the
/// length of its data and the data).
pub fn check_typed(kind: u8, body: &[u8], first_password: bool) -> Result<(), Violation> {
    let mut f = Fields::new(body, kind_name(kind));
    match kind {
        b'Q' | b'f' => {
            f.cstring()?;
        }
        b'P' => {
            f.cstring()?;
            f.cstring()?;
            let types = f.u16()?;
            f.take(4 * types as usize)?;
        }
        b'B' => check_bind(&mut f)?,
        b'E' => {
            f.cstring()?;
            f.i32()?;
        }
        b'D' | b'C' => {
            let target = f.u8()?;
            if target != b'S' && target != b'P' {
                return Err(bad(format!(
                    "invalid {} message subtype {}",
                    kind_name(kind),
                    target
                )));
            }
            f.cstring()?;
        }
        b'S' | b'H' | b'X' | b'c' => {}
        b'd' => return Ok(()),
        b'p' if first_password => {
            f.cstring()?;
            let len = f.i32()?;
            if len != -1 {
                let len = usize::try_from(len)
                    .map_err(|_| bad("invalid authentication message: negative data length"))?;
                f.take(len)?;
            }
        }
        b'p' => return Ok(()),
        other => {
            return Err(bad(format!(
                "invalid frontend message type {}",
                other as char
            )))
        }
    }
    f.end()
}

/// Bind: portal, statement, parameter formats, parameter values, result formats. The
/// parameter formats must be none, one (for all) or one per value, as Postgres requires.
fn check_bind(f: &mut Fields<'_>) -> Result<(), Violation> {
    f.cstring()?;
    f.cstring()?;
    let formats = f.u16()? as usize;
    check_format_codes(f.take(2 * formats)?)?;
    let values = f.u16()? as usize;
    for _ in 0..values {
        let len = f.i32()?;
        if len < -1 {
            return Err(bad(format!("invalid Bind message: parameter length {len}")));
        }
        if len > 0 {
            f.take(len as usize)?;
        }
    }
    if formats > 1 && formats != values {
        return Err(bad(format!(
            "bind message has {formats} parameter formats but {values} parameters"
        )));
    }
    let results = f.u16()? as usize;
    check_format_codes(f.take(2 * results)?)
}

/// Format codes are 0 (text) or 1 (binary).
fn check_format_codes(codes: &[u8]) -> Result<(), Violation> {
    for c in codes.chunks_exact(2) {
        let code = i16::from_be_bytes([c[0], c[1]]);
        if code != 0 && code != 1 {
            return Err(bad(format!("unsupported format code: {code}")));
        }
    }
    Ok(())
}

/// Where the stream is: before the start-up message (no type byte), or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Startup,
    Typed,
}

/// A client stream whose reads deliver only whole, checked messages (see the module
/// docs). Writes go through unchanged.
pub struct Checked<S> {
    inner: S,
    phase: Phase,
    /// Bytes read, not yet a whole message.
    pending: BytesMut,
    /// Checked messages not yet read by the decoder.
    ready: BytesMut,
    /// Whether an authentication message was already seen.
    password_seen: bool,
    /// Set once the client is authenticated: larger messages are accepted from then on.
    authenticated: bool,
    failed: Option<Violation>,
}

impl<S> Checked<S> {
    /// `buffered`: bytes already read from the client (after TLS negotiation), checked
    /// like the rest.
    pub fn new(inner: S, buffered: BytesMut) -> Self {
        Self {
            inner,
            phase: Phase::Startup,
            pending: buffered,
            ready: BytesMut::new(),
            password_seen: false,
            authenticated: false,
            failed: None,
        }
    }

    /// Whether bytes were read before this stream took over.
    pub fn has_buffered(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream with `problem` at the next read.
    pub fn refuse(&mut self, problem: &str) {
        self.failed = Some(bad(problem));
    }

    /// Called once the client is authenticated.
    pub fn authenticated(&mut self) {
        self.authenticated = true;
    }

    /// Moves every whole message at the front of `pending` to `ready`, checking each;
    /// stops at the first incomplete or broken one.
    fn cut(&mut self) -> Result<(), Violation> {
        loop {
            let (header, kind) = match self.phase {
                Phase::Startup => (4, None),
                Phase::Typed => (5, self.pending.first().copied()),
            };
            if self.pending.len() < header {
                return Ok(());
            }
            let at = header - 4;
            let raw = &self.pending[at..header];
            let len = i32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
            let max = kind.map_or(SMALL_LIMIT, |k| limit(k, self.authenticated));
            let len = match usize::try_from(len) {
                Ok(l) if (4..=max).contains(&l) => l,
                _ => {
                    let what = kind.map_or("startup", kind_name);
                    return Err(bad(format!("invalid {what} message length {len}")));
                }
            };
            if self.pending.len() < at + len {
                // Wait for the rest; reserve once, not per read.
                self.pending.reserve(at + len - self.pending.len());
                return Ok(());
            }
            let body = &self.pending[header..at + len];
            match kind {
                None => {
                    check_startup(body)?;
                    self.phase = Phase::Typed;
                }
                Some(k) => {
                    check_typed(k, body, k == b'p' && !self.password_seen)?;
                    self.password_seen |= k == b'p';
                }
            }
            let message = self.pending.split_to(at + len);
            self.ready.extend_from_slice(&message);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Checked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if !me.ready.is_empty() {
                let n = me.ready.len().min(buf.remaining());
                buf.put_slice(&me.ready[..n]);
                me.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if let Some(v) = &me.failed {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, v.clone())));
            }
            if let Err(v) = me.cut() {
                me.failed = Some(v);
                continue;
            }
            if !me.ready.is_empty() {
                continue;
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut me.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // End of stream: a message cut short is dropped with the connection.
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => me.pending.extend_from_slice(read.filled()),
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Checked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The violation an I/O error of a [`Checked`] stream carries, if it is one.
pub fn violation_of(e: &io::Error) -> Option<&Violation> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Violation>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let body = b"\0\x03\0\0user\0a\0\0";
        let mut m = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    /// Feeds `bytes` through a checked stream; returns what the decoder would read and the
    /// violation, if any.
    async fn through(bytes: Vec<u8>) -> (Vec<u8>, Option<String>) {
        use tokio::io::AsyncReadExt;
        let mut checked = Checked::new(&bytes[..], BytesMut::new());
        let mut out = Vec::new();
        let err = checked.read_to_end(&mut out).await.err();
        (out, err.and_then(|e| violation_of(&e).map(|v| v.0.clone())))
    }

    #[tokio::test]
    async fn whole_messages_pass_and_a_broken_one_stops_the_stream() {
        let mut ok = startup();
        ok.extend(typed(b'Q', b"SELECT 1\0"));
        ok.extend(typed(b'S', b""));
        let (out, err) = through(ok.clone()).await;
        assert_eq!((out, err), (ok.clone(), None));

        let mut broken = ok.clone();
        broken.extend(typed(b'E', b"")); // no portal name, no row count
        broken.extend(typed(b'Q', b"SELECT 2\0"));
        let (out, err) = through(broken).await;
        assert_eq!(out, ok, "the messages before the broken one are delivered");
        assert!(err.is_some_and(|e| e.contains("Execute")));
    }

    #[test]
    fn bind_counts_and_lengths_must_agree() {
        let bind = |formats: &[i16], values: &[Option<&[u8]>], results: &[i16]| {
            let mut b = b"\0\0".to_vec();
            b.extend((formats.len() as u16).to_be_bytes());
            formats.iter().for_each(|f| b.extend(f.to_be_bytes()));
            b.extend((values.len() as u16).to_be_bytes());
            for v in values {
                match v {
                    Some(v) => {
                        b.extend((v.len() as i32).to_be_bytes());
                        b.extend_from_slice(v);
                    }
                    None => b.extend((-1i32).to_be_bytes()),
                }
            }
            b.extend((results.len() as u16).to_be_bytes());
            results.iter().for_each(|f| b.extend(f.to_be_bytes()));
            b
        };
        let one: &[u8] = b"1";
        assert!(check_typed(b'B', &bind(&[], &[Some(one), None], &[1]), false).is_ok());
        assert!(check_typed(b'B', &bind(&[1], &[Some(one), None], &[]), false).is_ok());
        assert!(check_typed(b'B', &bind(&[0, 1], &[Some(one), None], &[0, 1]), false).is_ok());
        assert!(check_typed(b'B', &bind(&[0, 1, 0], &[Some(one)], &[]), false).is_err());
        assert!(check_typed(b'B', &bind(&[7], &[Some(one)], &[]), false).is_err());
        let mut long = bind(&[], &[Some(one)], &[]);
        long.push(0);
        assert!(check_typed(b'B', &long, false).is_err());
        let mut lying = bind(&[], &[Some(one)], &[]);
        lying[8] = 9; // the value's length says 9 bytes
        assert!(check_typed(b'B', &lying, false).is_err());
    }

    #[test]
    fn lengths_outside_the_limits_are_violations() {
        for bytes in [
            vec![b'Q', 0, 0, 0, 3],
            vec![b'Q', 0xff, 0xff, 0xff, 0xff],
            // Before authentication a Query may not be large.
            vec![b'Q', 0, 1, 0, 0],
        ] {
            let mut all = startup();
            all.extend(bytes);
            let mut checked = Checked::new(&b""[..], BytesMut::from(&all[..]));
            checked.cut().ok();
            assert!(checked.cut().is_err(), "{all:?}");
        }
        let mut checked = Checked::new(&b""[..], BytesMut::from(&startup()[..]));
        checked.authenticated();
        checked.pending.extend_from_slice(&[b'Q', 0, 1, 0, 0]);
        assert!(
            checked.cut().is_ok(),
            "a large query after authentication waits for its bytes"
        );
    }

    #[test]
    fn startup_and_cancel_messages() {
        assert!(check_startup(b"\0\x03\0\0user\0a\0database\0\0\0").is_ok());
        assert!(check_startup(b"\0\x03\0\0user\0a\0\0extra").is_err());
        assert!(check_startup(b"\0\x03\0\0user\0a").is_err());
        let mut cancel = CANCEL_CODE.to_be_bytes().to_vec();
        cancel.extend([0, 0, 0, 7, 1, 2, 3, 4]);
        assert!(check_startup(&cancel).is_ok());
        assert!(check_startup(&cancel[..6]).is_err());
    }
}
