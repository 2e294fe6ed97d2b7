//! The InitProducerId handler for idempotent producers (no transactional id): a producer
//! id from this shard's persisted allocator, or a KIP-360 epoch bump.
//!
//! Each shard thread keeps its own allocator (its own id range and block file), so the
//! handler runs on whichever shard the connection landed on, with no cross-shard call.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
use wire::{ProducerEpoch, ProducerId};

use super::allocator::{IdRange, InitProducerIdOutcome, ProducerIdBlockFile};

/// Kafka error: the coordinator is loading; clients retry. Kafka answers it when it
/// cannot get a block of producer ids (KAFKA-14417), weir when its block file fails.
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
/// Kafka error: no coordinator for a transactional id (weir has no transactions yet).
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
/// Kafka error: an empty transactional id.
const INVALID_REQUEST: i16 = 42;

thread_local! {
    /// This shard's allocator, opened on first use: (data dir, shard, allocator).
    static ALLOCATOR: RefCell<Option<(PathBuf, u32, ProducerIdBlockFile)>> =
        const { RefCell::new(None) };
}

/// Where the handler's shard lives.
#[derive(Clone, Copy, Debug)]
pub struct ShardPlace<'a> {
    pub data_dir: &'a Path,
    pub node_id: i32,
    pub shard: u32,
}

/// Answers one InitProducerId request of `version`.
pub fn handle(
    place: ShardPlace<'_>,
    req: &InitProducerIdRequest,
    version: i16,
    now_ms: i64,
) -> InitProducerIdResponse {
    let error = |code: i16| {
        InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1)
    };
    match req.transactional_id.as_ref().map(|t| t.0.as_str()) {
        Some("") => return error(INVALID_REQUEST),
        Some(_) => return error(COORDINATOR_NOT_AVAILABLE),
        None => {}
    }
    let requested = (version >= 3 && req.producer_id.0 >= 0).then_some((
        ProducerId(req.producer_id.0),
        ProducerEpoch(req.producer_epoch),
    ));
    match allocate(place, requested, version, now_ms) {
        Ok(InitProducerIdOutcome::Granted { producer_id, epoch }) => {
            InitProducerIdResponse::default()
                .with_producer_id(producer_id.get().into())
                .with_producer_epoch(epoch.get())
        }
        Ok(InitProducerIdOutcome::Fenced { error_code }) => error(error_code),
        Err(e) => {
            tracing::error!(shard = place.shard, "InitProducerId: {e}");
            error(COORDINATOR_LOAD_IN_PROGRESS)
        }
    }
}

pub(crate) fn allocate(
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
    shard: &crate::shard::Shard,
    req: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let config = shard.config();
    let place = ShardPlace {
        data_dir: &config.data_dir,
        node_id: config.node_id,
        shard: shard.id.0 as u32,
    };
    handle(place, &req, version, crate::shard::now_ms())
}
