//! The controller: the one interface API handlers call for every metadata write (create,
//! delete and grow topics, alter configs, node registration). On a single node it is the
//! local catalogue path; with `controller.quorum.voters` every write is a command in the
//! Raft log of the controller quorum ([`quorum`]), applied on every node by the same
//! [`apply::apply`].

pub mod apply;
pub mod bridge;
pub mod quorum;

use std::sync::Arc;

pub use apply::{Command, NewTopic, Outcome, TopicError, meta_error};

use crate::metadata::MetaStore;
use crate::shard::NodeShared;

/// How metadata writes are made on this node.
pub struct Controller {
    /// `None`: a single node (no thread, no port).
    quorum: Option<Arc<quorum::Handle>>,
}

impl Controller {
    /// The single-node controller: writes go straight to the local catalogue.
    pub fn local() -> Controller {
        Controller { quorum: None }
    }

    /// A cluster node's controller: writes go through the quorum.
    pub fn quorum(handle: Arc<quorum::Handle>) -> Controller {
        Controller {
            quorum: Some(handle),
        }
    }

    /// The quorum, on a cluster node.
    pub fn cluster(&self) -> Option<&Arc<quorum::Handle>> {
        self.quorum.as_ref()
    }

    /// Makes the change `cmd` and returns what it did. On a single node the catalogue
    /// write (serialise, write, fsync) runs off the shard's thread, so the shard keeps
    /// serving its other clients meanwhile. In a cluster it returns once the command is
    /// committed and applied to this node's image.
    pub async fn submit(&self, node: &Arc<NodeShared>, cmd: Command) -> Outcome {
        match &self.quorum {
            None => {
                let node = node.clone();
                glommio::executor()
                    .spawn_blocking(move || apply_local(&node.meta, &cmd))
                    .await
            }
            Some(q) => bridge::propose(q, cmd).await,
        }
    }
}

/// The single-node write: one atomic catalogue write, nothing placed on other nodes.
pub fn apply_local(meta: &MetaStore, cmd: &Command) -> Outcome {
    match meta.update_batch(|c| apply::apply(c, cmd, false)) {
        Ok(out) => out,
        Err(e) => apply::write_failed(cmd, e),
    }
}
