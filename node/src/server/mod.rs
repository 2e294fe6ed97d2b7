//! `weir serve`: starts one pinned glommio executor per shard, each accepting on the same
//! port (SO_REUSEPORT, a group only this process is in), wires the shards together with
//! channel meshes, prints the ready line, and shuts down cleanly on SIGTERM/SIGINT
//! (in-flight requests answered, logs closed with the clean-shutdown marker).

pub mod admission;
pub mod budget;
pub mod conn;
pub mod listen;
pub mod session;
pub mod transport;
pub mod watchdog;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use glommio::channels::channel_mesh::{Full, MeshBuilder};
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

use crate::config::Config;
use crate::metadata::MetaStore;
use crate::router::ShardId;
use crate::security::ListenerSetup;
use crate::shard::{Envelope, MESH_QUEUE_CAPACITY, NodeShared, ReplyEnvelope, Shard};

/// glommio needs this much locked memory for its io_uring buffers.
const MEMLOCK_MIN_BYTES: u64 = 512 * 1024;
/// How often shards look at the signal flag.
const SIGNAL_POLL_MS: u64 = 50;
/// How long a cluster node's shutdown waits for the controller to move its leadership.
const CONTROLLED_SHUTDOWN_MS: u64 = 5_000;
/// How long a shard waits for its connections to finish after a shutdown signal.
const DRAIN_TIMEOUT_MS: u64 = 10_000;

/// Set by SIGTERM/SIGINT; shards poll it.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Raises RLIMIT_MEMLOCK to what glommio needs if allowed; errors with advice otherwise.
fn check_memlock() -> anyhow::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Ok(());
    }
    if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur >= MEMLOCK_MIN_BYTES {
        return Ok(());
    }
    if lim.rlim_max == libc::RLIM_INFINITY || lim.rlim_max >= MEMLOCK_MIN_BYTES {
        lim.rlim_cur = MEMLOCK_MIN_BYTES;
        // SAFETY: setrlimit reads the valid struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } == 0 {
            return Ok(());
        }
    }
    anyhow::bail!(
        "RLIMIT_MEMLOCK is {} bytes; glommio needs at least {MEMLOCK_MIN_BYTES} (run `ulimit -l 512` or raise it in limits.conf)",
        lim.rlim_cur
    )
}

/// File descriptors one open partition log is assumed to hold: one per segment file,
/// and most logs have one or two segments.
const FDS_PER_OPEN_PARTITION: u64 = 2;
/// File descriptors kept for everything but partition logs and client connections:
/// listeners, io_uring rings and eventfds, the catalogue, the data dir lock.
const FDS_RESERVED: u64 = 256;

/// Raises the soft RLIMIT_NOFILE to the hard limit. If that is still below what
/// `max.open.partitions` and `max.connections` need, says in a log line what limit to
/// set, and keeps fewer partition logs open so that the node does not run out of files.
fn check_nofile(config: &mut Config) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the valid struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    let have = lim.rlim_cur;
    let limits = &mut config.partition_limits;
    let connections = config.max_connections;
    let needed = limits
        .max_open_partitions
        .saturating_mul(FDS_PER_OPEN_PARTITION)
        .saturating_add(connections)
        .saturating_add(FDS_RESERVED);
    if have == libc::RLIM_INFINITY || have >= needed {
        return;
    }
    // Connections may take at most half of what there is; partition logs get the rest.
    let for_logs = have
        .saturating_sub(FDS_RESERVED)
        .saturating_sub(connections.min(have / 2));
    let fitted = (for_logs / FDS_PER_OPEN_PARTITION).max(1);
    tracing::warn!(
        "RLIMIT_NOFILE is {have} open files; max.open.partitions={} and max.connections={connections} need about {needed}: raise it (ulimit -n {needed}, or LimitNOFILE={needed} under systemd). Until then at most {fitted} partition logs are kept open",
        limits.max_open_partitions
    );
    limits.max_open_partitions = fitted.min(limits.max_open_partitions);
}

/// Runs the broker until a signal stops it.
pub fn serve(mut config: Config) -> anyhow::Result<()> {
    check_memlock()?;
    check_nofile(&mut config);
    install_signal_handlers();
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let _lock = lock_data_dir(&config.data_dir)?;
    // Partition directories a crash left half deleted go on being removed.
    crate::storage::reclaim::retire_leftovers(&config.data_dir);
    // In a cluster the catalogue is the controller quorum's image, rebuilt from its log.
    let meta = if config.quorum_voters.is_empty() {
        MetaStore::open(&config.data_dir)?
    } else {
        MetaStore::in_memory(&config.data_dir)
    };
    // A new data dir has no cluster id yet. Its bootstrap credentials are stored before
    // the id is kept: a start that fails between the two tries again (found by review).
    let fresh = matches!(
        std::fs::symlink_metadata(config.data_dir.join("cluster.id")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound
    );
    if config.quorum_voters.is_empty() {
        bootstrap_scram_locally(&config, &meta, fresh)?;
    }
    let cluster_id = cluster_id(&config)?;
    let directory_id = directory_id(&config)?;
    let shards = config.shards;
    let node_id = config.node_id;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Bound here, before any shard starts: a second process on the address fails now.
    let (bound, mut per_shard) = bind_all(&config)?;
    let listen = bound[0].1;
    crate::security::peer::init(&config)?;
    let endpoints = per_shard
        .iter()
        .map(|(setup, _)| crate::metadata::Endpoint {
            name: setup.config.name.clone(),
            host: setup.advertised.0.clone(),
            port: setup.advertised.1,
        })
        .collect();
    let registered = inter_broker_advertised(&config, &bound);
    let quorum = prepare_quorum(&config, registered, endpoints, directory_id)?;
    let controller = match &quorum {
        None => crate::controller::Controller::local(),
        Some(q) => crate::controller::Controller::quorum(q.handle.clone()),
    };
    let metrics = Arc::new(crate::metrics::NodeMetrics::new(shards));
    if let Some(addr) = config.props.get("metrics.listener") {
        let addr: SocketAddr = addr
            .trim()
            .parse()
            .with_context(|| format!("metrics.listener={addr}: not HOST:PORT"))?;
        let bound = crate::metrics::http::serve(addr, metrics.clone())
            .with_context(|| format!("cannot listen for metrics on {addr}"))?;
        tracing::info!("metrics listening on {bound}");
    }
    // A damaged checkpoint is not fatal: replicas then open at their log start and the
    // ISR moves their HW up again (safe, only slower), and the next write replaces it.
    let hw_checkpoint = crate::storage::hw_checkpoint::HwCheckpoint::load(&config.data_dir)
        .unwrap_or_else(|e| {
            tracing::error!("high watermark checkpoint: {e}; starting without it");
            crate::storage::hw_checkpoint::HwCheckpoint::empty(&config.data_dir)
        });
    let node = Arc::new(NodeShared {
        hw_checkpoint,
        config,
        meta,
        connections: AtomicUsize::new(0),
        drained: AtomicUsize::new(0),
        metrics,
        cluster_id,
        controller,
    });
    if quorum.is_some() {
        // Dynamic broker configs are metadata in a cluster: read from the image.
        let weak = Arc::downgrade(&node);
        let id = node_id.to_string();
        node.config
            .dynamic
            .follow_cluster(Box::new(move || match weak.upgrade() {
                Some(node) => {
                    let catalog = node.meta.snapshot();
                    let layer = |name: &str| {
                        catalog
                            .broker_configs
                            .get(name)
                            .cloned()
                            .unwrap_or_default()
                    };
                    crate::config::dynamic::Layers {
                        cluster: layer(""),
                        node: layer(&id),
                    }
                }
                None => crate::config::dynamic::Layers::default(),
            }));
    }
    if let Some(q) = quorum {
        crate::controller::quorum::start(q, node.clone())?;
    }
    let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<SocketAddr>>();
    let requests = MeshBuilder::<Envelope, Full>::full(shards, MESH_QUEUE_CAPACITY);
    let replies = MeshBuilder::<ReplyEnvelope, Full>::full(shards, MESH_QUEUE_CAPACITY);
    let per_ip = Arc::new(admission::PerIp::default());
    let watchdog = watchdog::Watchdog::new(shards);
    let mut handles = Vec::new();
    for s in 0..shards {
        let listeners = per_shard
            .iter_mut()
            .map(|(setup, fds)| (setup.clone(), fds.remove(0)))
            .collect();
        let ctx = ShardStart {
            id: ShardId(s),
            node: node.clone(),
            listeners,
            per_ip: per_ip.clone(),
            requests: requests.clone(),
            replies: replies.clone(),
            ready: ready_tx.clone(),
            beat: watchdog.beat_of(s),
        };
        let placement = match node.config.shard_cpus.cpu_of(s, cpus) {
            Some(cpu) => Placement::Fixed(cpu),
            None => Placement::Unbound,
        };
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("weir-shard-{s}"))
            .spawn(move || run_shard(ctx))
            .map_err(|e| anyhow::anyhow!("cannot start shard executor: {e}"))?;
        handles.push(handle);
    }
    // Started before the ready line: a shard stuck while it starts is reported too.
    let stall_warn_ms = node
        .config
        .props
        .get("weir.shard.stall.warn.ms")
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or(watchdog::STALL_WARN_MS_DEFAULT);
    if let Err(e) = watchdog.spawn(stall_warn_ms) {
        tracing::warn!("shard watchdog not started: {e}");
    }
    // Only the shards hold senders now: if every one of them is gone, the wait ends.
    drop(ready_tx);
    for _ in 0..shards {
        wait_for(&ready_rx)?;
    }
    let (host, port) = advertised(&node.config, listen);
    let unready = node.controller.cluster().is_some_and(|q| !q.image_ready());
    if unready && STOP.load(Ordering::SeqCst) {
        // Stopped while it waited for the metadata image: it never served anyone.
        println!("weir stopping before it was ready: no metadata image yet");
        let joined = join_shards(handles);
        watchdog.stop();
        return joined;
    }
    let all: Vec<String> = bound
        .iter()
        .map(|(name, addr)| format!("{name}={addr}"))
        .collect();
    // "listening on ADDR" (the first listener) stays last: scripts and tests parse it.
    println!(
        "weir ready: node {node_id}, {shards} shards, listeners {}, advertised as {host}:{port}, listening on {listen}",
        all.join(" ")
    );
    let joined = join_shards(handles);
    watchdog.stop();
    joined
}

/// With `controller.quorum.voters`: binds this voter's controller port and prepares the
/// quorum handle. Without: `None` (no thread, no port).
/// The address this node registers with the controller, where its peers reach it: the
/// inter-broker listener's advertised address (the first listener's unless
/// `inter.broker.listener.name` or `security.inter.broker.protocol` names another).
fn inter_broker_advertised(config: &Config, bound: &[(String, SocketAddr)]) -> (String, u16) {
    let l = crate::security::peer::inter_broker_listener(config);
    match bound.iter().position(|(name, _)| *name == l.name) {
        Some(0) | None => advertised(config, bound[0].1),
        Some(i) => advertised_for(l.advertised.as_ref(), bound[i].1),
    }
}

fn prepare_quorum(
    config: &Config,
    registered: (String, u16),
    endpoints: Vec<crate::metadata::Endpoint>,
    directory_id: u128,
) -> anyhow::Result<Option<crate::controller::quorum::Prepared>> {
    if config.quorum_voters.is_empty() {
        return Ok(None);
    }
    let q = crate::controller::quorum::QuorumConfig {
        node_id: config.node_id,
        voters: config.quorum_voters.clone(),
        advertised: registered,
        endpoints,
        broker_epoch: wire::BrokerEpoch::draw(rand::random()),
        directory_id: Some(directory_id),
        rack: config.rack().map(str::to_string),
        heartbeat_interval: Duration::from_millis(config.broker_heartbeat_interval_ms),
        session_timeout: Duration::from_millis(config.broker_session_timeout_ms),
        election_timeout: Duration::from_millis(config.controller_election_timeout_ms),
        leader_rebalance: config.leader_rebalance,
        scram_bootstrap: match config.props.get(crate::security::scram_bootstrap::KEY) {
            Some(v) => crate::security::scram_bootstrap::parse(v)?,
            None => Vec::new(),
        },
    };
    crate::controller::quorum::prepare(q).map(Some)
}

fn join_shards(
    handles: Vec<glommio::ExecutorJoinHandle<anyhow::Result<()>>>,
) -> anyhow::Result<()> {
    let mut failed = false;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!("shard failed: {e:#}");
                failed = true;
            }
            Err(e) => {
                tracing::error!("shard executor failed: {e}");
                failed = true;
            }
        }
    }
    if failed {
        anyhow::bail!("one or more shards failed");
    }
    tracing::info!("weir stopped cleanly");
    Ok(())
}

/// Waits, without a bound, for a shard's ready message (a cluster node's shards wait for
/// the metadata image first, as long as the quorum has none to give); logs now and then
/// while it waits. Fails if the shard reports an error or every shard is gone.
fn wait_for(rx: &mpsc::Receiver<anyhow::Result<SocketAddr>>) -> anyhow::Result<SocketAddr> {
    loop {
        match rx.recv_timeout(Duration::from_secs(READY_LOG_EVERY_S)) {
            Ok(r) => return r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tracing::info!("still waiting for the shards to be ready");
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("a shard stopped before it was ready")
            }
        }
    }
}

/// How often startup logs that it still waits for its shards.
const READY_LOG_EVERY_S: u64 = 60;

/// The data dir's lock file: held (flock) for the life of the process, as Kafka's `.lock`.
const LOCK_FILE: &str = ".lock";
/// How long startup waits for a previous weir on the same data dir to finish exiting.
const LOCK_WAIT_MS: u64 = 10_000;

/// Takes the data dir's exclusive lock, so that two brokers never share a data dir (a
/// restarted broker could otherwise bind the same port with SO_REUSEPORT and write the
/// same logs while the old one is still exiting). Waits up to [`LOCK_WAIT_MS`] for a
/// previous process to let go, then refuses to start.
fn lock_data_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let deadline = Instant::now() + Duration::from_millis(LOCK_WAIT_MS);
    let mut logged = false;
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::WouldBlock {
            anyhow::bail!("cannot lock {}: {err}", path.display());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "data dir {} is in use by another weir process",
                dir.display()
            );
        }
        if !logged {
            tracing::warn!(
                "data dir {} is locked by another weir process; waiting",
                dir.display()
            );
            logged = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Listener sockets by listener: (setup, one socket per shard).
type BoundListeners = Vec<(Arc<ListenerSetup>, Vec<OwnedFd>)>;

/// Binds every listener (one socket per shard each) and builds its TLS and SASL setup;
/// returns each listener's name and bound address, in `listeners` order, and the sockets.
fn bind_all(config: &Config) -> anyhow::Result<(Vec<(String, SocketAddr)>, BoundListeners)> {
    let mut names = Vec::new();
    let mut out = Vec::new();
    for l in &config.listeners {
        let (bound, fds) = listen::bind_listeners(l.bind, config.shards)?;
        let adv = advertised_for(l.advertised.as_ref(), bound);
        let setup = ListenerSetup::new(config, l.clone(), adv)
            .with_context(|| format!("listener {}", l.name))?;
        names.push((l.name.clone(), bound));
        out.push((Arc::new(setup), fds));
    }
    assert_eq!(
        names.len(),
        config.listeners.len(),
        "every listener is bound"
    );
    Ok((names, out))
}

/// A listener's advertised address: its `advertised.listeners` entry, else the bound
/// address (`0.0.0.0` replaced by `127.0.0.1`, the only address known to reach us).
fn advertised_for(configured: Option<&(String, u16)>, bound: SocketAddr) -> (String, u16) {
    if let Some((h, p)) = configured {
        return (h.clone(), *p);
    }
    let host = if bound.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        bound.ip().to_string()
    };
    (host, bound.port())
}

/// The address given to clients: `--advertised-listener`, else the bound address (with
/// `0.0.0.0` replaced by `127.0.0.1`, the only address known to reach us).
pub fn advertised(config: &Config, bound: SocketAddr) -> (String, u16) {
    advertised_for(config.advertised.as_ref(), bound)
}

/// A stable cluster id, created once and kept in `cluster.id` in the data dir. Created
/// only where there is no file: one that cannot be read (EIO, EACCES, not UTF-8) or is
/// empty is an error, not a reason to replace the id (found by review).
fn cluster_id(config: &Config) -> anyhow::Result<String> {
    let path = config.data_dir.join("cluster.id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => anyhow::bail!("{} is empty; restore it or remove it", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    }
    let id = format!("weir-{:032x}", crate::metadata::new_topic_id());
    crate::metadata::write_atomic(&path, id.as_bytes())?;
    Ok(id)
}

/// `scram.bootstrap.credentials` on a single node: stored in the catalogue when the data dir
/// is new (before the cluster id is kept), as Kafka's `kafka-storage format --add-scram`
/// writes them once at format time. On a data dir that already has a cluster id the key is
/// ignored, and says so: credentials changed or deleted since must not come back at every
/// start. (In a cluster the first controller commits them: `controller::quorum`.)
fn bootstrap_scram_locally(
    config: &Config,
    meta: &crate::metadata::MetaStore,
    fresh: bool,
) -> anyhow::Result<()> {
    let key = crate::security::scram_bootstrap::KEY;
    let Some(value) = config.props.get(key) else {
        return Ok(());
    };
    let changes = crate::security::scram_bootstrap::parse(value)?;
    if !fresh {
        tracing::info!(
            "{key}: this data dir is not new; its stored credentials are kept as they are"
        );
        return Ok(());
    }
    let outcomes = meta
        .update_batch(|c| crate::metadata::scram::alter(c, &changes))
        .with_context(|| format!("{key}: storing the credentials"))?;
    tracing::info!(
        credentials = outcomes.len(),
        "bootstrap SCRAM credentials stored ({key})"
    );
    Ok(())
}

/// The data dir's own id (Kafka's `directory.id`, KIP-858), created once and kept in
/// `directory.id` beside `cluster.id`. A node back with another one (a wiped data dir, a
/// new disk) holds none of what its ISR memberships vouched for: the controller takes it
/// out of them (see `Command::RegisterNode`). A dir without one (an older binary's) gets
/// one now.
fn directory_id(config: &Config) -> anyhow::Result<u128> {
    let path = config.data_dir.join("directory.id");
    match std::fs::read_to_string(&path) {
        Ok(text) => u128::from_str_radix(text.trim(), 16)
            .with_context(|| format!("{}: not a directory id: {text:?}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = crate::metadata::new_topic_id();
            crate::metadata::write_atomic(&path, format!("{id:032x}").as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// What a shard thread starts with.
struct ShardStart {
    id: ShardId,
    node: Arc<NodeShared>,
    /// This shard's listening socket of each listener (bound and listening; see [`listen`]).
    listeners: Vec<(Arc<ListenerSetup>, OwnedFd)>,
    per_ip: Arc<admission::PerIp>,
    requests: MeshBuilder<Envelope, Full>,
    replies: MeshBuilder<ReplyEnvelope, Full>,
    ready: mpsc::Sender<anyhow::Result<SocketAddr>>,
    /// This shard's stamp for the watchdog.
    beat: Arc<watchdog::ShardBeat>,
}

/// What the accept loop of one shard enforces and hands to each connection.
struct Admission {
    per_ip: Arc<admission::PerIp>,
    refusals: admission::RefusalLog,
    budget: Rc<budget::RequestBudget>,
}

/// Tells the watchdog, when `run_shard` returns by any path, that the shard ended.
struct Finished(Arc<watchdog::ShardBeat>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.finished();
    }
}

async fn run_shard(start: ShardStart) -> anyhow::Result<()> {
    let ShardStart {
        id,
        node,
        listeners,
        per_ip,
        requests,
        replies,
        ready,
        beat,
    } = start;
    // First, so that the watchdog also sees a shard that gets stuck while it starts.
    glommio::spawn_local(watchdog::beat(beat.clone())).detach();
    let _finished = Finished(beat);
    let listeners: Vec<(Arc<ListenerSetup>, TcpListener)> = listeners
        .into_iter()
        .map(|(setup, fd)| {
            // SAFETY: the descriptor is a bound, listening TCP socket that we own; the
            // listener takes it over (and closes it).
            (setup, unsafe { TcpListener::from_raw_fd(fd.into_raw_fd()) })
        })
        .collect();
    let local = listeners[0]
        .1
        .local_addr()
        .map_err(|e| anyhow::anyhow!("local_addr: {e}"))?;
    // This shard's share of the node's `log.index.cache.bytes`, before any log opens. The
    // default's share is at least a floor (many shards would otherwise each get too
    // little to hold a few segments' indexes); a value set is divided as it is.
    let shards = node.config.shards.max(1) as u64;
    let share = node.config.log_index_cache_bytes / shards;
    let share = match node.config.props.get("log.index.cache.bytes") {
        Some(_) => share,
        None => share.max(crate::storage::INDEX_CACHE_SHARD_BYTES_MIN),
    };
    crate::storage::set_shard_index_cache_bytes(share);
    crate::storage::set_shard_cache_budget(node.config.log_tail_cache_max_bytes / shards);
    if let Err(e) = crate::storage::prime_dma_probe(&node.config.data_dir).await {
        let _ = ready.send(Err(anyhow::anyhow!("DMA probe failed: {e}")));
        return Err(e.into());
    }
    let (req_tx, req_rx) = requests
        .join()
        .await
        .map_err(|_| anyhow::anyhow!("request mesh join failed"))?;
    let (rep_tx, rep_rx) = replies
        .join()
        .await
        .map_err(|_| anyhow::anyhow!("reply mesh join failed"))?;
    let adv = advertised(&node.config, local);
    crate::metrics::bind_thread(node.metrics.clone(), id.0);
    let shard = Rc::new(Shard::new(
        id,
        node.clone(),
        Some(req_tx),
        Some(rep_tx),
        adv,
    ));
    let inbox = glommio::spawn_local(shard.clone().run_inbox(req_rx));
    let reply_box = glommio::spawn_local(shard.clone().run_replies(rep_rx));
    shard.sync_partitions().await;
    if let Some(q) = node.controller.cluster() {
        crate::controller::bridge::spawn_notices(shard.clone(), q);
    }
    let housekeeping = glommio::spawn_local(shard.clone().run_housekeeping());
    glommio::spawn_local(crate::shard::calls::run_coordinator_loads(shard.clone())).detach();
    let watcher = glommio::spawn_local(watch_signal(shard.clone()));
    let admission = Rc::new(Admission {
        per_ip,
        refusals: admission::RefusalLog::default(),
        budget: budget::RequestBudget::new(
            node.config.queued_max_request_bytes,
            node.config.shards,
        ),
    });
    let trimmer = glommio::spawn_local(admission.budget.clone().trim_after_bursts());
    // A node stopped before it had the image never accepts anyone (the listeners close
    // with the shard).
    let serving = match node.controller.cluster() {
        Some(q) => wait_for_image(id, q).await,
        None => true,
    };
    let _ = ready.send(Ok(local));
    // One accept loop per listener; each ends at shutdown and closes its socket.
    let loops: Vec<_> = listeners
        .into_iter()
        .filter(|_| serving)
        .map(|(setup, listener)| {
            let (shard, admission) = (shard.clone(), admission.clone());
            glommio::spawn_local(async move {
                accept_loop(&shard, &listener, &admission, &setup).await;
            })
        })
        .collect();
    for accept in loops {
        accept.await;
    }
    drain(&shard).await;
    housekeeping.await;
    watcher.await;
    // Keep serving peers until every shard has drained its own connections: their
    // in-flight requests may still need partitions owned here.
    node.drained.fetch_add(1, Ordering::AcqRel);
    while node.drained.load(Ordering::Acquire) < node.config.shards {
        glommio::timer::sleep(Duration::from_millis(SIGNAL_POLL_MS)).await;
    }
    shard.close_all().await;
    drop(trimmer);
    drop(inbox);
    drop(reply_box);
    tracing::info!(shard = %id, "shard stopped, logs closed");
    Ok(())
}

/// Waits, without a bound (a node with no image has nothing right to serve), until this
/// cluster node has the quorum's metadata image, or a shutdown is asked for: a broker-only
/// node restarted while the voters have no leader would otherwise answer Metadata with no
/// topics (a regex-subscribed consumer drops its partitions) and hold auto-creating
/// requests on a forward that cannot complete.
/// Whether the image arrived (false: the node is stopping).
async fn wait_for_image(id: ShardId, q: &Arc<crate::controller::quorum::Handle>) -> bool {
    if q.image_ready() {
        return true;
    }
    if id == ShardId(0) {
        tracing::info!("waiting for the metadata image before serving clients");
    }
    while !q.image_ready() && !STOP.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(IMAGE_POLL_MS)).await;
    }
    q.image_ready()
}

/// How often a shard waiting for the metadata image looks again.
const IMAGE_POLL_MS: u64 = 50;

/// Turns the process-wide signal flag into this shard's shutdown event.
async fn watch_signal(shard: Rc<Shard>) {
    while !STOP.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(SIGNAL_POLL_MS)).await;
    }
    if shard.id == ShardId(0) {
        tracing::info!("shutdown requested: answering in-flight requests, then closing logs");
    }
    if let Some(q) = shard.node.controller.cluster() {
        controlled_shutdown(&shard, q).await;
    }
    shard.begin_shutdown();
}

/// Set once this cluster node's leadership has moved away (or the try timed out).
static HANDED_OVER: AtomicBool = AtomicBool::new(false);

/// Kafka's controlled shutdown: before a cluster node stops serving, it stops
/// heartbeating and asks the controller to fence it, which moves every partition it leads
/// to another ISR member; clients are still answered meanwhile. Shard 0 asks; the others
/// wait for it. Bounded by [`CONTROLLED_SHUTDOWN_MS`] (no quorum: the lease does it later).
async fn controlled_shutdown(shard: &Rc<Shard>, q: &Arc<crate::controller::quorum::Handle>) {
    let deadline = Instant::now() + Duration::from_millis(CONTROLLED_SHUTDOWN_MS);
    if shard.id == ShardId(0) {
        q.stop_heartbeats();
        let id = shard.config().node_id;
        let fence = shard
            .node
            .controller
            .submit(&shard.node, crate::controller::Command::FenceNode { id });
        let timeout = glommio::timer::sleep(Duration::from_millis(CONTROLLED_SHUTDOWN_MS));
        let done = futures_lite::future::or(
            async {
                fence.await;
                true
            },
            async {
                timeout.await;
                false
            },
        )
        .await;
        if done {
            tracing::info!("controlled shutdown: leadership moved to other nodes");
        } else {
            tracing::warn!("controlled shutdown: no controller answered; stopping anyway");
        }
        HANDED_OVER.store(true, Ordering::SeqCst);
        return;
    }
    while !HANDED_OVER.load(Ordering::SeqCst) && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(SIGNAL_POLL_MS)).await;
    }
}

/// First pause after a failed accept (EMFILE, ENFILE, ENOBUFS: retrying at once fails
/// again); it doubles with each failure in a row up to [`ACCEPT_BACKOFF_MAX_MS`].
const ACCEPT_BACKOFF_MIN_MS: u64 = 10;
const ACCEPT_BACKOFF_MAX_MS: u64 = 1_000;
/// At most one "accept failed" line per shard per this interval; the failures in
/// between are counted in the next line.
const ACCEPT_LOG_INTERVAL_MS: u64 = 10_000;

/// The backoff and rate-limited logging of failed accepts on one shard.
#[derive(Default)]
struct AcceptBackoff {
    /// The current pause; 0 while accepts succeed.
    pause_ms: u64,
    /// Failures in a row.
    failures: u64,
    /// Failures not logged since the last line.
    unlogged: u64,
    last_logged: Option<Instant>,
}

impl AcceptBackoff {
    /// Records a failure; returns how long to pause before the next accept.
    fn failed(&mut self, e: &dyn std::fmt::Display) -> Duration {
        self.pause_ms = (self.pause_ms * 2).clamp(ACCEPT_BACKOFF_MIN_MS, ACCEPT_BACKOFF_MAX_MS);
        self.failures += 1;
        self.unlogged += 1;
        let due = self
            .last_logged
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(ACCEPT_LOG_INTERVAL_MS));
        if due {
            let (pause_ms, failures) = (self.pause_ms, self.unlogged);
            tracing::warn!(
                "accept failed: {e} ({failures} failures since the last line); retrying in {pause_ms} ms"
            );
            self.unlogged = 0;
            self.last_logged = Some(Instant::now());
        }
        Duration::from_millis(self.pause_ms)
    }

    /// Records a success after failures (logged once).
    fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!("accepting again after {} failed accepts", self.failures);
        }
        self.pause_ms = 0;
        self.failures = 0;
        self.unlogged = 0;
    }
}

/// Accepts connections until shutdown, enforcing `max.connections` and
/// `max.connections.per.ip` node-wide (refusals logged at most once a second per shard).
async fn accept_loop(
    shard: &Rc<Shard>,
    listener: &TcpListener,
    admission: &Admission,
    setup: &Arc<ListenerSetup>,
) {
    let mut backoff = AcceptBackoff::default();
    // A cluster's dedicated inter-broker listener (named by `inter.broker.listener.name`,
    // and not the first listener, which clients use when no name is given) is not held to
    // `max.connections`, nor counted in it, as in Kafka (KIP-402): clients that use up
    // the limit must not keep a restarted follower's fetcher, or the coordinators'
    // marker writes, out. `max.connections.per.ip` still applies to it.
    let config = shard.config();
    let named = config.props.get("inter.broker.listener.name");
    let protected = !config.quorum_voters.is_empty()
        && named.is_some_and(|n| n.trim().eq_ignore_ascii_case(&setup.config.name))
        && !config.listeners[0]
            .name
            .eq_ignore_ascii_case(&setup.config.name);
    loop {
        // Checked on every turn, not only by listening: an accept that won the race with
        // the shutdown event would make the next listen wait for a later notification
        // that never comes, and the shard would never drain.
        if shard.shutting_down.get() {
            return;
        }
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            shard.shutdown.listen().await;
            None
        })
        .await;
        let stream = match accepted {
            None => return,
            Some(Ok(s)) => {
                backoff.succeeded();
                s
            }
            Some(Err(e)) => {
                let pause = backoff.failed(&e);
                let sleep = glommio::timer::sleep(pause);
                futures_lite::future::or(
                    async {
                        sleep.await;
                    },
                    shard.shutdown.listen(),
                )
                .await;
                continue;
            }
        };
        let peer = stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let max = shard.config().max_connections as usize;
        let counted = usize::from(!protected);
        let open = shard.node.connections.fetch_add(counted, Ordering::AcqRel);
        if !protected && open >= max {
            shard.node.connections.fetch_sub(1, Ordering::AcqRel);
            shard
                .metrics()
                .refused(crate::metrics::Refusal::MaxConnections);
            if let Some(more) = admission.refusals.allow() {
                tracing::warn!(%peer, "refusing connection: {open} open, max.connections is {max} ({more} more refused since the last line)");
            }
            drop(stream);
            continue;
        }
        // An IPv4 client of a dual-stack listener arrives as ::ffff:a.b.c.d: counted and
        // matched against the overrides as the IPv4 address it is (as the ACLs do).
        let ip = peer.ip().to_canonical();
        let max_ip = shard.config().max_connections_for(ip);
        let slot = match admission.per_ip.admit(ip, max_ip) {
            Ok(slot) => slot,
            Err(open_ip) => {
                shard.node.connections.fetch_sub(counted, Ordering::AcqRel);
                shard
                    .metrics()
                    .refused(crate::metrics::Refusal::MaxConnectionsPerIp);
                if let Some(more) = admission.refusals.allow() {
                    tracing::warn!(%peer, "refusing connection: {open_ip} open from {ip}, max.connections.per.ip is {max_ip} ({more} more refused since the last line)");
                }
                drop(stream);
                continue;
            }
        };
        let s = shard.clone();
        let limits = conn::ReadLimits::new(shard.config(), admission.budget.clone());
        let setup = setup.clone();
        glommio::spawn_local(async move {
            conn::serve(s.clone(), stream, peer, limits, setup).await;
            drop(slot);
            s.node.connections.fetch_sub(counted, Ordering::AcqRel);
            s.open_connections.set(s.open_connections.get() - 1);
        })
        .detach();
        shard.open_connections.set(shard.open_connections.get() + 1);
    }
}

/// Waits (bounded) until this shard's connections have answered what they read.
async fn drain(shard: &Rc<Shard>) {
    let deadline = std::time::Instant::now() + Duration::from_millis(DRAIN_TIMEOUT_MS);
    while shard.open_connections.get() > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    if shard.open_connections.get() > 0 {
        tracing::warn!(shard = %shard.id, "{} connections still open after the drain timeout", shard.open_connections.get());
    }
}
