//! The relay's connection under a byte budget. lettre reads a reply line whole before it checks
//! the line's length, so a relay that sends without a line end would grow one line in memory for
//! as long as the timeout lets it (10 s of a fast link is gigabytes). Here every byte the relay
//! sends is counted beneath TLS, and reading fails once one mail's exchange has taken more than
//! [`BUDGET`]: the mail then ends as any broken connection does at that step.

use lettre::transport::smtp::client::AsyncTokioStream;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The bytes a relay may send for one mail: its greeting, TLS handshake, `EHLO` and login when
/// the connection is new, and its answers to `MAIL`, `RCPT`, `DATA` and the content. A real
/// exchange is a few kilobytes (a certificate chain is the most of it); lettre's own bound on a
/// reply is 100,000 bytes.
pub const BUDGET: usize = 256 * 1024;

/// What a connection has read since its budget was last renewed; shared with the stream.
#[derive(Clone, Debug, Default)]
pub struct Meter(Arc<AtomicUsize>);

impl Meter {
    /// A new mail's exchange begins: the whole budget again.
    pub fn renew(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    fn spend(&self, n: usize) -> usize {
        self.0.fetch_add(n, Ordering::Relaxed) + n
    }
}

/// A relay that went past [`BUDGET`] in one mail's exchange.
#[derive(Debug, thiserror::Error)]
#[error("the relay sent more than {BUDGET} bytes for one mail")]
pub struct Overspent;

/// A TCP connection to the relay whose reads spend its [`Meter`].
#[derive(Debug)]
pub struct Metered {
    tcp: TcpStream,
    meter: Meter,
}

impl Metered {
    pub fn new(tcp: TcpStream) -> (Self, Meter) {
        let meter = Meter::default();
        let stream = Metered {
            tcp,
            meter: meter.clone(),
        };
        (stream, meter)
    }
}

impl AsyncRead for Metered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.tcp).poll_read(cx, buf))?;
        // One read past the budget at most (the reader's buffer), then no more.
        if this.meter.spend(buf.filled().len() - before) > BUDGET {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, Overspent)));
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

impl AsyncTokioStream for Metered {
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }
}

/// A metered connection already inside TLS (implicit TLS: the greeting comes encrypted), as a
/// stream lettre's connection can be given. lettre offers no other way to hand it a stream
/// that is secured before the greeting; its `AsyncNetworkStream` is public but marked "not
/// meant to be" (deprecated), hence the allowance.
#[allow(deprecated)]
#[derive(Debug)]
pub struct Secured(
    pub tokio_util::compat::Compat<lettre::transport::smtp::client::AsyncNetworkStream>,
);

impl AsyncRead for Secured {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Secured {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl AsyncTokioStream for Secured {
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.0.get_ref().peer_addr()
    }
}
