//! What a service hosted on a shard (the group coordinator today; the transaction
//! coordinator and replication fetchers next) may use of it: its identity and config, the
//! committed catalogue, which partitions it owns, their open replicas, and its shutdown.
//! Not the shard itself: a hosted service cannot reach the mesh, the open-partition
//! bookkeeping or another service's state, so each can be read and tested on its own.

use std::rc::Rc;
use std::sync::Arc;

use super::{Shard, TopicPartition};
use crate::config::Config;
use crate::metadata::Catalog;
use crate::partition::Partition;
use crate::router::ShardId;

/// A hosted service's view of its shard.
pub struct ServiceContext<'a> {
    shard: &'a Shard,
}

impl<'a> ServiceContext<'a> {
    pub fn new(shard: &'a Shard) -> ServiceContext<'a> {
        ServiceContext { shard }
    }

    pub fn shard_id(&self) -> ShardId {
        self.shard.id
    }

    pub fn config(&self) -> &Config {
        self.shard.config()
    }

    /// The newest committed catalogue.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.shard.catalog()
    }

    /// Whether this shard owns `topic`/`partition`.
    pub fn owns(&self, topic: &str, partition: i32) -> bool {
        self.shard.router.owner(topic, partition) == self.shard.id
    }

    /// The open replica of `tp` on this shard (opened if needed), or a Kafka error.
    pub async fn partition(&self, tp: &TopicPartition) -> Result<Rc<Partition>, i16> {
        self.shard.partition(tp).await
    }

    pub fn shutting_down(&self) -> bool {
        self.shard.shutting_down.get()
    }

    /// Completes when the shard begins shutting down.
    pub async fn until_shutdown(&self) {
        if !self.shutting_down() {
            self.shard.shutdown.listen().await;
        }
    }
}
