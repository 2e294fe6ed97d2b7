//! The InitProducerId handler for idempotent producers (no transactional id): a producer
//! id from this shard's allocator, or a KIP-360 epoch bump. The transaction coordinator
//! takes its new ids from the same allocator ([`new_producer_id`]).
//!
//! Each shard thread keeps its own allocator, so the handler runs on whichever shard the
//! connection landed on, with no cross-shard call. On a single node it is the shard's
//! persisted range ([`ProducerIdBlockFile`]); in a cluster (`controller.quorum.voters`)
//! it is blocks the controller reserved for it ([`ControllerBlocks`], Kafka's
//! AllocateProducerIds): the next block is asked for before the current one runs out,
//! and a request that finds none waits for the ask at most [`BLOCK_WAIT`], then answers
//! COORDINATOR_LOAD_IN_PROGRESS, which clients retry.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
use wire::{ProducerEpoch, ProducerId};

use super::allocator::{ControllerBlocks, IdRange, InitProducerIdOutcome, ProducerIdBlockFile};
use crate::controller::{Command, Outcome};
use crate::event::Event;
use crate::shard::{NodeShared, Shard};

/// Kafka error: the coordinator is loading; clients retry. Kafka answers it when it has
/// no block of producer ids (KAFKA-14417: REQUEST_TIMED_OUT before, which older clients
/// took as fatal), weir when its block file fails or no block came from the controller
/// within [`BLOCK_WAIT`].
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
/// Kafka error: no coordinator for a transactional id (weir has no transactions yet).
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
/// Kafka error: an empty transactional id.
const INVALID_REQUEST: i16 = 42;
/// Longest an InitProducerId waits for a block from the controller. Kafka's broker
/// answers at once (KAFKA-14694); a short wait spares the first producers after a start a retry, and
/// stays well below clients' request timeouts when the controller has no quorum.
pub const BLOCK_WAIT: Duration = Duration::from_secs(2);
/// Pause after a refused or failed ask before the next may go.
const REFUSED_BACKOFF: Duration = Duration::from_secs(1);
/// Fewest seconds between two warnings of a refused or failed block ask.
const WARN_EVERY: Duration = Duration::from_secs(10);

thread_local! {
    /// This shard's allocator, opened on first use: (data dir, shard, allocator).
    static ALLOCATOR: RefCell<Option<(PathBuf, u32, ProducerIdBlockFile)>> =
        const { RefCell::new(None) };
    /// A cluster shard's blocks: (data dir, shard, blocks).
    static BLOCKS: RefCell<Option<(PathBuf, u32, Rc<Blocks>)>> = const { RefCell::new(None) };
}

/// A cluster shard's ids from the controller and its one ask in flight.
#[derive(Default)]
struct Blocks {
    ids: RefCell<ControllerBlocks>,
    asking: Cell<bool>,
    /// Notified when an ask ends, with a block or without.
    answered: Event,
    last_warned: Cell<Option<Instant>>,
}

/// Where the handler's shard lives.
#[derive(Clone, Copy, Debug)]
pub struct ShardPlace<'a> {
    pub data_dir: &'a Path,
    pub node_id: i32,
    pub shard: u32,
}

/// Answers one InitProducerId request of `version` from the shard's persisted range.
pub fn handle(
    place: ShardPlace<'_>,
    req: &InitProducerIdRequest,
    version: i16,
    now_ms: i64,
) -> InitProducerIdResponse {
    let requested = match requested(req, version) {
        Ok(r) => r,
        Err(code) => return error_response(code),
    };
    answer(allocate(place, requested, version, now_ms).map_err(|e| {
        tracing::error!(shard = place.shard, "InitProducerId: {e}");
        COORDINATOR_LOAD_IN_PROGRESS
    }))
}

fn error_response(code: i16) -> InitProducerIdResponse {
    InitProducerIdResponse::default()
        .with_error_code(code)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1)
}

/// The id and epoch a request carries (v3+; `None` for a new producer), or the error a
/// request with a transactional id gets here.
fn requested(
    req: &InitProducerIdRequest,
    version: i16,
) -> Result<Option<(ProducerId, ProducerEpoch)>, i16> {
    match req.transactional_id.as_ref().map(|t| t.0.as_str()) {
        Some("") => return Err(INVALID_REQUEST),
        Some(_) => return Err(COORDINATOR_NOT_AVAILABLE),
        None => {}
    }
    Ok((version >= 3 && req.producer_id.0 >= 0).then_some((
        ProducerId(req.producer_id.0),
        ProducerEpoch(req.producer_epoch),
    )))
}

fn answer(outcome: Result<InitProducerIdOutcome, i16>) -> InitProducerIdResponse {
    match outcome {
        Ok(InitProducerIdOutcome::Granted { producer_id, epoch }) => {
            InitProducerIdResponse::default()
                .with_producer_id(producer_id.get().into())
                .with_producer_epoch(epoch.get())
        }
        Ok(InitProducerIdOutcome::Fenced { error_code }) => error_response(error_code),
        Err(code) => error_response(code),
    }
}

fn allocate(
    place: ShardPlace<'_>,
    requested: Option<(ProducerId, ProducerEpoch)>,
    version: i16,
    now_ms: i64,
) -> Result<InitProducerIdOutcome, super::AllocatorError> {
    ALLOCATOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let stale = slot
            .as_ref()
            .is_none_or(|(dir, shard, _)| dir != place.data_dir || *shard != place.shard);
        if stale {
            let range = IdRange::for_shard(place.node_id, place.shard).ok_or(
                super::AllocatorError::Corrupt {
                    path: place.data_dir.to_path_buf(),
                    reason: "node.id or shard outside the producer id layout",
                },
            )?;
            let file = ProducerIdBlockFile::open(place.data_dir, place.shard, range)?;
            *slot = Some((place.data_dir.to_path_buf(), place.shard, file));
        }
        match slot.as_mut() {
            Some((_, _, file)) => file.init_producer_id(requested, version, now_ms),
            None => Err(super::AllocatorError::Corrupt {
                path: place.data_dir.to_path_buf(),
                reason: "allocator not open",
            }),
        }
    })
}

/// The handler as the API dispatcher calls it, on the connection's shard.
pub async fn handle_on_shard(
    shard: &Shard,
    req: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let config = shard.config();
    let place = ShardPlace {
        data_dir: &config.data_dir,
        node_id: config.node_id,
        shard: shard.id.0 as u32,
    };
    if shard.node.controller.cluster().is_none() {
        return handle(place, &req, version, crate::shard::now_ms());
    }
    match requested(&req, version) {
        Ok(requested) => answer(from_controller(&shard.node, place, requested, version).await),
        Err(code) => error_response(code),
    }
}

/// A new producer id (epoch 0) from this shard's allocator, for the transaction
/// coordinator; a Kafka error code when none can be had now.
pub async fn new_producer_id(shard: &Shard, version: i16) -> Result<ProducerId, i16> {
    let config = shard.config();
    let place = ShardPlace {
        data_dir: &config.data_dir,
        node_id: config.node_id,
        shard: shard.id.0 as u32,
    };
    let outcome = if shard.node.controller.cluster().is_none() {
        allocate(place, None, version, crate::shard::now_ms()).map_err(|e| {
            tracing::error!(shard = place.shard, "transactional producer id: {e}");
            COORDINATOR_LOAD_IN_PROGRESS
        })
    } else {
        from_controller(&shard.node, place, None, version).await
    };
    match outcome? {
        InitProducerIdOutcome::Granted { producer_id, .. } => Ok(producer_id),
        InitProducerIdOutcome::Fenced { error_code } => Err(error_code),
    }
}

/// This shard's cluster blocks (made on first use).
fn blocks_of(place: ShardPlace<'_>) -> Rc<Blocks> {
    BLOCKS.with(|cell| {
        let mut slot = cell.borrow_mut();
        match slot.as_ref() {
            Some((dir, shard, b)) if dir == place.data_dir && *shard == place.shard => b.clone(),
            _ => {
                let b = Rc::new(Blocks::default());
                *slot = Some((place.data_dir.to_path_buf(), place.shard, b.clone()));
                b
            }
        }
    })
}

/// InitProducerId from the controller's blocks: an id (or bump) at once when the shard
/// has one, else after the ask for a block answers, within [`BLOCK_WAIT`];
/// COORDINATOR_LOAD_IN_PROGRESS otherwise.
async fn from_controller(
    node: &Arc<NodeShared>,
    place: ShardPlace<'_>,
    requested: Option<(ProducerId, ProducerEpoch)>,
    version: i16,
) -> Result<InitProducerIdOutcome, i16> {
    /// Each round either answers or waits for an ask that brought a block; another
    /// request can take that whole block only a thousand ids at a time.
    const ROUNDS_MAX: usize = 8;
    let blocks = blocks_of(place);
    let deadline = Instant::now() + BLOCK_WAIT;
    for _ in 0..ROUNDS_MAX {
        let outcome =
            blocks
                .ids
                .borrow_mut()
                .init_producer_id(requested, version, crate::shard::now_ms());
        if blocks.ids.borrow().wants_block() {
            ask(node, place, &blocks);
        }
        if let Some(outcome) = outcome {
            return Ok(outcome);
        }
        let answered = blocks.answered.listen();
        let left = deadline.saturating_duration_since(Instant::now());
        if !blocks.asking.get() || left.is_zero() {
            break;
        }
        let in_time = futures_lite::future::or(
            async {
                answered.await;
                true
            },
            async {
                glommio::timer::sleep(left).await;
                false
            },
        )
        .await;
        // An ask refused or failed is not repeated here: the client's retry asks again.
        if !in_time || !blocks.ids.borrow().has_ids() {
            break;
        }
    }
    Err(COORDINATOR_LOAD_IN_PROGRESS)
}

/// Asks the controller for the next block, unless an ask is in flight: a task of its
/// own, so a request that stops waiting does not lose the block.
fn ask(node: &Arc<NodeShared>, place: ShardPlace<'_>, blocks: &Rc<Blocks>) {
    let Some(q) = node.controller.cluster() else {
        return;
    };
    // The controller refuses a node its image does not show live under this process's
    // broker epoch; asking anyway would put a refused entry in the metadata log per
    // client retry (Kafka checks before writing). The image here is the same one.
    let registered = node
        .meta
        .snapshot()
        .nodes
        .get(&place.node_id)
        .is_some_and(|n| !n.fenced && n.broker_epoch == q.broker_epoch().get());
    if !registered || blocks.asking.replace(true) {
        return;
    }
    let cmd = Command::AllocateProducerIds {
        node: place.node_id,
        broker_epoch: q.broker_epoch().get(),
    };
    let node = node.clone();
    let blocks = blocks.clone();
    let shard = place.shard;
    glommio::spawn_local(async move {
        let why = match node.controller.submit(&node, cmd).await {
            Outcome::ProducerIds(Ok(start)) => {
                blocks.ids.borrow_mut().add_block(start);
                None
            }
            Outcome::ProducerIds(Err((code, why))) => Some(format!("error {code}: {why}")),
            other => Some(format!("unexpected answer {other:?}")),
        };
        if let Some(why) = why {
            // Not asked again at once: each ask is a metadata log entry.
            glommio::timer::sleep(REFUSED_BACKOFF).await;
            let now = Instant::now();
            if blocks
                .last_warned
                .get()
                .is_none_or(|t| now.duration_since(t) >= WARN_EVERY)
            {
                blocks.last_warned.set(Some(now));
                tracing::warn!(shard, "no producer id block from the controller: {why}");
            }
        }
        blocks.asking.set(false);
        blocks.answered.notify_all();
    })
    .detach();
}
