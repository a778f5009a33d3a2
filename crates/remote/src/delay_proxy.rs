//! A TCP proxy on localhost that holds every HTTP GET request for a fixed time before passing
//! it on: the network latency of a distant object store, added to a local test server
//! (versitygw has no such option). It forwards bytes as they are; only a read from the client
//! that starts with `GET ` (a new request on the connection) waits first. Used by the
//! published-image tests and `ferrofs bench published`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A running proxy; dropping it stops accepting (open connections end with their peers).
pub struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DelayProxy {
    /// Listen on a free localhost port and forward to `target`, each GET held for `delay`.
    pub fn start(target: SocketAddr, delay: Duration) -> io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("delay-proxy".into()).spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                if let Ok(server) = TcpStream::connect(target) {
                    // A connection the proxy cannot serve is closed: the client sees a reset.
                    let _ = relay(client, server, delay);
                }
            }
        })?;
        Ok(DelayProxy { addr, stop, thread: Some(thread) })
    }

    /// `http://127.0.0.1:PORT`, the endpoint to give clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        let _ = TcpStream::connect(self.addr); // wakes the accept
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two threads copy the connection's two directions; requests wait `delay` if they are GETs.
fn relay(client: TcpStream, server: TcpStream, delay: Duration) -> io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client2, server2) = (client.try_clone()?, server.try_clone()?);
    std::thread::Builder::new().name("delay-proxy-up".into()).spawn(move || copy(client, server, delay))?;
    std::thread::Builder::new()
        .name("delay-proxy-down".into())
        .spawn(move || copy(server2, client2, Duration::ZERO))?;
    Ok(())
}

fn copy(mut from: TcpStream, mut to: TcpStream, get_delay: Duration) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !get_delay.is_zero() && buf[..n].starts_with(b"GET ") {
            std::thread::sleep(get_delay);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A server that answers each request line with "ok\n".
    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let mut conn = conn.unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 256];
                    while let Ok(n) = conn.read(&mut buf) {
                        if n == 0 || conn.write_all(b"ok\n").is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn ask(conn: &mut TcpStream, request: &[u8]) -> Duration {
        let start = Instant::now();
        conn.write_all(request).unwrap();
        let mut answer = [0u8; 3];
        conn.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"ok\n");
        start.elapsed()
    }

    #[test]
    fn gets_wait_and_other_requests_do_not() {
        let proxy = DelayProxy::start(echo_server(), Duration::from_millis(200)).unwrap();
        let mut conn = TcpStream::connect(proxy.addr).unwrap();
        assert!(ask(&mut conn, b"GET /a HTTP/1.1\r\n\r\n") >= Duration::from_millis(200));
        assert!(ask(&mut conn, b"PUT /a HTTP/1.1\r\n\r\n") < Duration::from_millis(150));
        assert!(
            ask(&mut conn, b"GET /b HTTP/1.1\r\n\r\n") >= Duration::from_millis(200),
            "every request on the connection"
        );
    }
}
