//! `FaultProxy`: a TCP forwarder on a free loopback port that the nemesis can
//! turn into a black hole (bytes are read and dropped both ways, connections
//! stay open, as behind a silent network partition) and heal (every open
//! connection is cut, new ones forward again). Its upstream can be changed,
//! so a client can follow a server that restarts on another port.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use snowkeep_test_support::free_port;

struct State {
    upstream: Mutex<SocketAddr>,
    blackholed: AtomicBool,
    /// Bumped on heal: connections opened under an older generation close.
    generation: watch::Sender<u64>,
}

/// A forwarder from `127.0.0.1:port` to an upstream address.
pub struct FaultProxy {
    /// The port clients connect to.
    pub port: u16,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let port = free_port();
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind proxy");
        let state = Arc::new(State {
            upstream: Mutex::new(upstream),
            blackholed: AtomicBool::new(false),
            generation: watch::channel(0).0,
        });
        let accept = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(forward(client, state.clone()));
                }
            }
        });
        Self {
            port,
            state,
            accept,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// New connections go to `upstream`; open ones are cut.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.state.upstream.lock().unwrap() = upstream;
        self.state.generation.send_modify(|g| *g += 1);
    }

    /// Drops every byte in both directions from now on, keeping connections open.
    pub fn blackhole(&self) {
        self.state.blackholed.store(true, Ordering::SeqCst);
    }

    /// Forwards again and cuts every connection opened before, as a healed
    /// partition leaves clients with connections whose bytes were lost.
    pub fn heal(&self) {
        self.state.blackholed.store(false, Ordering::SeqCst);
        self.state.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.state.generation.send_modify(|g| *g += 1);
    }
}

async fn forward(mut client: TcpStream, state: Arc<State>) {
    let mut generation = state.generation.subscribe();
    generation.mark_unchanged();
    let upstream = *state.upstream.lock().unwrap();
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return; // dropping `client` closes it, as a refused connection would
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        tokio::select! {
            _ = generation.changed() => return,
            n = cr.read(&mut up) => {
                let Ok(n @ 1..) = n else { return };
                if !state.blackholed.load(Ordering::SeqCst) && sw.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            n = sr.read(&mut down) => {
                let Ok(n @ 1..) = n else { return };
                if !state.blackholed.load(Ordering::SeqCst) && cw.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
